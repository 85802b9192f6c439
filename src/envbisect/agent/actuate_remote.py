"""Target side of the actuators: realize one state's parts on the machine the chain reaches.

Stdlib only, Python 3.8+ syntax: shipped with ``Transport.run_agent(python,
"envbisect.agent.actuate_remote", {"op": ..., ...})``. Each call does one operation under a
remote session directory ``root`` (``<$HOME or /tmp>/.envbisect/session-<id>``)::

    probe     what the target python has installed (sites, dists with their files), $HOME,
              $PATH and how to run uv there (``uv`` on PATH, next to python, or python -m uv)
    inspect   facts the host needs to decide what is realizable: file sha256s, whether
              commits exist in a repo, ``rev-list`` between two commits, non-empty dirs
    venv      build the overlay venv (``uv venv`` + ``uv pip install --no-deps`` + link farm
              of the base site-packages minus hidden packages), or reuse a ready one
    realize   git worktrees, journaled file swaps, fresh cache dirs for one trial (after
              restoring any swap a dead process left open)
    restore   put back every journaled swap (idempotent; after every trial and on exit)
    cleanup   restore, remove the worktrees; with ``all`` also the venvs and cache copies

The journal has the same shape as the host's: ``journal.jsonl`` lines written (and fsynced)
*before* a file is touched, ``backups/N`` holding the original bytes, ``restored`` lines after.
Worktrees are recorded in ``worktrees.jsonl`` before ``git worktree add`` runs, so a cleanup
after ``kill -9`` finds them. uv and git write their messages to stderr, which the host keeps
in the trial's log.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys

READY = ".envbisect-ready"
FAILED = ".envbisect-failed"


def main(params):
    op = params.get("op")
    handler = _OPS.get(op)
    if handler is None:
        raise ValueError(f"unknown operation {op!r}")
    return handler(params)


# ---- probe -------------------------------------------------------------------------------


def _norm(name):
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def op_probe(params):
    from importlib import metadata

    sites = []
    for p in sys.path:
        if p and os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p):
            rp = os.path.realpath(p)
            if rp not in sites:
                sites.append(rp)
    dists = []
    seen = set()
    for d in metadata.distributions():
        name = (d.metadata["Name"] or "").strip()
        if not name:
            continue
        key = _norm(name)
        if key in seen:
            continue
        seen.add(key)
        files = d.files
        dists.append(
            {
                "name": key,
                "version": d.version,
                "location": os.path.realpath(str(d.locate_file(""))),
                "files": None if files is None else [str(f) for f in files],
            }
        )
    home = os.path.expanduser("~")
    if not home or home == "~" or not os.access(home, os.W_OK):
        home = "/tmp"
    return {
        "sites": sites,
        "base": getattr(sys, "_base_executable", sys.executable),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "version": "{}.{}".format(*sys.version_info[:2]),
        "dists": dists,
        "home": home,
        "path": os.environ.get("PATH", ""),
        "uv": _find_uv(),
    }


def _find_uv():
    found = shutil.which("uv")
    if found:
        return [found]
    beside = os.path.join(os.path.dirname(sys.executable), "uv")
    if os.access(beside, os.X_OK):
        return [beside]
    try:
        import importlib.util

        if importlib.util.find_spec("uv") is not None:
            return [sys.executable, "-m", "uv"]
    except (ImportError, ValueError):
        pass
    return None


# ---- inspect -----------------------------------------------------------------------------


def _sha256(path):
    try:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def _git(repo, *args):
    return subprocess.run(
        ["git", "-C", repo] + list(args),
        capture_output=True,
        text=True,
        check=False,
    )


def _usable_dir(path):
    try:
        return os.path.isdir(path) and bool(os.listdir(path))
    except OSError:
        return False


def op_inspect(params):
    out = {"sha256": {}, "commits": [], "revlists": [], "dirs": [], "exists": []}
    for path in params.get("sha256") or ():
        out["sha256"][path] = _sha256(path)
    for repo, sha in params.get("commits") or ():
        proc = _git(repo, "cat-file", "-e", f"{sha}^{{commit}}")
        out["commits"].append(proc.returncode == 0)
    for repo, old, new in params.get("revlists") or ():
        proc = _git(repo, "rev-list", "--reverse", "--ancestry-path", f"{old}..{new}")
        out["revlists"].append(proc.stdout.split() if proc.returncode == 0 else None)
    for path in params.get("dirs") or ():
        out["dirs"].append(_usable_dir(path))
    for path in params.get("exists") or ():
        out["exists"].append(os.path.exists(path))
    return out


# ---- venv --------------------------------------------------------------------------------


def _tail(text):
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _run_logged(argv):
    """Run ``argv``; its output goes to our stderr (the host's log) and is returned."""
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stderr.write(proc.stdout or "")
    sys.stderr.flush()
    return proc.returncode, proc.stdout or ""


def op_venv(params):
    venv = params["venv"]
    if os.path.exists(os.path.join(venv, READY)):
        return {"venv": venv, "failure": None, "cached": True}
    failed = os.path.join(venv, FAILED)
    if os.path.exists(failed):
        with open(failed) as fh:
            return {"venv": None, "failure": fh.read().strip(), "cached": True}
    if os.path.exists(venv):
        shutil.rmtree(venv)
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    uv = list(params["uv"])
    code, text = _run_logged(uv + ["venv", "--quiet", "--python", params["base"], venv])
    if code != 0:
        return {"venv": None, "failure": "build: uv venv failed: " + _tail(text)}
    install = list(params.get("install") or ())
    py = os.path.join(venv, "bin", "python")
    if install:
        argv = uv + ["pip", "install", "--no-deps", "--compile-bytecode", "--python", py]
        if params.get("index_url"):
            argv += ["--index-url", params["index_url"]]
        for url in params.get("extra_index_urls") or ():
            argv += ["--extra-index-url", url]
        for link in params.get("find_links") or ():
            argv += ["--find-links", link]
        code, text = _run_logged(argv + install)
        if code != 0:
            why = "build: uv pip install {} failed on the target: {}".format(
                " ".join(install),
                _tail(text),
            )
            with open(failed, "w") as fh:
                fh.write(why + "\n")
            return {"venv": None, "failure": why}
    found = sorted(
        os.path.join(venv, "lib", d, "site-packages")
        for d in os.listdir(os.path.join(venv, "lib"))
        if d.startswith("python")
    )
    if not found:
        return {"venv": None, "failure": f"build: {venv}: no site-packages in the new venv"}
    farm = os.path.join(venv, "base-site")
    excluded = params.get("excluded") or {}
    for site_dir in params.get("sites") or ():
        link_tree(site_dir, farm, "", set(excluded.get(site_dir) or ()))
    with open(os.path.join(found[0], "_envbisect_base.pth"), "w") as fh:
        fh.write(f"import site; site.addsitedir({farm!r})\n")
    with open(os.path.join(venv, READY), "w") as fh:
        fh.write(json.dumps(params.get("spec"), sort_keys=True) + "\n")
    return {"venv": venv, "failure": None, "cached": False}


def link_tree(src, dst, rel, excluded):
    """Symlink every entry of ``src`` into ``dst`` except ``excluded`` relative paths.

    A directory that holds excluded files is recreated (not linked) and filled entry by
    entry; its ``__pycache__`` is left out (stale bytecode of a removed module must not make
    the directory an importable namespace package), and it is dropped when nothing is left.
    """
    if not os.path.isdir(src):
        return
    os.makedirs(dst, exist_ok=True)
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        r = entry.name if not rel else rel + "/" + entry.name
        if r in excluded or (rel and entry.name == "__pycache__"):
            continue
        out = os.path.join(dst, entry.name)
        if os.path.lexists(out):
            continue  # an earlier site directory wins, as on sys.path
        if entry.is_dir(follow_symlinks=True) and any(p.startswith(r + "/") for p in excluded):
            link_tree(entry.path, out, r, excluded)
            if os.path.isdir(out) and not os.listdir(out):
                os.rmdir(out)
            continue
        os.symlink(entry.path, out)


# ---- journal -----------------------------------------------------------------------------


def _append(path, obj):
    data = (json.dumps(obj, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _lines(path):
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # torn by a kill mid-write
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _atomic_write(target, data, mode=None):
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    if mode is None and os.path.exists(target):
        mode = os.stat(target).st_mode & 0o7777
    tmp = os.path.join(os.path.dirname(target), "." + os.path.basename(target) + ".envbisect-tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, target)


def _open_swaps(journal):
    entries = _lines(journal)
    restored = {e.get("id") for e in entries if e.get("op") == "restored"}
    return [e for e in entries if e.get("op") == "swap" and e.get("id") not in restored]


def swap(root, target, content):
    """Replace ``target`` by ``content`` (None: remove it), journaling the original first."""
    journal = os.path.join(root, "journal.jsonl")
    backups = os.path.join(root, "backups")
    if not any(e.get("path") == target for e in _open_swaps(journal)):
        entries = _lines(journal)
        swap_id = 1 + max([int(e["id"]) for e in entries if "id" in e] or [0])
        os.makedirs(backups, exist_ok=True)
        backup = os.path.join(backups, str(swap_id))
        entry = {"op": "swap", "id": swap_id, "path": target, "existed": False}
        if os.path.islink(target):
            entry.update(symlink=os.readlink(target), existed=True)
        elif os.path.isfile(target):
            st = os.stat(target)
            shutil.copyfile(target, backup)
            with open(backup, "rb") as fh:
                os.fsync(fh.fileno())
            entry.update(
                backup=str(swap_id),
                mode=st.st_mode & 0o7777,
                mtime_ns=st.st_mtime_ns,
                atime_ns=st.st_atime_ns,
                sha256=_sha256(backup),
                existed=True,
            )
        elif os.path.exists(target):
            raise ValueError(f"{target}: is not a regular file; refusing to swap it")
        _append(journal, entry)
    if content is None:
        if os.path.lexists(target):
            os.unlink(target)
        return
    _atomic_write(target, content)


def restore(root):
    journal = os.path.join(root, "journal.jsonl")
    done = []
    for entry in reversed(_open_swaps(journal)):
        target = entry["path"]
        if entry.get("existed"):
            if "symlink" in entry:
                if os.path.lexists(target):
                    os.unlink(target)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(entry["symlink"], target)
            else:
                backup = os.path.join(root, "backups", str(entry["backup"]))
                if not os.path.isfile(backup):
                    raise ValueError(
                        f"{journal}: backup {backup} of {target} is missing; "
                        "the original cannot be restored"
                    )
                with open(backup, "rb") as fh:
                    _atomic_write(target, fh.read(), mode=entry.get("mode"))
                if entry.get("mtime_ns") is not None:
                    os.utime(target, ns=(int(entry["atime_ns"]), int(entry["mtime_ns"])))
        elif os.path.lexists(target):
            os.unlink(target)
        _append(journal, {"op": "restored", "id": entry["id"], "path": target})
        done.append(target)
    return done


def op_restore(params):
    return {"restored": restore(params["root"])}


# ---- realize -----------------------------------------------------------------------------


def _worktree(root, repo, head, path):
    if os.path.exists(path):
        return None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _append(os.path.join(root, "worktrees.jsonl"), {"repo": repo, "path": path})
    proc = _git(repo, "worktree", "add", "--detach", path, head)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        return (
            f"build: git {repo}: cannot check out {head[:12]} on the target: {_tail(proc.stderr)}"
        )
    return None


def op_realize(params):
    root = params["root"]
    os.makedirs(root, exist_ok=True)
    # A swap left by a process that died (kill -9, then --resume) must not leak into this
    # state: every trial starts from the target's own files.
    restore(root)
    for repo, head, path in params.get("worktrees") or ():
        failure = _worktree(root, repo, head, path)
        if failure:
            return {"failure": failure, "notes": []}
    for item in params.get("swaps") or ():
        target, want = item["path"], item.get("sha256")
        if want is not None and _sha256(target) == want:
            continue
        if want is None:
            if os.path.lexists(target):
                swap(root, target, None)
            continue
        if item.get("content") is None:
            return {"failure": f"build: no content for {target}", "notes": []}
        swap(root, target, base64.b64decode(item["content"]))
    notes = []
    for item in params.get("caches") or ():
        dest, src = item["dest"], item.get("src")
        if os.path.lexists(dest):
            shutil.rmtree(dest)
        if src and _usable_dir(src):
            shutil.copytree(src, dest, symlinks=True)
        else:
            os.makedirs(dest)
            if src:
                notes.append(
                    "caches {}: {} is gone on the target; running cold".format(item["name"], src)
                )
    return {"failure": None, "notes": notes}


# ---- cleanup -----------------------------------------------------------------------------


def op_cleanup(params):
    root = params["root"]
    restored = restore(root) if os.path.isdir(root) else []
    removed = []
    repos = []
    for entry in _lines(os.path.join(root, "worktrees.jsonl")):
        repo, path = entry["repo"], entry["path"]
        if repo not in repos:
            repos.append(repo)
        if os.path.exists(path):
            _git(repo, "worktree", "remove", "--force", path)
            if os.path.exists(path):
                shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    for repo in repos:
        _git(repo, "worktree", "prune")
    if os.path.isdir(root):
        # Worktrees are gone; forget them so the next cleanup has nothing to redo.
        with open(os.path.join(root, "worktrees.jsonl"), "w"):
            pass
    dirs = []
    if params.get("all"):
        for name in ("venvs", "worktrees", "caches", "trials"):
            path = os.path.join(root, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
                dirs.append(path)
    return {"restored": restored, "worktrees": removed, "removed": dirs}


_OPS = {
    "probe": op_probe,
    "inspect": op_inspect,
    "venv": op_venv,
    "realize": op_realize,
    "restore": op_restore,
    "cleanup": op_cleanup,
}
