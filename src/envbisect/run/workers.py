"""Workers: where the trials of a parallel bisection run, and the pool that feeds them.

A *worker* is one place that runs one trial at a time:

- a **slot of this host** (or of the ``--via`` target): its own environment
  (``CUDA_VISIBLE_DEVICES`` for one GPU each) and, on a host without GPUs, its own cores
  (``taskset -c``, with ``OMP_NUM_THREADS`` to match);
- a **target**: a named ``--via`` chain under ``targets:`` (another box over ssh); the
  actuators realize the state there;
- a **Slurm** worker: each trial's processes run as steps of a Slurm allocation on the
  allocated node (see ``envbisect.run.slurm``).

``--workers N`` is N GPU slots of the target (``auto``: one per visible GPU); on a host
without GPUs it pins N workers to disjoint cores, or refuses when there are fewer cores.

Before the first trial every worker's facts are checked against the target's with a
snapshot (GPU model, driver, torch): a mismatched worker is refused with a one-line reason.
Then every worker measures the good state (*calibration*): a worker whose speed is within
the noise of the reference worker's (the first) is used as is; one that is significantly
off but by at most ``MAX_SKEW`` gets a scale factor (its samples are multiplied by the
reference's good median over its own); one significantly off by more is left out. The calibration is
recorded in the session log (``calibration`` events); the reference worker's good-state
samples are the search's good endpoint, so calibration costs no extra trial there.

``WorkerPool`` is the engine's batch test function: each state of a round goes to a free
worker (a state measured before goes back to the worker that measured it: every trial of
one state runs on one worker), each in a thread; Ctrl-C kills every running trial's process
group and cancels Slurm jobs before it propagates.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbisect.model.errors import UsageError, WorkerError
from envbisect.model.events import CalibrationEvent
from envbisect.search import Event, EventKind, Outcome, State
from envbisect.search.verdict import Noise, median
from envbisect.transport import Transport

if TYPE_CHECKING:
    from envbisect.model.config import Config, Target, WorkerConfig

# A worker whose good-state speed differs from the reference worker's by more than this
# factor is not the same kind of machine (or not idle): refused rather than calibrated.
MAX_SKEW = 1.15


@dataclass(frozen=True)
class SlurmSpec:
    """Where a Slurm worker's jobs go: ``srun``/``salloc`` options of envbisect.yaml."""

    partition: str | None = None
    gres: str | None = None
    time: str | None = None
    count: int = 1
    mode: str = "salloc"  # one allocation reused across trials, or "srun": a job per run
    args: tuple[str, ...] = ()  # further options, e.g. ("--account=ml",)

    def options(self) -> list[str]:
        out = []
        if self.partition:
            out.append(f"--partition={self.partition}")
        if self.gres:
            out.append(f"--gres={self.gres}")
        if self.time:
            out.append(f"--time={self.time}")
        return [*out, *self.args]


@dataclass(frozen=True)
class Worker:
    """One place that runs one trial at a time."""

    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    transport: Transport | None = None  # None: the run's own target
    python: str | None = None  # None: the run's python
    cpus: tuple[int, ...] = ()
    slurm: SlurmSpec | None = None
    target: str | None = None  # the targets: name it came from
    device: int | None = None  # the GPU index a slot is given

    def describe(self) -> str:
        parts = []
        if self.target:
            parts.append(f"target {self.target}")
        if self.slurm is not None:
            parts.append("slurm " + " ".join(self.slurm.options()))
        if self.cpus:
            parts.append(f"cores {_cpu_list(self.cpus)}")
        parts += [f"{k}={v}" for k, v in sorted(self.env.items())]
        return f"{self.name} ({', '.join(parts) or 'this host'})"

    def pin_argv(self) -> tuple[str, ...]:
        """The words that pin a process to this worker's cores (empty when unpinned)."""
        return ("taskset", "-c", _cpu_list(self.cpus)) if self.cpus else ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "env": dict(self.env),
            "target": self.target,
            "via": [layer.describe() for layer in self.transport.layers]
            if self.transport
            else None,
            "python": self.python,
            "cpus": list(self.cpus),
            "slurm": None
            if self.slurm is None
            else dict(self.slurm.__dict__, args=list(self.slurm.args)),
        }


def _cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)


# ----------------------------------------------------------------------------- resolving


def parse_count(value: str) -> int | None:
    """``--workers`` as a number (None for ``auto``); UsageError otherwise."""
    if value == "auto":
        return None
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--workers must be a number or 'auto', got {value!r}") from None
    if n < 1:
        raise UsageError(f"--workers must be at least 1, got {n}")
    return n


