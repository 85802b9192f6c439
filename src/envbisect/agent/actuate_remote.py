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

import os
import shutil
import subprocess
import sys

from envbisect.agent import journal
from envbisect.agent.actuate_common import (
    UNSAFE_WORDS,
    output_tail,
    run_git,
    usable_dir,
)

# apply and drop_dirs are also called in-process by the host (realize.execute, realize.actuate).
from envbisect.agent.actuate_realize import apply as apply
from envbisect.agent.actuate_realize import drop_dirs as drop_dirs
from envbisect.agent.actuate_realize import op_drop, op_realize, op_restore, release_all, restore
from envbisect.agent.actuate_venv import op_venv
from envbisect.agent.durable import sha256_of

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = (
    "envbisect.agent.actuate_common",
    "envbisect.agent.actuate_realize",
    "envbisect.agent.actuate_venv",
    "envbisect.agent.cache_keep",
    "envbisect.agent.durable",
    "envbisect.agent.journal",
)


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


def op_inspect(params):
    out = {"sha256": {}, "commits": [], "revlists": [], "dirs": [], "exists": []}
    for path in params.get("sha256") or ():
        out["sha256"][path] = sha256_of(path)
    out["unsafe"] = {}
    for repo, sha in params.get("commits") or ():
        proc = run_git(repo, "cat-file", "-e", f"{sha}^{{commit}}")
        out["commits"].append(proc.returncode == 0)
        if proc.returncode != 0 and any(w in proc.stderr for w in UNSAFE_WORDS):
            out["unsafe"][repo] = proc.stderr.strip().splitlines()[0] if proc.stderr else ""
    for repo, old, new in params.get("revlists") or ():
        proc = run_git(repo, "rev-list", "--reverse", "--ancestry-path", f"{old}..{new}")
        out["revlists"].append(proc.stdout.split() if proc.returncode == 0 else None)
    for path in params.get("dirs") or ():
        out["dirs"].append(usable_dir(path))
    for path in params.get("exists") or ():
        out["exists"].append(os.path.exists(path))
    return out


# ---- cleanup -----------------------------------------------------------------------------


def op_cleanup(params):
    root = params["root"]
    restored, kept = restore(root) if os.path.isdir(root) else ([], [])
    if os.path.isdir(root):
        release_all(root)
    removed = []
    repos = []
    for entry in journal.read_lines(os.path.join(root, "worktrees.jsonl")):
        repo, path = entry["repo"], entry["path"]
        if repo not in repos:
            repos.append(repo)
        if os.path.exists(path):
            run_git(repo, "worktree", "remove", "--force", path, timeout=600)
            if os.path.exists(path):
                shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    for repo in repos:
        run_git(repo, "worktree", "prune")
    if os.path.isdir(root):
        # Worktrees are gone; forget them so the next cleanup has nothing to redo.
        with open(os.path.join(root, "worktrees.jsonl"), "w"):
            pass
    dirs = _remove_session(root, whole=not kept) if params.get("all") else []
    return {"restored": restored, "kept": kept, "worktrees": removed, "removed": dirs}


def _remove_session(root, whole):
    """The session's dirs under ``root``; with ``whole`` (everything restored) ``root`` too,
    its journal and locks, and ``.envbisect`` above it when nothing else is left there."""
    dirs = []
    for name in ("venvs", "bytecode", "worktrees", "caches", "trials"):
        path = os.path.join(root, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            dirs.append(path)
    if whole and os.path.isdir(root):
        shutil.rmtree(root, ignore_errors=True)
        dirs.append(root)
        try:
            os.rmdir(os.path.dirname(root))
            dirs.append(os.path.dirname(root))
        except OSError:
            pass
    return dirs


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
            missing.append([requirement, output_tail(proc.stderr)])
    return {"missing": missing}


def op_torch_requires(params):
    """The version and ``Requires-Dist`` of the torch a state runs, read from its overlay
    venv (``venv``: its site-packages, then its link farm), else from ``location`` (the
    target's own site-packages); ``{"version": None}`` when none is found."""
    import email.parser
    import glob

    dirs = []
    if params.get("venv"):
        dirs += sorted(glob.glob(os.path.join(params["venv"], "lib", "python*", "site-packages")))
        dirs.append(os.path.join(params["venv"], "base-site"))
    elif params.get("location"):
        dirs.append(params["location"])
    for d in dirs:
        for meta in sorted(glob.glob(os.path.join(d, "torch-*.dist-info", "METADATA"))):
            try:
                with open(meta, encoding="utf-8", errors="replace") as fh:
                    msg = email.parser.Parser().parse(fh, headersonly=True)
            except OSError:
                continue
            if (msg.get("Name") or "").lower() == "torch":
                return {
                    "version": msg.get("Version"),
                    "requires": msg.get_all("Requires-Dist") or [],
                }
    return {"version": None}


def op_compile(params):
    """``uv pip compile`` of one ``requirement`` with its dependencies, by uv on this machine
    for ``python_version`` with the sources' options ``args``: its output, or uv's last
    line as ``error``."""
    argv = list(params["uv"]) + ["pip", "compile", "-q", "--no-header", "--no-annotate", "-"]
    argv += ["--python-version", params["python_version"]] + list(params.get("args") or ())
    try:
        proc = subprocess.run(
            argv,
            input=params["requirement"] + "\n",
            capture_output=True,
            text=True,
            timeout=params.get("timeout_s", 300),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    if proc.returncode != 0:
        return {"error": output_tail(proc.stderr)}
    return {"stdout": proc.stdout}


_OPS = {
    "compile": op_compile,
    "torch_requires": op_torch_requires,
    "available": op_available,
    "probe": op_probe,
    "inspect": op_inspect,
    "venv": op_venv,
    "realize": op_realize,
    "restore": op_restore,
    "drop": op_drop,
    "cleanup": op_cleanup,
}
