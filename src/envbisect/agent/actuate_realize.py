"""The ``realize``, ``restore`` and ``drop`` operations of ``envbisect.agent.actuate_remote``
(stdlib only, Python 3.8+ syntax; shipped with it): journaled swaps, worktrees, linked
untracked files and cache copies."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import stat
import sys

from envbisect.agent import journal
from envbisect.agent.actuate_common import output_tail, run_git, usable_dir
from envbisect.agent.cache_keep import materialize, read_tree
from envbisect.agent.durable import sha256_of

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = (
    "envbisect.agent.actuate_common",
    "envbisect.agent.cache_keep",
    "envbisect.agent.durable",
    "envbisect.agent.journal",
)

# ---- journal (the rules live in envbisect.agent.journal, shipped with this module) -------


def _journal(root):
    return os.path.join(root, "journal.jsonl"), os.path.join(root, "backups")


def _owner(root, pid=None):
    return {"session": root, "journal": _journal(root)[0], "pid": pid}


def swap(root, target, content, pid=None):
    """Replace ``target`` by ``content`` (None: remove it), journaling the original first;
    the file is claimed machine-wide for this session until ``cleanup``."""
    try:
        journal.claim(target, _owner(root, pid), hold=False)
        journal.swap(_journal(root)[0], _journal(root)[1], target, content)
    except journal.JournalError as exc:
        raise ValueError(str(exc)) from None


def restore(root):
    """Put back the open swaps that still hold what envbisect wrote; returns the restored
    paths and one line per file kept as the user changed it."""
    done, kept = [], []
    try:
        outcomes = journal.restore(*_journal(root))
    except journal.JournalError as exc:
        raise ValueError(str(exc)) from None
    for item in outcomes:
        # The words of the host's session.KeptEdit.describe, which this stdlib agent cannot
        # import.
        if item["outcome"] != "kept":
            done.append(item["path"])
        elif item["original"]:
            kept.append(
                "kept {}: it changed after envbisect swapped it, so your version stays; "
                "the original is in {}".format(item["path"], item["original"])
            )
        else:
            kept.append(
                "kept {}: it changed after envbisect created it, so your version stays "
                "(it did not exist before)".format(item["path"])
            )
    return done, kept


def op_restore(params):
    done, kept = restore(params["root"])
    return {"restored": done, "kept": kept}


def drop_dirs(paths):
    """Remove a trial's cache dirs (copies and fresh ones) once the trial is over."""
    for path in paths:
        if os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)
    return {"dropped": list(paths)}


def op_drop(params):
    return drop_dirs(params.get("paths") or ())


def release_all(root):
    paths = sorted(
        {
            os.path.realpath(str(e.get("path")))
            for e in journal.read_lines(_journal(root)[0])
            if e.get("op") == "swap"
        }
    )
    journal.release(root, paths)


# ---- realize -----------------------------------------------------------------------------


def _record_worktree(root, repo, path):
    journal.append_line(os.path.join(root, "worktrees.jsonl"), {"repo": repo, "path": path})


def _worktree(repo, head, path, where, record, log):
    if os.path.exists(path):
        return None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record(repo, path)  # before git runs, so a cleanup after kill -9 finds it
    proc = run_git(repo, "worktree", "add", "--detach", path, head, timeout=600)
    if log is not None:
        log(proc.stderr)
    if proc.returncode != 0:
        return f"build: git {repo}: cannot check out {head[:12]}{where}: {output_tail(proc.stderr)}"
    return None


# Untracked entries never linked into a worktree: bytecode of the live sources (a trial
# would write its own through the link), and envbisect's own session directory.
_NOT_LINKED = ("__pycache__", ".envbisect")


