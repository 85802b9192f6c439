"""``/proc/<pid>/stat``, read and parsed in one place (stdlib only, Python 3.8+ syntax).

Both sides use it: the agent (shipped by the bundle; see ``AGENT_REQUIRES`` in the modules
that import it) and the host (transport's reaper, the session's and the journal's liveness
checks, contention). Linux only: elsewhere, or for a process that is gone, ``read_stat``
returns None.
"""

from __future__ import annotations

from typing import NamedTuple


class ProcStat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` that envbisect reads (see proc(5))."""

    pid: int
    comm: str  # the command name, without its parentheses
    state: str  # R, S, D, Z, T, ...
    ppid: int
    pgrp: int
    session: int
    utime: int  # clock ticks
    stime: int  # clock ticks
    starttime: int  # clock ticks after boot
    rss: int = 0  # resident pages


def parse_stat(pid: int, raw: bytes) -> ProcStat | None:
    """``raw`` (the bytes of ``/proc/<pid>/stat``) parsed, or None when it is malformed."""
    # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
    close = raw.rfind(b")")
    fields = raw[close + 2 :].split()
    try:
        return ProcStat(
            pid,
            raw[raw.find(b"(") + 1 : close].decode("ascii", "replace"),
            fields[0].decode("ascii", "replace"),
            int(fields[1]),
            int(fields[2]),
            int(fields[3]),
            int(fields[11]),
            int(fields[12]),
            int(fields[19]),
            int(fields[21]),
        )
    except (IndexError, ValueError):
        return None


def read_stat(pid: int, proc: str = "/proc") -> ProcStat | None:
    """``/proc/<pid>/stat`` of ``pid`` (under ``proc``), or None when it cannot be read."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return parse_stat(pid, raw)