def visible_gpus(manifest_gpu: Mapping[str, Any] | None, env: Mapping[str, str]) -> list[int]:
    """The GPU indices a process of the target may use: ``CUDA_VISIBLE_DEVICES`` (numeric
    entries) when it is set, else every device of the snapshot's ``gpu`` section."""
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        out = []
        for word in listed.split(","):
            word = word.strip()
            if word.isdigit():
                out.append(int(word))
        return out
    devices = (manifest_gpu or {}).get("devices") or []
    return [int(d.get("index", i)) for i, d in enumerate(devices) if isinstance(d, Mapping)]


def slot_workers(
    count: int | None,
    *,
    gpus: Sequence[int],
    cpus: Sequence[int],
) -> list[Worker]:
    """``--workers N|auto``: one slot per GPU (``CUDA_VISIBLE_DEVICES``), or, with no GPU,
    N slots pinned to disjoint cores (refused when the cores do not divide into N)."""
    if gpus:
        n = len(gpus) if count is None else count
        if n > len(gpus):
            raise UsageError(
                f"--workers {n}: the target has {len(gpus)} visible GPU(s) "
                f"({_cpu_list(gpus)}); one worker per GPU at most"
            )
        return [
            Worker(name=f"gpu{g}", env={"CUDA_VISIBLE_DEVICES": str(g)}, device=g) for g in gpus[:n]
        ]
    if count is None:
        raise UsageError(
            "--workers auto: the target has no visible GPU; give --workers N to pin N "
            "workers to disjoint cores"
        )
    cores = sorted(cpus)
    if count == 1:
        return [Worker(name="cpu0")]
    if len(cores) < count:
        raise UsageError(
            f"--workers {count}: this host has {len(cores)} core(s) ({_cpu_list(cores)}); "
            "trials sharing cores disturb each other's throughput, so each worker needs "
            "cores of its own"
        )
    if shutil.which("taskset") is None:
        raise UsageError(
            f"--workers {count}: no GPU and no 'taskset' to pin each worker to its own "
            "cores; trials sharing cores disturb each other's throughput"
        )
    per = len(cores) // count
    return [
        Worker(
            name=f"cpu{i}",
            cpus=tuple(cores[i * per : (i + 1) * per]),
            env={"OMP_NUM_THREADS": str(per)},
        )
        for i in range(count)
    ]


def config_workers(specs: Sequence[WorkerConfig], targets: Mapping[str, Target]) -> list[Worker]:
    """Workers from envbisect.yaml's ``workers:`` (already type-checked by config)."""
    out = []
    for spec in specs:
        transport = None
        python = None
        if spec.target is not None:
            target = targets[spec.target]
            transport = Transport.from_specs(tuple(target.via))
            python = target.python
        slurm = None
        if spec.slurm is not None:
            slurm = SlurmSpec(**spec.slurm)
        env = dict(spec.env)
        device = None
        cvd = env.get("CUDA_VISIBLE_DEVICES", "")
        if cvd.isdigit():
            device = int(cvd)
        base = Worker(
            name=spec.name,
            env=env,
            transport=transport,
            python=python,
            cpus=tuple(spec.cpus),
            slurm=slurm,
            target=spec.target,
            device=device,
        )
        count = slurm.count if slurm is not None else 1
        if count == 1:
            out.append(base)
        else:
            out.extend(replace(base, name=f"{spec.name}{i}") for i in range(count))
    return out


# ----------------------------------------------------------------------------- facts


def fact_mismatch(worker: Worker, facts: Mapping[str, Any], want: Mapping[str, Any]) -> str | None:
    """Why ``worker`` (its snapshot ``facts``) is not the same kind of machine as the target
    (``want``, the target's snapshot), or None. Both are manifest dicts."""
    fg, wg = facts.get("gpu") or {}, want.get("gpu") or {}
    if (fg.get("driver") or None) != (wg.get("driver") or None):
        return (
            f"GPU driver {fg.get('driver') or 'none'} differs from the target's "
            f"{wg.get('driver') or 'none'}"
        )
    ref = _device_name(wg, None)
    mine = _device_name(fg, worker.device)
    if ref != mine:
        which = f"GPU {worker.device}" if worker.device is not None else "GPU"
        return f"{which} {mine or 'none'!r} differs from the target's {ref or 'none'!r}"
    ft, wt = facts.get("torch") or {}, want.get("torch") or {}
    for key in ("version", "cuda"):
        if (ft.get(key) or None) != (wt.get(key) or None):
            return (
                f"torch {key} {ft.get(key) or 'none'} differs from the target's "
                f"{wt.get(key) or 'none'}"
            )
    if not wg.get("devices"):
        fs, ws = facts.get("system") or {}, want.get("system") or {}
        if (fs.get("cpu_model") or None) != (ws.get("cpu_model") or None):
            return f"CPU {fs.get('cpu_model')!r} differs from the target's {ws.get('cpu_model')!r}"
    return None


