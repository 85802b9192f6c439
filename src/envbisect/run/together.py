"""Processes of one state at once, for crash counts alone (``--rate-runs-at-once``), and
how many: ``RunsAtOnce`` (``auto``: as many as the cores and the first runs' memory allow).

A crash rate needs no clean timing, only whether each process crashed; on the H100 the
field's grown data took 180 s of a 410 s run for its four rate runs one after the other.
Each process gets its own copy of the state's compile caches (``own_caches``): a cold cache
stays cold for every one of them, as a run after another would find it, and none warms
another's. Their figures are not kept (processes sharing the machine).
"""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from envbisect.model.metric import Measurement
from envbisect.run.launch import RunLog, RunSpec, SmokeCommand, run_once
from envbisect.run.options import RunOptions
from envbisect.sections.caches import CACHE_ENV


class RunsAtOnce:
    """How many crash-counting runs go at once: ``fixed`` (``--rate-runs-at-once N``) or,
    with ``fixed`` None (``auto``), as many as fit beside each other: the cores this process
    may use, the host memory available now over the most one run's processes held at once
    (read from ``/proc`` while it ran), and on a GPU its memory over the most a run reserved
    (the probe's and the drafter's facts) plus a CUDA context each; ``AUTO_MAX`` at most. A
    margin of ``HEADROOM`` keeps an out-of-memory crash (which would count as a crash) out.
    ``one_why``: auto, but one at a time, and why (a target behind layers, workers)."""

    def __init__(
        self, fixed: int | None, say: Callable[[str], None], one_why: str | None = None
    ) -> None:
        self.fixed = fixed
        self.say = say
        self.one_why = one_why
        self.host_peak = 0
        self.gpu_peak = 0
        self.gpu_total = 0
        self.chosen: int | None = None  # the last width said
        self.run_s: list[float] = []  # wall seconds of each run alone
        self.wave_s: list[float] = []  # wall seconds of each batch of runs at once

    @classmethod
    def for_run(cls, options: RunOptions, say: Callable[[str], None]) -> RunsAtOnce:
        return cls(options.rate_together, say, options.at_once_one_why())

    @property
    def enabled(self) -> bool:
        """Whether runs may go at once at all (else the engine runs them one by one)."""
        return (self.fixed or 0) > 1 or (self.fixed is None and self.one_why is None)

    def saw(self, log: RunLog) -> None:
        """What one run used: its group's most memory, and its GPU facts."""
        self.run_s.append(log.wall_s)
        self.host_peak = max(self.host_peak, log.launch.peak_rss_bytes or 0)
        memory = (log.launch.facts or {}).get("memory") or {}
        reserved = memory.get("peak_reserved_bytes") or memory.get("peak_allocated_bytes")
        if isinstance(reserved, int) and reserved > 0:
            self.gpu_peak = max(self.gpu_peak, reserved)
        total = memory.get("total_bytes")
        if isinstance(total, int) and total > 0:
            self.gpu_total = total

    def width(self) -> int:
        """Runs at once now; said once per new choice (with what bounded it)."""
        if self.fixed is not None:
            return self.fixed
        if self.one_why is not None:
            return 1
        n, why = self.fit()
        if n != self.chosen:
            self.chosen = n
            self.say(f"crash-counting runs: {n} at once (--rate-runs-at-once auto: {why})")
        return n

    def run(
        self, smoke: SmokeCommand, specs: Sequence[RunSpec]
    ) -> tuple[list[RunLog], list[Measurement]]:
        """``run_at_once``, its wall time kept for ``expected_s``."""
        started = time.monotonic()
        out = run_at_once(smoke, specs)
        self.wave_s.append(time.monotonic() - started)
        return out

    def expected_s(self, runs: int, width: int) -> float | None:
        """What ``runs`` more runs, ``width`` at a time, may take, from the runs so far (a
        batch at once as long as the batches before it, else as a run alone); None before
        any run."""
        each = self.wave_s if width > 1 and self.wave_s else self.run_s
        if not each:
            return None
        return -(-runs // width) * statistics.median(each)

    def fit(self) -> tuple[int, str]:
        """The width auto allows, and the words for each bound."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        bounds = [(cores, f"{cores} cores")]
        available = _mem_available()
        if self.host_peak and available:
            per = self.host_peak * HEADROOM
            bounds.append((int(available // per), f"{_gib(available)} free / {_gib(per)} a run"))
        if self.gpu_peak and self.gpu_total:
            per = (self.gpu_peak + CUDA_CONTEXT_BYTES) * HEADROOM
            gpu = int(self.gpu_total // per)
            bounds.append((gpu, f"GPU {_gib(self.gpu_total)} / {_gib(per)} a run"))
        n = max(1, min(AUTO_MAX, *(b for b, _ in bounds)))
        return n, ", ".join(words for _, words in bounds)


AUTO_MAX = 8
HEADROOM = 1.25  # a run's peak, with room for one that takes a little more
CUDA_CONTEXT_BYTES = 512 * 2**20  # what a process's CUDA context takes beyond its tensors


def _mem_available() -> int:
    """MemAvailable of ``/proc/meminfo`` in bytes (0: unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _gib(n: float) -> str:
    """A size in GiB, or MiB under one GiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def own_caches(env: Mapping[str, str] | None, root: Path) -> dict[str, str] | None:
    """``env`` with each compile cache dir it names copied under ``root`` (one process's);
    None (the caller's environment, no state's caches) stays None."""
    if env is None:
        return None
    out = dict(env)
    for var in CACHE_ENV.values():
        if out.get(var):
            out[var] = str(_copy(Path(out[var]), root / var))
    return out


def run_at_once(
    smoke: SmokeCommand, specs: Sequence[RunSpec]
) -> tuple[list[RunLog], list[Measurement]]:
    """Every spec's process started at once; their logs (in spec order) and measurements."""
    logs: list[list[RunLog]] = [[] for _ in specs]
    found: list[Measurement | None] = [None] * len(specs)

    def one(i: int) -> None:
        found[i] = run_once(smoke, specs[i], record=logs[i].append)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [log for batch in logs for log in batch], [m for m in found if m is not None]


def empty_dir(path: Path) -> None:
    """A cold cache made cold again (what an earlier run compiled into it removed)."""
    if path.is_dir():
        shutil.rmtree(path)
        path.mkdir()


def _copy(source: Path, dest: Path) -> Path:
    """``dest``, holding what ``source`` holds (empty when it is missing)."""
    if source.is_dir():
        shutil.copytree(source, dest, symlinks=True)
    else:
        dest.mkdir(parents=True)
    return dest
