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
              restoring any swap a dead process left open); the work itself is
              :func:`apply`
    restore   put back every journaled swap (idempotent; after every trial and on exit)
    drop      remove a finished trial's cache dirs
    cleanup   restore, remove the worktrees; with ``all`` also the venvs and cache copies
    available which package versions the target's uv cannot resolve (run's pre-check)

Local targets run the same code in the host process (``bisect.execute.LocalExecutor``):
``inspect``, ``op_venv`` with a ``run`` hook that logs uv through the host's transport, and
:func:`apply` with the host's journal and session log as hooks.

The journal has the same shape as the host's: ``journal.jsonl`` lines written (and fsynced)
*before* a file is touched, ``backups/N`` holding the original bytes, ``restored`` lines after.
Worktrees are recorded in ``worktrees.jsonl`` before ``git worktree add`` runs, so a cleanup
after ``kill -9`` finds them. uv and git write their messages to stderr, which the host keeps
in the trial's log.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys

from envbisect.agent import journal

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = ("envbisect.agent.journal",)

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
    # PEP 503 by hand: packaging (canonicalize_name, the host's) is not in a bare target python.
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
        "no_bytecode": [d["name"] for d in dists if _installed_without_bytecode(d)],
    }


def _installed_without_bytecode(dist):
    """Whether the first module a distribution's RECORD lists has no bytecode beside it
    (uv installs without it unless asked)."""
    tag = sys.implementation.cache_tag
    for rel in dist["files"] or ():
        if rel.endswith(".py") and not rel.startswith("..") and "__pycache__" not in rel:
            folder, stem = os.path.split(os.path.join(dist["location"], rel))
            pyc = os.path.join(folder, "__pycache__", f"{stem[:-3]}.{tag}.pyc")
            return bool(tag) and not os.path.exists(pyc)
    return False


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


_sha256 = journal.sha256_of


# A repo's own hooks and fsmonitor never run from envbisect's git calls (a worktree add runs
# post-checkout; any status may start an fsmonitor command).
NO_SIDE_EFFECTS = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.untrackedCache=false",
    "-c",
    "protocol.allow=never",
)
UNSAFE_WORDS = ("dubious ownership", "safe.directory")
GIT_TIMEOUT_S = 60  # a query (cat-file, rev-list, prune); a worktree add gets longer


def _git(repo, *args, timeout=GIT_TIMEOUT_S):
    # A stdlib twin of envbisect.model.gitcli.run: envbisect is not installed on a target.
    argv = ["git", "-C", repo] + list(NO_SIDE_EFFECTS) + list(args)
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        why = f"git {args[0]} timed out after {timeout}s\n"
        return subprocess.CompletedProcess(argv, 124, "", why)
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"cannot run git: {exc.strerror}\n")


def _usable_dir(path):
    try:
        return os.path.isdir(path) and bool(os.listdir(path))
    except OSError:
        return False


def op_inspect(params):
    out = {"sha256": {}, "commits": [], "revlists": [], "dirs": [], "exists": []}
    for path in params.get("sha256") or ():
        out["sha256"][path] = _sha256(path)
    out["unsafe"] = {}
    for repo, sha in params.get("commits") or ():
        proc = _git(repo, "cat-file", "-e", f"{sha}^{{commit}}")
        out["commits"].append(proc.returncode == 0)
        if proc.returncode != 0 and any(w in proc.stderr for w in UNSAFE_WORDS):
            out["unsafe"][repo] = proc.stderr.strip().splitlines()[0] if proc.stderr else ""
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


def _run_logged(argv, name=None):
    """Run ``argv``; its output goes to our stderr (the host's log) and is returned.

    The signature of every ``run`` hook of :func:`op_venv`: ``(code, output, log)``, where
    ``log`` names a file holding the output (None: the host's log of this call)."""
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stderr.write(proc.stdout or "")
    sys.stderr.flush()
    return proc.returncode, proc.stdout or "", None


def op_venv(params, run=None):
    """Build the overlay venv ``params["venv"]`` (or reuse it); ``run`` runs uv (default:
    output to our stderr). ``where``: how failures name the machine (" on the target")."""
    venv = params["venv"]
    known = _venv_known(venv)
    if known is not None:
        return known
    if os.path.exists(venv):
        shutil.rmtree(venv)
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    run = run or _run_logged
    uv = list(params["uv"])
    code, text, _log = run(uv + ["venv", "--quiet", "--python", params["base"], venv], "build-venv")
    if code != 0:
        return {"venv": None, "failure": "build: uv venv failed: " + _tail(text)}
    failure = _install(params, uv, run)
    if failure is None:
        failure = _link_base(params, run)
    if failure is not None:
        return {"venv": None, "failure": failure}
    with open(os.path.join(venv, READY), "w") as fh:
        fh.write(json.dumps(params.get("spec"), sort_keys=True) + "\n")
    return {"venv": venv, "failure": None, "cached": False}


