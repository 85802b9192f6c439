"""Ending what a run leaves behind: its process group, its tagged processes and the orphans
re-parented to this process (a child subreaper on Linux), found under ``/proc``."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from envbisect.agent.procfs import ProcStat, read_stat

# ---- what a run leaves behind ----------------------------------------------------------------
#
# A command that exits normally may leave children running (``sleep 30 &``), and a ``setsid``
# child leaves the process group that the timeout kills. After every run, everything it
# started is ended: its process group, every process that still carries the run's tag in its
# environment (set in the run's env and inherited unless a child clears it), and — with this
# process a child subreaper on Linux (``PR_SET_CHILD_SUBREAPER``), so orphans are re-parented
# to envbisect instead of init — any re-parented orphan in another session, when no other run
# is in flight that it could belong to. Through a layer chain this covers the local hop
# (ssh, docker exec, ...); what a far side leaves is that side's own. An ssh ControlPersist
# master is the one thing left running: it exists to outlive the call that started it.

RUN_TAG_ENV = "ENVBISECT_RUN_TAG"
_PR_SET_CHILD_SUBREAPER = 36
_SUBREAPER: bool | None = None
_ACTIVE: dict[int, str] = {}  # pid of a run's first process -> its tag, while it runs
_IN_FLIGHT = 0  # runs between their start and their cleanup (counted before the fork)
_ACTIVE_LOCK = threading.Lock()
# Held by a cleanup while it looks for and ends orphans, and by a run while it is counted as
# starting: no run starts between a cleanup's "no other run is in flight" and its kills. A
# process just forked by another thread carries no tag yet (its environment is still this
# process's until exec), so only this ordering keeps it from reading as an orphan.
_STARTING = threading.Lock()


def run_starting() -> None:
    """Count a run as in flight, before its process is forked (waits for a cleanup that is
    ending orphans)."""
    with _STARTING:
        _in_flight(+1)


def run_started(pid: int, tag: str) -> int | None:
    """Note the run whose first process is ``pid`` (tagged ``tag``); its start time in clock
    ticks after boot, or None where /proc cannot tell."""
    first = read_stat(pid)
    with _ACTIVE_LOCK:
        _ACTIVE[pid] = tag
    return first.starttime if first else None


def run_ended(pid: int | None = None) -> None:
    """A run is over (``pid``: its first process; None when it never started)."""
    _in_flight(-1, pid)


def _in_flight(delta: int, pid: int | None = None) -> None:
    global _IN_FLIGHT
    with _ACTIVE_LOCK:
        _IN_FLIGHT += delta
        if pid is not None:
            _ACTIVE.pop(pid, None)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux; once)."""
    global _SUBREAPER
    if _SUBREAPER is None:
        _SUBREAPER = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _SUBREAPER = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                _SUBREAPER = False
    return _SUBREAPER


def _tag_of(pid: int) -> str | None:
    """The run tag in ``pid``'s environment; None when it has none (or it is gone)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    key = f"{RUN_TAG_ENV}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key) :].decode("ascii", "replace")
    return None


def _pids() -> list[int]:
    """Every process id under /proc."""
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode("utf-8", "replace") for w in words if w)
    return text[:200] or "?"


def _leftovers(pgid: int, tag: str, since: int | None) -> list[ProcStat]:
    """Processes of the run started as ``pgid`` (and tagged ``tag``) that still exist.

    A process tagged by another run is that run's. An untagged orphan (its environment
    cleared) counts only when it was re-parented to this process, sits in another session,
    started after the run did (``since``) and no other run is in flight that it could belong
    to: the caller holds ``_STARTING``, so none starts while this looks.
    """
    me, my_sid, uid = os.getpid(), os.getsid(0), os.getuid()
    with _ACTIVE_LOCK:
        others = {pid for pid in _ACTIVE if pid != pgid}
        alone = _IN_FLIGHT <= 1
    found = []
    for pid in _pids():
        if pid == me or pid in others:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        st = read_stat(pid)
        if st is None:
            continue
        tagged = _tag_of(pid)
        orphan = (
            _SUBREAPER
            and alone
            and tagged is None
            and st.ppid == me
            and st.session != my_sid
            and since is not None
            and st.starttime >= since
        )
        if (st.pgrp == pgid or orphan or tagged == tag) and not _shared_helper(pid):
            found.append(st)
    return found


def _shared_helper(pid: int) -> bool:
    """An ssh ControlPersist master ("ssh: <socket> [mux]"): started by one call on purpose
    to serve the next ones (README: per-call overhead ~0.3 s → ~0.03 s), so it is left be."""
    cmd = _cmdline(pid)
    return cmd.startswith("ssh: ") and cmd.endswith("[mux]")


def end_leftovers(pgid: int, tag: str, since: int | None) -> list[str]:
    """End (SIGKILL) and reap whatever the run left; returns ``pid command`` per process."""
    if not sys.platform.startswith("linux"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        return []
    killed: list[str] = []
    seen: set[int] = set()
    for _ in range(5):  # a child may fork while its parent is being ended: look again
        with _STARTING:  # no run starts between looking and killing (see _STARTING)
            procs = _leftovers(pgid, tag, since)
            alive = [p for p in procs if p.state != "Z" and p.pid not in seen]
            for p in alive:
                killed.append(f"{p.pid} {_cmdline(p.pid)}")
                seen.add(p.pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _reap(p.pid for p in procs if p.ppid == os.getpid())
        if not alive:
            break
    return killed


def _reap(pids: Iterable[int]) -> None:
    """Collect the exit status of re-parented orphans (only those: never a Popen's child)."""
    for pid in pids:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.005)
