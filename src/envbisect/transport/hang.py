"""A run that hangs without using the CPU: threads waiting on each other for good.

On the H100 the field's drift with the user's own threaded script deadlocked (a thread
tracing flex attention's backward waited on the autograd engine, whose device thread was
compiling another thread's backward) and sat until its 170 s timeout, each time. A process
group that used almost no CPU time for ``idle_s`` seconds is ended as hung: a training
process that works spins a core (the CUDA driver busy-waits on the GPU by default, a compile
uses the CPU), so silence that long is a deadlock, or a wait on something that will not
come. The run's own processes are read from ``/proc`` (the group the run leads); a local
run only: through layers the local process is the first hop, idle by nature.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass

from envbisect.agent.procfs import ProcStat, read_stat

TICK_S = 2.0  # how often the group's CPU time is read
IDLE_CORE = 0.005  # under this share of one core, over idle_s, the group is idle


@dataclass(frozen=True)
class HangSpec:
    """End a run whose processes used no CPU time for ``idle_s`` seconds; before, send
    ``stack_signal`` to its first process (the probe writes every thread's stack on it)."""

    idle_s: float
    stack_signal: int | None = None


def _group(pgid: int) -> list[ProcStat]:
    """``/proc/<pid>/stat`` of the processes now in group ``pgid`` (``agent.procfs``)."""
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    return [st for pid in pids if (st := read_stat(pid)) is not None and st.pgrp == pgid]


def group_cpu_s(pgid: int) -> float:
    """CPU seconds the processes now in group ``pgid`` have used. One that leaves takes
    its time with it: ``HangWatch`` starts its window again then."""
    return sum(st.utime + st.stime for st in _group(pgid)) / os.sysconf("SC_CLK_TCK")


def group_rss_bytes(pgid: int) -> int:
    """Resident bytes of the processes now in group ``pgid`` together."""
    return sum(st.rss for st in _group(pgid)) * os.sysconf("SC_PAGE_SIZE")


class PeakWatch:
    """The most resident memory one run's process group held at once, read every
    ``PEAK_TICK_S`` (a local run only: what a crash-counting run at once needs of the host;
    ``run.together``)."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.peak_bytes = 0

    def read(self) -> None:
        self.peak_bytes = max(self.peak_bytes, group_rss_bytes(self.pgid))


PEAK_TICK_S = 0.5


class HangWatch:
    """Reads of one run's group CPU time; ``hung()`` once the last ``idle_s`` used none."""

    def __init__(self, pgid: int, spec: HangSpec) -> None:
        self.pgid = pgid
        self.spec = spec
        self.reads: deque[tuple[float, float]] = deque()
        self.hung_for: float | None = None  # once hung: the seconds it used no CPU time

    def hung(self) -> bool:
        now, cpu = time.monotonic(), group_cpu_s(self.pgid)
        if self.reads and cpu < self.reads[-1][1]:
            self.reads.clear()  # a process left the group with its time: start again
        self.reads.append((now, cpu))
        while len(self.reads) > 1 and self.reads[1][0] <= now - self.spec.idle_s:
            self.reads.popleft()  # keep one read at or before the window's start
        first_t, first_cpu = self.reads[0]
        if now - first_t < self.spec.idle_s or cpu - first_cpu >= IDLE_CORE * (now - first_t):
            return False
        self.hung_for = now - first_t
        return True