def _venv_known(venv):
    """The answer for a venv built (or failed) before, else None."""
    if os.path.exists(os.path.join(venv, READY)):
        return {"venv": venv, "failure": None, "cached": True}
    failed = os.path.join(venv, FAILED)
    if os.path.exists(failed):
        with open(failed) as fh:
            return {"venv": None, "failure": fh.read().strip(), "cached": True}
    return None


def _install(params, uv, run):
    """``uv pip install --no-deps`` of the wanted packages; the failure (also kept in the
    venv's FAILED file, so a revisit does not retry) or None."""
    groups = params.get("installs")
    if groups is None:  # one call with the shared sources (the host named none)
        groups = [[[], list(params.get("install") or ())]]
    venv = params["venv"]
    for source_args, install in groups:
        if not install:
            continue
        # The host's envbisect.model.sources.uv_args: indexes, find-links, strategy, offline.
        argv = uv + ["pip", "install", "--no-deps", "--compile-bytecode"]
        argv += ["--python", os.path.join(venv, "bin", "python")] + list(source_args)
        code, text, log = run(argv + list(install), "build-install")
        if code != 0:
            return _install_failed(venv, install, params, text, log)
    return None


def _install_failed(venv, install, params, text, log):
    why = "build: uv pip install {} failed{}: {}".format(
        " ".join(install), params.get("where", " on the target"), _tail(text)
    )
    if log:
        why += f" (full log: {log})"
    with open(os.path.join(venv, FAILED), "w") as fh:
        fh.write(why + "\n")
    return why


def _link_base(params, run=None):
    """The link farm of the target's site-packages and the .pth that adds it; packages
    installed without bytecode get it (see :func:`add_bytecode`)."""
    venv = params["venv"]
    found = sorted(
        os.path.join(venv, "lib", d, "site-packages")
        for d in os.listdir(os.path.join(venv, "lib"))
        if d.startswith("python")
    )
    if not found:
        return f"build: {venv}: no site-packages in the new venv"
    farm = os.path.join(venv, "base-site")
    excluded = params.get("excluded") or {}
    for site_dir in params.get("sites") or ():
        link_tree(site_dir, farm, "", set(excluded.get(site_dir) or ()))
    with open(os.path.join(found[0], "_envbisect_base.pth"), "w") as fh:
        fh.write(f"import site; site.addsitedir({farm!r})\n")
    add_bytecode(venv, farm, run or _run_logged)
    return None


# ---- bytecode ------------------------------------------------------------------------------
#
# A target environment installed without bytecode (uv does not compile by default) and a
# machine that sets PYTHONDONTWRITEBYTECODE=1 (trials set it too: the farm links into the
# target) make every trial compile every module it imports: `import torch` took 47-52 s
# instead of 1-2 s. Bytecode cannot go into the target's own __pycache__ (it is never
# written), so such a package is *mirrored* in the farm: real directories, files linked one
# by one, and each directory's __pycache__ a link into ``<session>/bytecode/`` keyed by the
# real directory — compiled once, read by every venv of the session (a .pyc is checked
# against its source's mtime and size, and importlib fixes co_filename on load, so the same
# file serves every path that leads to the source).


