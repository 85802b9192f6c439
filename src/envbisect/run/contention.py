"""How busy the machine is: what other processes take from the CPUs and GPUs while a trial
measures, so that samples taken under contention are flagged and said.

Read from the kernel and the driver, never guessed: CPU time from ``/proc/stat`` (all
processes) minus this process's own and its children's (``os.times``), the load average
from ``/proc/loadavg``, the busiest other processes from ``/proc/<pid>/stat``, and other
processes on the GPUs from ``nvidia-smi --query-compute-apps`` where it is installed. On a
machine without ``/proc`` every CPU figure is None and nothing is flagged.

Public API:

- ``Contention``: one window's reading (``contended``, ``describe()``, ``as_dict()``).
- ``Window.start()`` / ``Window.finish()``: the reading of one trial's run.
- ``probe(seconds)``: a short look at the machine, with the other processes named (the
  warning a run gives once at its start: ``busy_warning``).
- ``free_cores(reading)``: the cores a CPU job may use without waiting on a busy one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envbisect.transport import Transport

from envbisect.agent import loadlook
from envbisect.model.errors import TransportError

# Other processes taking this much CPU on average (in cores) make a sample contended: on
# a 2-core box, half a core elsewhere already moves the tiny preset (benchmarks/RESULTS.md).
CONTENDED_CORES = 0.5
# A process named in the warning takes at least this much of a core.
NAMED_CORES = 0.25


@dataclass(frozen=True)
class Busy:
    """Another process and the cores it kept busy (1.0: one core all along)."""

    pid: int
    name: str
    cores: float


@dataclass(frozen=True)
class Contention:
    """What other processes took while a window was open."""

    cores: int  # CPUs this process may use
    others_cores: float | None  # CPU time of other processes / wall time, in cores
    load1: float | None  # the 1-minute load average at the end
    gpu_others: tuple[str, ...] = ()  # "pid 123 python" of other processes on a GPU
    top: tuple[Busy, ...] = field(default_factory=tuple)  # the busiest others (probe only)

    @property
    def contended(self) -> bool:
        """True when other processes took at least ``CONTENDED_CORES`` or hold a GPU."""
        cpu = self.others_cores is not None and self.others_cores >= CONTENDED_CORES
        return cpu or bool(self.gpu_others)

    def describe(self) -> str:
        """``1 of 2 cores is 100% busy (pid 4242 sh)``; GPU users after a semicolon."""
        parts = []
        if self.others_cores is not None and self.others_cores >= CONTENDED_CORES:
            n = max(1, round(self.others_cores))
            pct = min(100, round(100 * self.others_cores / n))
            verb = "cores is" if n == 1 else "cores are"  # "1 of 2 cores is ..."
            who = ", ".join(f"pid {b.pid} {b.name}" for b in self.top[:3])
            parts.append(f"{n} of {self.cores} {verb} {pct}% busy" + (f" ({who})" if who else ""))
        if self.gpu_others:
            parts.append("other processes on the GPU (" + ", ".join(self.gpu_others) + ")")
        return "; ".join(parts) if parts else "quiet"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cores": self.cores,
            "others_cores": None if self.others_cores is None else round(self.others_cores, 2),
            "load1": self.load1,
            "contended": self.contended,
        }
        if self.gpu_others:
            out["gpu_others"] = list(self.gpu_others)
        if self.top:
            out["top"] = [
                {"pid": b.pid, "name": b.name, "cores": round(b.cores, 2)} for b in self.top
            ]
        return out

    @classmethod
    def of_look(cls, d: Mapping[str, Any]) -> Contention:
        """A reading from ``agent.loadlook.look`` (here or on a target)."""
        top = tuple(
            Busy(int(b["pid"]), str(b["name"]), float(b["cores"]))
            for b in d.get("top") or ()
            if isinstance(b, Mapping)
        )
        return replace(cls.from_dict(d), top=top)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Contention:
        return cls(
            cores=int(d.get("cores") or 1),
            others_cores=d.get("others_cores"),
            load1=d.get("load1"),
            gpu_others=tuple(d.get("gpu_others") or ()),
        )


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity)."""
    return int(loadlook.usable_cores())


def is_ours(pid: int, me: int | None = None) -> bool:
    """True when ``pid`` is this process or one of its descendants."""
    return bool(loadlook.is_ours(pid, me))


def gpu_others() -> tuple[str, ...]:
    """Other processes on a GPU (``pid N name``), per nvidia-smi; () without one."""
    return tuple(loadlook.gpu_others())


@dataclass(frozen=True)
class Window:
    """An open reading: started before a run, finished after it."""

    t0: float
    busy0: float | None
    ours0: float

    @classmethod
    def start(cls) -> Window:
        return cls(time.monotonic(), loadlook.busy_s(), loadlook.ours_s())

    def others_cores(self) -> float | None:
        busy = loadlook.busy_s()
        wall = time.monotonic() - self.t0
        if busy is None or self.busy0 is None or wall <= 0:
            return None
        return max(0.0, (busy - self.busy0 - (loadlook.ours_s() - self.ours0)) / wall)

    def finish(self, *, gpus: bool = True) -> Contention:
        """What other processes took since ``start`` (GPU users as seen now)."""
        return Contention(
            cores=usable_cores(),
            others_cores=self.others_cores(),
            load1=loadlook.load1(),
            gpu_others=gpu_others() if gpus else (),
        )


def probe(seconds: float = 0.5, min_cores: float = NAMED_CORES) -> Contention:
    """A short look at this machine now, naming the other processes that took at least
    ``min_cores`` (busiest first; the warning names three)."""
    return Contention.of_look(loadlook.look(seconds, min_cores))


def remote_probe(
    transport: Transport, python: str, log_dir: Path, seconds: float = 0.5
) -> Contention | None:
    """The same look taken on the target through ``transport`` (the agent reads the
    target's /proc, not this machine's); None when the target cannot be asked."""
    try:
        look = transport.run_agent(
            python,
            "envbisect.agent.loadlook",
            {"seconds": seconds, "min_cores": NAMED_CORES},
            timeout_s=30 + seconds,
            log_dir=log_dir,
            name="load",
        )
    except TransportError:
        return None
    return Contention.of_look(look)


def busy_warning(reading: Contention) -> str | None:
    """The one line a run prints at its start when the machine is busy, else None."""
    if not reading.contended:
        return None
    noisy = []
    if reading.others_cores is not None and reading.others_cores >= CONTENDED_CORES:
        noisy.append("CPU")
    if reading.gpu_others:
        noisy.append("GPU")
    return f"{reading.describe()}: {' and '.join(noisy)} throughput will be noisy"


def free_cores(reading: Contention) -> int:
    """The cores left once other processes' load is taken out (at least one): as many
    threads as a CPU job should start so that no OpenMP barrier waits on a busy core."""
    others = reading.others_cores or 0.0
    return max(1, reading.cores - round(others))