def _device_name(gpu: Mapping[str, Any], index: int | None) -> str | None:
    devices = [d for d in gpu.get("devices") or [] if isinstance(d, Mapping)]
    if not devices:
        return None
    if index is None:
        return str(devices[0].get("name"))
    for i, d in enumerate(devices):
        if int(d.get("index", i)) == index:
            return str(d.get("name"))
    return None


# ----------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Calibration:
    """One worker measured on the good state: its median, the scale applied to its samples
    and the decision (``reference``, ``within noise``, ``scaled``)."""

    worker: str
    samples: tuple[float, ...]
    median: float
    factor: float
    decision: str

    def as_event(self) -> CalibrationEvent:
        """This calibration as the session logs it."""
        return CalibrationEvent(self.worker, self.samples, self.median, self.factor, self.decision)


def calibrate(measured: Sequence[tuple[str, Sequence[float]]]) -> list[Calibration]:
    """Decide every worker's scale from its good-state samples (the first is the reference).

    Raises WorkerError naming the first worker off by more than ``MAX_SKEW``.
    """
    noise = Noise.from_groups(list(s) for _, s in measured if s)
    ref_name, ref_samples = measured[0]
    ref = median(ref_samples)
    out = [Calibration(ref_name, tuple(ref_samples), ref, 1.0, "reference")]
    for name, samples in measured[1:]:
        med = median(samples)
        skew = med / ref
        se = math.hypot(noise.median_se(len(samples)), noise.median_se(len(ref_samples)))
        significant = abs(math.log(skew)) > 2.5 * se
        if significant and not (1 / MAX_SKEW <= skew <= MAX_SKEW):
            raise WorkerError(
                f"worker {name}: the good state runs at {med:.4g} tok/s there, "
                f"{skew:.2f}x the reference worker {ref_name}'s {ref:.4g} "
                f"(more than {MAX_SKEW:.2f}x off: not the same kind of machine, or not idle)",
                worker=name,
            )
        if not significant:
            out.append(Calibration(name, tuple(samples), med, 1.0, "within noise"))
        else:
            out.append(Calibration(name, tuple(samples), med, ref / med, "scaled"))
    return out


# ----------------------------------------------------------------------------- the pool

# The runner's side: measure ``n`` samples of a state on a worker; ``cancel`` is set when
# the round is abandoned (Ctrl-C): the function must then log nothing and return.
MeasureFn = Callable[[State, int, Worker, threading.Event], Outcome]


class WorkerPool:
    """The engine's batch test function over ``workers``; thread-safe per round."""

    def __init__(
        self,
        workers: Sequence[Worker],
        measure: MeasureFn,
        *,
        factors: Mapping[str, float] | None = None,
        sticky: Mapping[State, str] | None = None,
        on_cancel: Callable[[], object] | None = None,
    ) -> None:
        if not workers:
            raise ValueError("no workers")
        self.workers = list(workers)
        self.by_name = {w.name: w for w in self.workers}
        self.measure = measure
        self.factors = dict(factors or {})
        self.sticky: dict[State, str] = dict(sticky or {})
        self.rounds: dict[State, int] = {}
        self.on_cancel = on_cancel
        self._next = 0

    def progress(self, event: Event) -> None:
        """Feed the engine's events here: a trial's round is known when it starts."""
        if event.kind is EventKind.TRIAL_STARTED and event.trial is not None:
            self.rounds[event.trial.state] = event.trial.round

    def __call__(self, calls: Sequence[tuple[State, int]]) -> list[Outcome]:
        """Measure a round: each worker takes the next state that is not another worker's
        (a state measured before stays with its worker), until the round is done."""
        if len(calls) == 1 and len(self.workers) == 1:
            return [self.measure_on(calls[0][0], calls[0][1], self.workers[0], threading.Event())]
        run = _Round(self, calls)
        # Every worker gets a thread (a state may be sticky to any of them); the one to
        # start taking new states turns with each round, to spread them.
        start = self._next % len(self.workers)
        order = self.workers[start:] + self.workers[:start]
        threads = [
            threading.Thread(target=run.loop, args=(w,), name=f"envbisect-{w.name}", daemon=True)
            for w in order
        ]
        try:
            for t in threads:
                t.start()
            return run.wait(threads)
        except BaseException:
            run.cancel.set()
            if self.on_cancel is not None:
                self.on_cancel()
            raise
        finally:
            for t in threads:
                t.join()
            self._next += 1

    def measure_on(self, state: State, n: int, worker: Worker, cancel: threading.Event) -> Outcome:
        """One state of a round on ``worker``: its samples scaled by the worker's
        calibration factor; the state stays with the worker that measured it."""
        out = self.measure(state, n, worker, cancel)
        name = out.worker or worker.name
        if name in self.by_name:
            # A trial replayed from the log stays with the worker that measured it.
            self.sticky[state] = name
        factor = self.factors.get(name, 1.0)
        samples = tuple(s * factor for s in out.samples) if factor != 1.0 else out.samples
        return Outcome(samples=samples, failure=out.failure, untestable=out.untestable, worker=name)