def _cache_tag(python):
    proc = subprocess.run(
        [python, "-c", "import sys; print(sys.implementation.cache_tag or '')"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _first_source(path):
    """The first ``.py`` file under ``path`` (its top level first), or None."""
    for dirpath, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                return os.path.join(dirpath, name)
    return None


def _lacks_bytecode(path, tag):
    """A package directory whose modules have no bytecode for ``tag`` beside them."""
    source = _first_source(path)
    if source is None:
        return False
    stem = os.path.basename(source)[:-3]
    pyc = os.path.join(os.path.dirname(source), "__pycache__", f"{stem}.{tag}.pyc")
    return not os.path.exists(pyc)


def _top_modules_lack_bytecode(farm, tag):
    """Whether a top-level module of the farm (a linked ``.py``) has no bytecode beside its
    source."""
    for entry in os.scandir(farm):
        if entry.name.endswith(".py") and entry.is_symlink():
            real = os.readlink(entry.path)
            pyc = os.path.join(os.path.dirname(real), "__pycache__", f"{entry.name[:-3]}.{tag}.pyc")
            if not os.path.exists(pyc):
                return True
    return False


def _dirs_with_sources(root):
    """Real paths of the directories under ``root`` that hold a ``.py`` file at any depth."""
    out = set()
    for dirpath, dirs, names in os.walk(root, topdown=False):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if any(n.endswith(".py") for n in names) or any(
            os.path.join(dirpath, d) in out for d in dirs
        ):
            out.add(dirpath)
    return out


def mirror_tree(src, dst, store, keep):
    """``dst``: real directories where ``src`` has sources below, every file a link, each
    source directory's ``__pycache__`` a link to ``store`` + the source directory's path."""
    os.makedirs(dst, exist_ok=True)
    has_py = False
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if entry.name == "__pycache__":
            continue
        out = os.path.join(dst, entry.name)
        if os.path.lexists(out):
            continue
        if entry.is_dir(follow_symlinks=False) and entry.path in keep:
            mirror_tree(entry.path, out, store, keep)
            continue
        os.symlink(entry.path, out)
        has_py = has_py or entry.name.endswith(".py")
    if has_py:
        cache = store + os.path.realpath(src)
        os.makedirs(os.path.join(cache, "__pycache__"), exist_ok=True)
        os.symlink(os.path.join(cache, "__pycache__"), os.path.join(dst, "__pycache__"))


def add_bytecode(venv, farm, run):
    """Mirror the farm's packages that lack bytecode and compile them once into the
    session's bytecode store (shared by its venvs); returns the mirrored names."""
    python = os.path.join(venv, "bin", "python")
    tag = _cache_tag(python)
    if not tag or not os.path.isdir(farm):
        return []
    store = os.path.join(os.path.dirname(os.path.dirname(venv)), "bytecode")
    mirrored = []
    for entry in sorted(os.scandir(farm), key=lambda e: e.name):
        if not entry.is_symlink() or not entry.is_dir():
            continue  # a recreated directory (hidden files inside) stays as link_tree made it
        real = os.readlink(entry.path)
        if not _lacks_bytecode(real, tag):
            continue
        os.unlink(entry.path)
        mirror_tree(real, entry.path, store, _dirs_with_sources(real))
        mirrored.append(entry.name)
    if _top_modules_lack_bytecode(farm, tag):
        # The farm's own __pycache__ (a link to the first site's) serves its top-level
        # modules (typing_extensions.py): point it at the store instead.
        cache = os.path.join(store + os.path.realpath(farm), "__pycache__")
        os.makedirs(cache, exist_ok=True)
        top = os.path.join(farm, "__pycache__")
        if os.path.islink(top):
            os.unlink(top)
        if not os.path.lexists(top):
            os.symlink(cache, top)
            run([python, "-m", "compileall", "-q", "-l", farm], "build-bytecode")
    if mirrored:
        # compileall writes whatever PYTHONDONTWRITEBYTECODE says (that governs imports);
        # -j 0: every core; errors (a template that is not Python) leave that file
        # uncompiled, which is what the target does too.
        run(
            [python, "-m", "compileall", "-q", "-j", "0"]
            + [os.path.join(farm, name) for name in mirrored],
            "build-bytecode",
        )
    return mirrored


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


def _release_all(root):
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
    proc = _git(repo, "worktree", "add", "--detach", path, head, timeout=600)
    if log is not None:
        log(proc.stderr)
    if proc.returncode != 0:
        return f"build: git {repo}: cannot check out {head[:12]}{where}: {_tail(proc.stderr)}"
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
    proc = _git(repo, "ls-files", "-z", "--others", "--directory")
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
        if want is not None and _sha256(target) == want:
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
        if src and _usable_dir(src):
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


# ---- cleanup -----------------------------------------------------------------------------


def op_cleanup(params):
    root = params["root"]
    restored, kept = restore(root) if os.path.isdir(root) else ([], [])
    if os.path.isdir(root):
        _release_all(root)
    removed = []
    repos = []
    for entry in journal.read_lines(os.path.join(root, "worktrees.jsonl")):
        repo, path = entry["repo"], entry["path"]
        if repo not in repos:
            repos.append(repo)
        if os.path.exists(path):
            _git(repo, "worktree", "remove", "--force", path, timeout=600)
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
        for name in ("venvs", "bytecode", "worktrees", "caches", "trials"):
            path = os.path.join(root, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
                dirs.append(path)
    return {"restored": restored, "kept": kept, "worktrees": removed, "removed": dirs}


def op_available(params):
    """Which of ``needs`` (``[requirement, uv options]`` pairs) uv on this machine cannot
    resolve for ``python`` (``uv pip compile --no-deps``, the target's own view of the
    package sources: its paths, its network, its uv cache); each with uv's last line."""
    missing = []
    for requirement, source_args in params.get("needs") or ():
        argv = list(params["uv"]) + ["pip", "compile", "-q", "--no-header", "--no-deps", "-"]
        argv += ["--python", params["python"]] + list(source_args)
        try:
            proc = subprocess.run(
                argv,
                input=requirement + "\n",
                capture_output=True,
                text=True,
                timeout=params.get("timeout_s", 120),
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            missing.append([requirement, str(exc)])
            continue
        if proc.returncode != 0:
            missing.append([requirement, _tail(proc.stderr)])
    return {"missing": missing}


_OPS = {
    "available": op_available,
    "probe": op_probe,
    "inspect": op_inspect,
    "venv": op_venv,
    "realize": op_realize,
    "restore": op_restore,
    "drop": op_drop,
    "cleanup": op_cleanup,
}
