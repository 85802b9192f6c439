"""What the operations of ``envbisect.agent.actuate_remote`` share (stdlib only, Python 3.8+
syntax; shipped with it): git without side effects, and logged subprocess runs."""

from __future__ import annotations

import os
import subprocess
import sys

READY = ".envbisect-ready"
FAILED = ".envbisect-failed"

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


def run_git(repo, *args, timeout=GIT_TIMEOUT_S):
    # A stdlib twin of envbisect.model.gitcli.run: envbisect is not installed on a target.
    argv = ["git", "-C", repo] + list(NO_SIDE_EFFECTS) + list(args)
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        why = f"git {args[0]} timed out after {timeout}s\n"
        return subprocess.CompletedProcess(argv, 124, "", why)
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"cannot run git: {exc.strerror}\n")


def usable_dir(path):
    try:
        return os.path.isdir(path) and bool(os.listdir(path))
    except OSError:
        return False


def output_tail(text):
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def run_logged(argv, name=None):
    """Run ``argv``; its output goes to our stderr (the host's log) and is returned.

    The signature of every ``run`` hook of :func:`op_venv`: ``(code, output, log)``, where
    ``log`` names a file holding the output (None: the host's log of this call)."""
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stderr.write(proc.stdout or "")
    sys.stderr.flush()
    return proc.returncode, proc.stdout or "", None