def _link_untracked(repo, path, keep):
    """Link into the fresh worktree ``path`` every untracked (or ignored) entry of the live
    ``repo``: datasets, local configs, checkpoints a command reads are not in any commit, so
    a state of the repo has them as the user's tree has them (no state changes them: a
    tracked file is the commit's, a recorded file is swapped in). Symlinks cost nothing and
    copy nothing; a directory holding a path in ``keep`` (a file the state writes) is made
    real down to it so that the write never goes through a link into the live repo."""
    proc = run_git(repo, "ls-files", "-z", "--others", "--directory")
    if proc.returncode != 0:
        return
    for rel in proc.stdout.split("\0"):
        rel = rel.rstrip("/")
        if not rel or any(part in _NOT_LINKED for part in rel.split("/")):
            continue
        _link_entry(os.path.join(repo, rel), os.path.join(path, rel), keep)


def _link_entry(live, dest, keep):
    if dest in keep or os.path.lexists(dest):
        return
    prefix = dest + os.sep
    if os.path.isdir(live) and not os.path.islink(live) and any(k.startswith(prefix) for k in keep):
        os.makedirs(dest, exist_ok=True)
        for name in sorted(os.listdir(live)):
            _link_entry(os.path.join(live, name), os.path.join(dest, name), keep)
        return
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.symlink(live, dest)


def _relink(links):
    """Point each dataset's place in a worktree (``root``) at the state's version of it (a
    worktree is reused by states that differ in their data, so every trial says where it
    points); a directory linked whole into the live repo is made real down to it first; a
    file the commit itself holds there is the commit's, and left alone."""
    for dest, src, root in links:
        _unlink_parents(dest, root)
        if os.path.lexists(dest) and not os.path.islink(dest):
            continue
        if os.path.islink(dest):
            if os.readlink(dest) == src:
                continue
            os.unlink(dest)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.symlink(src, dest)


def _unlink_parents(dest, root):
    """The directories between ``root`` and ``dest`` made real where one is a link into the
    live repo (``_link_untracked`` links an untracked directory whole), their other entries
    linked as before."""
    rel = os.path.relpath(os.path.dirname(dest), root)
    if rel.startswith(".."):
        return
    here = root
    for part in [] if rel == "." else rel.split(os.sep):
        here = os.path.join(here, part)
        if os.path.islink(here):
            live = os.readlink(here)
            os.unlink(here)
            _link_entry(live, here, {dest})
            return


def _content(item):
    """The bytes to put for a swap: sent along (base64), or a blob file on this machine."""
    if item.get("content") is not None:
        return base64.b64decode(item["content"])
    if item.get("blob"):
        try:
            with open(item["blob"], "rb") as fh:
                return fh.read()
        except OSError:
            return None
    return None


def _swaps(items, put):
    """Put each file in the wanted state through ``put(path, bytes or None)``."""
    for item in items:
        target, want = item["path"], item.get("sha256")
        if want is not None and sha256_of(target) == want:
            continue
        if want is None:
            if os.path.lexists(target):
                put(target, None)
            continue
        content = _content(item)
        if content is None:
            return "build: no content for {}".format(item.get("key") or target)
        put(target, content)
    return None


class CacheRefused(Exception):
    """A cache that must not be copied (a device file in it; more than the disk holds)."""