class _Round:
    """One round of a WorkerPool: the states not yet taken, the outcomes, the first error;
    worker threads take states under ``cond``."""

    def __init__(self, pool: WorkerPool, calls: Sequence[tuple[State, int]]) -> None:
        self.pool = pool
        self.calls = calls
        self.cancel = threading.Event()
        self.cond = threading.Condition()
        self.pending = list(range(len(calls)))
        self.results: dict[int, Outcome] = {}
        self.errors: list[BaseException] = []

    def _next_for(self, worker: Worker) -> int | None:
        for i in self.pending:
            owner = self.pool.sticky.get(self.calls[i][0])
            if owner is None or owner == worker.name or owner not in self.pool.by_name:
                return i
        return None

    def _take(self, worker: Worker) -> int | None:
        """The next state for ``worker`` (None: nothing left for it, or the round failed)."""
        with self.cond:
            if self.cancel.is_set() or self.errors:
                return None
            i = self._next_for(worker)
            if i is not None:
                self.pending.remove(i)
                self.pool.sticky.setdefault(self.calls[i][0], worker.name)
            return i

    def loop(self, worker: Worker) -> None:
        """A worker's thread: measure states until none is left for it."""
        while (i := self._take(worker)) is not None:
            state, n = self.calls[i]
            try:
                out = self.pool.measure_on(state, n, worker, self.cancel)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                with self.cond:
                    self.errors.append(exc)
                    self.cond.notify_all()
                return
            with self.cond:
                self.results[i] = out
                self.cond.notify_all()

    def wait(self, threads: Sequence[threading.Thread]) -> list[Outcome]:
        """The outcomes in the order of the calls, once every state is measured; the first
        error raised in a worker's thread is raised here."""
        with self.cond:
            while len(self.results) < len(self.calls) and not self.errors:
                if not any(t.is_alive() for t in threads):
                    break
                self.cond.wait(0.5)
        if self.errors:
            raise self.errors[0]
        if len(self.results) < len(self.calls):
            raise RuntimeError("workers stopped before the round was done")
        return [self.results[i] for i in range(len(self.calls))]


def cpus_of_host() -> list[int]:
    """The cores this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def target_gpus(transport: Transport, python: str, log_dir: Path) -> list[int]:
    """The GPU indices a trial on the target may use: ``CUDA_VISIBLE_DEVICES`` of this
    process when the target is this host and it is set, else what ``nvidia-smi`` lists
    there (none without nvidia-smi)."""
    if not transport.layers and "CUDA_VISIBLE_DEVICES" in os.environ:
        return visible_gpus(None, os.environ)
    from envbisect.model.errors import TransportError

    try:
        res = transport.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            timeout_s=60,
            log_dir=log_dir,
            name="nvidia-smi",
        )
    except TransportError:
        return []
    if res.returncode != 0:
        return []
    return [int(w) for w in res.stdout().decode("utf-8", "replace").split() if w.isdigit()]


def target_cpus(transport: Transport, python: str, log_dir: Path) -> list[int]:
    """The cores a process on the target may run on."""
    if not transport.layers:
        return cpus_of_host()
    from envbisect.model.errors import TransportError

    code = "import os; print(*sorted(os.sched_getaffinity(0)))"
    try:
        res = transport.run([python, "-c", code], timeout_s=60, log_dir=log_dir, name="cpus")
    except TransportError:
        return []
    return [int(w) for w in res.stdout().decode("utf-8", "replace").split() if w.isdigit()]


def resolve(
    value: str | None,
    config: Config | None,
    *,
    transport: Transport,
    python: str,
    log_dir: Path,
) -> tuple[Worker, ...]:
    """The workers of a run: ``--workers N|auto`` (slots of the target), else envbisect.yaml's
    ``workers:``, else none (one trial at a time on the target, as without workers)."""
    if value is not None:
        count = parse_count(value)
        if count == 1:
            return ()
        workers = slot_workers(
            count,
            gpus=target_gpus(transport, python, log_dir),
            cpus=target_cpus(transport, python, log_dir),
        )
        return tuple(workers) if len(workers) > 1 else ()
    specs = getattr(config, "workers", ()) or ()
    if not specs:
        return ()
    workers = config_workers(specs, getattr(config, "targets", {}) or {})
    for w in workers:
        if w.cpus and shutil.which("taskset") is None and w.transport is None:
            raise UsageError(f"worker {w.name}: cpus given but no 'taskset' to pin with")
    return tuple(workers)
