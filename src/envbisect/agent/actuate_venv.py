"""The ``venv`` operation of ``envbisect.agent.actuate_remote`` (stdlib only, Python 3.8+
syntax; shipped with it): the overlay venv, and the bytecode farm that spares every trial
from compiling what it imports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from envbisect.agent.actuate_common import FAILED, READY, output_tail, run_logged

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = ("envbisect.agent.actuate_common",)

# ---- venv --------------------------------------------------------------------------------


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
    run = run or run_logged
    uv = list(params["uv"])
    code, text, _log = run(uv + ["venv", "--quiet", "--python", params["base"], venv], "build-venv")
    if code != 0:
        return {"venv": None, "failure": "build: uv venv failed: " + output_tail(text)}
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
        " ".join(install), params.get("where", " on the target"), output_tail(text)
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
    add_bytecode(venv, farm, run or run_logged)
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