def _check_copyable(name, src, dest_parent, reserve=64 << 20):
    """Refuse a copy of ``src`` that holds anything but files, dirs and symlinks (a device
    file would be read forever) or that does not fit in the free space at ``dest_parent``
    with ``reserve`` bytes to spare."""
    total = 0
    for dirpath, dirs, files in os.walk(src):
        for entry in dirs + files:
            path = os.path.join(dirpath, entry)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
            elif not (stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                raise CacheRefused(f"caches {name}: {path} is not a regular file; not copied")
    os.makedirs(dest_parent, exist_ok=True)
    free = shutil.disk_usage(dest_parent).free
    if total + reserve > free:
        raise CacheRefused(
            f"caches {name}: copying {src} needs {total} bytes and {dest_parent} has "
            f"{free} free; not copied"
        )


def _kept_cache(item, where):
    """A cache made from the content a snapshot kept: the tree and its files' blobs, sent
    along (base64: a remote target) or read beside the tree blob (this machine); every blob
    is checked against its sha256. Missing content leaves the dir as far as it got, said."""
    name, contents = item["name"], item.get("contents") or {}
    try:
        if item.get("tree_body"):
            body = base64.b64decode(item["tree_body"])
        else:
            with open(item["tree"], "rb") as fh:
                body = fh.read()
        tree = read_tree(body)
    except (OSError, ValueError) as exc:
        raise CacheRefused(f"caches {name}: the kept content cannot be read: {exc}") from None
    here = os.path.dirname(item.get("tree") or "")

    def fetch(sha):
        if sha in contents:
            data = base64.b64decode(contents[sha])
        else:
            try:
                with open(os.path.join(here, sha), "rb") as fh:
                    data = fh.read()
            except OSError:
                return None
        return data if hashlib.sha256(data).hexdigest() == sha else None

    try:
        missing = materialize(tree, item["dest"], fetch)
    except OSError as exc:
        shutil.rmtree(item["dest"], ignore_errors=True)  # no half copy fills the disk
        raise CacheRefused(f"caches {name}: making the kept content failed: {exc}") from None
    if missing:
        return [
            f"caches {name}: {missing} of {len(tree)} kept files are missing{where}; "
            "the cache is partly warm"
        ]
    return [f"caches {name}: made from the content the snapshot kept ({len(tree)} files)"]


def _caches(items, where):
    notes = []
    for item in items:
        dest, src = item["dest"], item.get("src")
        if item.get("fill"):
            # Warm made by running the state once into an empty dir (the host does that run);
            # later runs of the same trial keep what it, and they, compiled.
            if not os.path.isdir(dest):
                os.makedirs(dest)
            continue
        if os.path.lexists(dest):
            shutil.rmtree(dest)
        if item.get("tree") or item.get("tree_body"):
            notes.extend(_kept_cache(item, where))
        elif src and usable_dir(src):
            _check_copyable(item["name"], src, os.path.dirname(dest))
            try:
                shutil.copytree(src, dest, symlinks=True)
            except (OSError, shutil.Error) as exc:
                shutil.rmtree(dest, ignore_errors=True)  # no half copy fills the disk
                raise CacheRefused(f"caches {item['name']}: copying {src} failed: {exc}") from None
        else:
            os.makedirs(dest)
            if src:
                notes.append(
                    "caches {}: {} is gone{}; running cold".format(item["name"], src, where)
                )
    return notes


def apply(params, put, record, log=None):
    """Make one state's worktrees, file swaps and cache dirs real.

    The one executor of a plan, for the agent process (:func:`op_realize`) and for local
    targets, which call it in-process with the host's journal as ``put`` and the session
    log as ``record`` (see ``bisect.actuate``); ``log`` gets git's messages."""
    where = params.get("where", " on the target")
    created = []
    for repo, head, path in params.get("worktrees") or ():
        if not os.path.exists(path):
            created.append((repo, path))
        failure = _worktree(repo, head, path, where, record, log)
        if failure:
            return {"failure": failure, "notes": []}
    swapped = set(item["path"] for item in params.get("swaps") or ())
    for repo, path in created:
        _link_untracked(repo, path, swapped)
    failure = _swaps(params.get("swaps") or (), put)
    if failure:
        return {"failure": failure, "notes": []}
    _relink(params.get("links") or ())
    try:
        return {"failure": None, "notes": _caches(params.get("caches") or (), where)}
    except CacheRefused as exc:
        return {"failure": f"build: {exc}", "notes": []}


def _echo(text):
    sys.stderr.write(text)


def op_realize(params):
    root = params["root"]
    os.makedirs(root, exist_ok=True)
    # A swap left by a process that died (kill -9, then --resume) must not leak into this
    # state: every trial starts from the target's own files.
    _restored, notes = restore(root)
    out = apply(
        params,
        lambda target, content: swap(root, target, content, params.get("pid")),
        lambda repo, path: _record_worktree(root, repo, path),
        _echo,
    )
    out["notes"] = notes + out["notes"]
    return out
