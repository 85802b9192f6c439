"""Which interpreter runs a bisection's states: the one the user named, resolved once, or the
one the manifests recorded — never whatever ``python`` comes first on PATH.

A relative ``--python venv/bin/python`` is resolved against the directory envbisect was run
from, once, before any state moves the command's cwd into a worktree (where it would name
nothing, or another interpreter). A bare name (``python3``) is looked up on PATH once. Without
``--python`` a local run uses the interpreter the bad manifest (else the good one) recorded
(``python.executable``, the snapshot's ``sys.executable``): that is where the recorded
packages are. When that interpreter is not on this machine, the run says so and asks for
``--python``; a manifest that records none (written by hand) leaves the default, ``python3``
looked up on PATH once.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from envbisect.model import manifest as mf
from envbisect.model.errors import UsageError


def resolve_given(python: str, *, local: bool, cwd: Path | None = None) -> str:
    """``python`` as an absolute path on a local target (unchanged through layers)."""
    if not local or os.path.isabs(python):
        return python
    if os.sep in python:
        return str((cwd or Path.cwd()) / python)
    found = shutil.which(python)
    return found if found else python


def recorded(good: Path, bad: Path | None) -> str | None:
    """The interpreter the manifests recorded (the bad one's when given, it is the machine
    as it is now), checked to exist here; UsageError saying why not; None when the
    manifest records no interpreter path at all (written by hand, not by ``snapshot``)."""
    side, path = ("bad", bad) if bad is not None else ("good", good)
    return recorded_in(path, f"the {side} manifest")


def recorded_path(path: Path) -> str | None:
    """The absolute interpreter path manifest ``path`` recorded (``python.executable``, else
    ``meta.target.python``), unchecked; None when it records none (written by hand)."""
    m = mf.load(path)
    exe = m.section("python").get("executable")
    if not isinstance(exe, str) or not exe:
        target = m.section("meta").get("target")
        exe = target.get("python") if isinstance(target, dict) else None
    return exe if isinstance(exe, str) and os.path.isabs(exe) else None


def recorded_in(path: Path, what: str) -> str | None:
    """The interpreter manifest ``path`` recorded, checked to exist here (``what`` names the
    manifest in the UsageError); None when it records no interpreter path."""
    exe = recorded_path(path)
    if exe is None:
        return None  # a hand-written manifest: the caller's default applies
    if not os.access(exe, os.X_OK):
        raise UsageError(
            f"no --python given and the interpreter {what} recorded ({exe}) "
            "is not here: give --python PATH"
        )
    return exe
