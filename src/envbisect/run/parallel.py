"""Set up a parallel ``run``: each worker's actuator, its facts checked, its calibration.

Called by ``runner.run_bisect`` when ``RunOptions.workers`` is not empty; returns the
``WorkerPool`` the engine uses as its batch test function. Nothing here prints: progress
lines go to the injected callback. See ``envbisect.run.workers`` for the policy.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from envbisect.model import manifest as mf
from envbisect.model.errors import EnvBisectError, WorkerError
from envbisect.model.events import CalibrationRefusedEvent
from envbisect.model.failure import FailureKind
from envbisect.model.session import Session
from envbisect.realize.actuate import Actuator
from envbisect.run.progress import Progress
from envbisect.run.workers import (
    Calibration,
    Worker,
    WorkerPool,
    calibrate,
    fact_mismatch,
    visible_gpus,
)
from envbisect.search import State
from envbisect.transport import Transport, kill_running

if TYPE_CHECKING:
    from envbisect.diff import DiffResult
    from envbisect.model.metric import Measurement
    from envbisect.run.options import RunOptions
    from envbisect.run.trial import TrialRunner

T = TypeVar("T")


def in_place_units(diff: DiffResult) -> list[str]:
    """Bisectable units with a file swapped in place (outside every repo of the diff): two
    trials on one host cannot hold two versions of that file at once."""
    repos = [Path(c.key) for u in diff.units for c in u.changes if c.section == "git"]
    out = []
    for unit in diff.units:
        if not unit.bisectable:
            continue
        for c in unit.changes:
            if c.section != "files":
                continue
            path = Path(c.key)
            if not any(path == r or r in path.parents for r in repos):
                out.append(unit.id)
                break
    return out


def worker_actuators(
    workers: Sequence[Worker], base: Actuator, units: Sequence[str], diff: DiffResult
) -> dict[str, Actuator]:
    """An actuator per worker that has a chain of its own; the others share ``base``.

    Refuses (WorkerError) several workers on one actuator when a unit swaps a file in
    place, and a worker whose actuator cannot realize a unit the search will move."""
    out: dict[str, Actuator] = {}
    shared = [w for w in workers if w.transport is None]
    swapped = [u for u in in_place_units(diff) if u in units]
    if len(shared) > 1 and swapped:
        raise WorkerError(
            f"workers {', '.join(w.name for w in shared)} share one host, but {swapped[0]} "
            "swaps a file in place: two trials cannot hold two versions of it at once "
            "(use workers with targets of their own, or one worker)"
        )
    for w in workers:
        if w.transport is None:
            continue
        act = base.for_worker(w.transport, w.python, w.name)
        blocked = act.blockers()
        for unit in units:
            if unit in blocked:
                raise WorkerError(f"worker {w.name}: cannot realize {blocked[unit]}")
        out[w.name] = act
    return out


def check_facts(
    workers: Sequence[Worker],
    *,
    transport: Transport,
    python: str,
    session: Session,
    progress: Progress,
) -> None:
    """Snapshot the target and every worker with a chain of its own; refuse a worker that is
    not the same kind of machine (GPU model, driver, torch; CPU model without GPUs)."""
    from envbisect.model.config import Config
    from envbisect.snapshot import take_snapshot

    out_dir = session.root / "workers"
    out_dir.mkdir(parents=True, exist_ok=True)
    config = Config(root=session.root, manifests_dir=out_dir)
    snaps: dict[tuple[str, str], dict[str, Any]] = {}

    def facts(t: Transport, py: str, label: str) -> dict[str, Any]:
        key = (t.describe(), py)
        if key not in snaps:
            try:
                snap = take_snapshot(config, t, py, label=label, log_dir=out_dir)
            except EnvBisectError as exc:
                raise WorkerError(f"worker {label}: cannot take its snapshot: {exc}") from None
            mf.save(snap, out_dir / f"{label}.yaml")
            snaps[key] = snap.as_dict()
        return snaps[key]

    want = dict(facts(transport, python, "target"))
    # The target's reference GPU is the first one a plain trial would see.
    first = visible_gpus(want.get("gpu"), _env_of_run())
    if first and (want.get("gpu") or {}).get("devices"):
        devices = [d for d in want["gpu"]["devices"] if int(d.get("index", -1)) == first[0]]
        want["gpu"] = {**want["gpu"], "devices": devices or want["gpu"]["devices"]}
    for w in workers:
        got = facts(w.transport or transport, w.python or python, w.name)
        why = fact_mismatch(w, got, want)
        if why is not None:
            where = out_dir / f"{w.name}.yaml"
            raise WorkerError(f"worker {w.name}: {why}; refused (its facts: {where})", w.name)
    progress(f"workers: {', '.join(w.describe() for w in workers)}; facts match the target")


def _env_of_run() -> Mapping[str, str]:
    import os

    return os.environ


# What calibration decides: the workers kept, their scale factors, and the sticky
# assignment of the good state to the reference worker (the search replays its trial).
Calibrated = tuple[list[Worker], dict[str, float], dict[State, str]]


def calibrate_workers(
    workers: Sequence[Worker],
    tester: TrialRunner,
    *,
    session: Session,
    samples: int,
    progress: Progress,
    on_cancel: Callable[[], Any] = kill_running,
) -> Calibrated:
    """Measure the good state on every worker (all at once); the reference worker's run is
    a logged trial that the search replays as its good endpoint. Returns the workers kept,
    their scale factors and the sticky assignment (good state -> reference worker). Read
    back from the log on --resume."""
    good = State.of(())
    logged = _logged_calibration(workers, session)
    if logged:
        progress("calibration read back from the session log")
        kept = [w for w in workers if any(c.worker == w.name for c in logged)]
        return kept, {c.worker: c.factor for c in logged}, {good: logged[0].worker}
    progress(f"calibrating: the good state on each of {len(workers)} workers at once")
    ref = workers[0]
    tester.rounds = {good: 0}  # round 0: the calibration, before the search's first
    cancel = threading.Event()
    outs = _all_at_once(
        [
            functools.partial(tester.measure, good, samples, w, cancel, calibration=w is not ref)
            for w in workers
        ],
        cancel,
        on_cancel,
    )
    tester.replay_as_good_endpoint(ref.name)
    measured: list[tuple[str, tuple[float, ...]]] = []
    for w, out in zip(workers, outs, strict=True):
        if out.failure or not out.samples:
            if w is ref:
                # The good state failing is the search's own finding (it replays this
                # trial): leave the verdict to it.
                return list(workers), {}, {good: ref.name}
            progress(f"worker {w.name} left out: the good state failed there ({out.failure})")
            continue
        measured.append((w.name, tuple(out.samples)))
    decided = calibrate_each(measured, progress, session)
    kept = [w for w in workers if any(c.worker == w.name for c in decided)]
    for c in decided:
        session.append(c.as_event())
        progress(
            f"calibration {c.worker}: good state {c.median:.4g} tok/s, "
            f"factor {c.factor:.3f} ({c.decision})"
        )
    return kept, {c.worker: c.factor for c in decided}, {good: ref.name}


def _logged_calibration(workers: Sequence[Worker], session: Session) -> list[Calibration]:
    """The calibration of these workers an earlier run of the session logged (--resume)."""
    names = [w.name for w in workers]
    return [
        Calibration(
            str(e["worker"]),
            tuple(e.get("samples") or ()),
            float(e.get("median") or 0),
            float(e.get("factor") or 1),
            str(e.get("decision")),
        )
        for e in session.events()
        if e.get("type") == "calibration" and e.get("worker") in names
    ]


def calibrate_each(
    measured: Sequence[tuple[str, Sequence[float]]],
    progress: Progress,
    session: Session | None = None,
) -> list[Calibration]:
    """``calibrate``, leaving a worker that is off by too much out (with a line) instead of
    stopping the run; the reference worker is never left out."""
    rest = list(measured)
    while True:
        try:
            return calibrate(rest)
        except WorkerError as exc:
            progress(f"{exc}; left out")
            name = getattr(exc, "worker", None)
            if session is not None:
                samples = next((list(s) for n, s in rest if n == name), [])
                session.append(CalibrationRefusedEvent(name, samples, str(exc)))
            rest = [m for m in rest if m[0] != name]


def _all_at_once(
    jobs: Sequence[Callable[[], T]], cancel: threading.Event, on_cancel: Callable[[], Any]
) -> list[T]:
    """Run the jobs in threads at once; on Ctrl-C set ``cancel`` (nothing is logged) and
    kill every running process."""
    pool = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="envbisect-cal")
    try:
        futures = [pool.submit(job) for job in jobs]
        return [f.result() for f in futures]
    except BaseException:
        cancel.set()
        on_cancel()
        raise
    finally:
        pool.shutdown(wait=True)


def prepare(
    workers: Sequence[Worker],
    *,
    tester: TrialRunner,
    actuator: Actuator,
    units: Sequence[str],
    diff: DiffResult,
    options: RunOptions,
    session: Session,
    progress: Progress,
) -> WorkerPool:
    """Everything before the first trial of a parallel search; the pool to search with."""
    from envbisect.run.slurm import Allocations, annotate

    allocations = Allocations()

    def on_cancel() -> None:
        kill_running()
        allocations.cancel_all()

    def after_run(m: Measurement, stderr: Path, worker: Worker) -> Measurement:
        if worker.slurm is None:
            return m
        if m.failure is not None and m.failure.kind is FailureKind.TIMEOUT:
            allocations.cancel_worker(worker.name)
        return annotate(m, stderr)

    tester.use_workers(after_run=after_run, allocations=allocations)
    workers = allocations.open(list(workers), session.root)
    tester.add_actuators(worker_actuators(workers, actuator, units, diff))
    check_facts(
        workers,
        transport=options.transport,
        python=options.python,
        session=session,
        progress=progress,
    )
    kept, factors, sticky = calibrate_workers(
        workers,
        tester,
        session=session,
        samples=max(3, options.repeats),
        progress=progress,
        on_cancel=on_cancel,
    )
    pool = WorkerPool(kept, tester.measure, factors=factors, sticky=sticky, on_cancel=on_cancel)
    tester.rounds = pool.rounds
    return pool
