"""What every ``RunResult`` of a run carries besides its outcome (``RunContext``): the
diff, what could not be realized, notes (the machine's load at the start, the thread count
trials get), and the machine the trials ran on (``machine_facts``)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbisect.model import manifest as mf
from envbisect.model.argvmap import live_cd
from envbisect.model.errors import ActuationError
from envbisect.model.session import Session
from envbisect.model.sources import Sources, uv_args
from envbisect.realize.actuate import Actuator
from envbisect.run import contention
from envbisect.run.options import RunOptions
from envbisect.run.progress import Progress
from envbisect.run.result import RunOutcome, RunResult

if TYPE_CHECKING:
    from envbisect.diff import DiffResult


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cpu_threads(
    options: RunOptions,
    reading: contention.Contention | None,
    diff: DiffResult,
    bad: mf.Manifest,
    actuator: Actuator,
) -> str | None:
    """Set OMP_NUM_THREADS for every trial of a user's command (the built-in smoke test
    sizes its own threads): the number asked, or with ``auto`` the free cores when other
    processes keep some busy at the start on a machine without GPUs. A CPU job with a thread
    per core waits at every parallel op for the thread the kernel descheduled, collapsing
    6-30x (benchmarks/RESULTS.md, issue 23). Decided once, the same for every state, and
    said; never where a state sets a thread count itself. Returns the note, or None."""
    want = options.cpu_threads
    if want == "off" or options.smoke.builtin:
        return None
    moved = sorted(
        {c.key for u in diff.units for c in u.changes if c.section == "env"} & set(THREAD_VARS)
    )
    if moved:
        return (
            f"trials keep the states' own {', '.join(moved)}; --cpu-threads is not applied"
            if want != "auto"
            else None
        )
    if want == "auto":
        # The target's own setting stands: this shell's, or the recorded one of a remote.
        env = bad.section("env") if options.transport.layers else os.environ
        mine = [v for v in THREAD_VARS if v in env]
        gpus = (bad.section("gpu") or {}).get("devices")
        if reading is None or mine or gpus or not reading.contended:
            return None
        n = contention.free_cores(reading)
        if n >= reading.cores:
            return None
        why = (
            f"{reading.cores - n} of {reading.cores} cores busy at the start: an OpenMP or "
            "MKL thread pool would otherwise wait on a busy core at every parallel op; "
            "--cpu-threads N to choose, --cpu-threads off to leave it"
        )
    else:
        n = int(want)
        why = "--cpu-threads"
    actuator.base_env = {**os.environ, **dict.fromkeys(THREAD_VARS, str(n))}
    return f"every trial runs with OMP_NUM_THREADS={n} and MKL_NUM_THREADS={n} ({why})"


def _look(options: RunOptions, session: Session) -> contention.Contention | None:
    """The machine's load at the start: this one's, or the target's through its layers
    (the agent reads the target's /proc); None when the target could not be asked."""
    if not options.transport.layers:
        return contention.probe()
    return contention.remote_probe(options.transport, options.python, session.root / "load")


@dataclass(frozen=True)
class RunContext:
    """What every RunResult of a run carries besides its outcome: the diff, the units that
    could not be realized, notes, the session, and the endpoints, smoke and target."""

    diff: DiffResult
    blocked: Mapping[str, str]
    notes: tuple[str, ...]
    session: Session
    options: RunOptions
    bad_path: Path
    bad: mf.Manifest | None = None  # the machine the run measured
    actuator: Actuator | None = None

    @classmethod
    def start(
        cls,
        diff: DiffResult,
        session: Session,
        options: RunOptions,
        bad_path: Path,
        bad: mf.Manifest,
        actuator: Actuator,
        progress: Progress,
    ) -> RunContext:
        """The run's context; says what will not be bisected, and why, and the notes."""
        blocked = actuator.blockers()
        notes = tuple(actuator.notes())
        for unit in diff.units:
            if not unit.bisectable:
                progress(f"not bisected: {unit.title}: {unit.reason}")
            elif unit.id in blocked:
                # The actuator's reason already starts with the section and key.
                progress(f"not bisected: {blocked[unit.id]}")
        cd = _remote_live_cd(options, diff)
        if cd is not None:
            notes = (*notes, cd)
        for note in notes:
            progress(f"note: {note}")
        reading = _look(options, session)
        busy = None if reading is None else contention.busy_warning(reading)
        if busy is not None:  # said once; each trial's samples are flagged on their own
            progress(f"warning: {busy}")
            notes = (*notes, f"at the start: {busy}")
        threads = cpu_threads(options, reading, diff, bad, actuator)
        if threads is not None:
            progress(f"note: {threads}")
            notes = (*notes, threads)
        return cls(diff, blocked, notes, session, options, bad_path, bad, actuator)

    def result(self, *, outcome: RunOutcome, threshold: float | None, message: str) -> RunResult:
        """This run's RunResult, with no culprits or trials (``replace`` adds them)."""
        return RunResult(
            outcome=outcome,
            threshold=threshold,
            culprits=(),
            trials=(),
            diff=self.diff,
            blocked=dict(self.blocked),
            notes=self.notes,
            session=self.session.root,
            message=message,
            good_path=self.options.good,
            bad_path=self.bad_path,
            smoke=self.options.smoke,
            target_args=target_args(self.options),
            threshold_source=self.options.goal.source,
            threshold_fraction=self.options.goal.fraction,
            machine=machine_facts(self.bad, self.options),
            python=self.options.python,
            cwd=str(self.options.cwd or Path.cwd()),
            uv=uv_word(self.actuator),
            uv_args=tuple(
                uv_args(
                    self.actuator.package_sources()
                    if self.actuator is not None
                    else Sources.from_config(self.options.config)
                )
            ),
        )


def uv_word(actuator: Actuator | None) -> str:
    """How the report's commands call uv: ``uv`` when that is the one on PATH, else the
    path of the uv the run used."""
    if actuator is None or actuator.remote:
        return "uv"
    try:
        used = actuator.uv_path()
    except ActuationError:
        return "uv"
    on_path = shutil.which("uv")
    return "uv" if on_path and os.path.realpath(on_path) == os.path.realpath(used) else used


def machine_facts(bad: mf.Manifest | None, options: RunOptions) -> dict[str, Any]:
    """The report's header: the machine the trials ran on (from the bad state's manifest)
    and this machine's load average when the run ended (local targets only)."""
    if bad is None:
        return {}
    system, gpu, torch, py = (bad.section(n) for n in ("system", "gpu", "torch", "python"))
    devices = gpu.get("devices") or []
    names = sorted({str(d.get("name")) for d in devices if isinstance(d, dict)})
    load = None
    if not options.transport.layers:
        with contextlib.suppress(OSError, AttributeError):
            load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "host": bad.section("meta").get("host"),
        "cpu": system.get("cpu_model"),
        "cpus": system.get("cpu_count"),
        "gpu": f"{len(devices)}× {', '.join(names)}" if devices else "none",
        "driver": gpu.get("driver"),
        "torch": torch.get("version"),
        "cuda": torch.get("cuda"),
        "python": py.get("version"),
        "load": load,
    }


def target_args(options: RunOptions) -> tuple[str, ...]:
    """The words that point a re-run at the same config, target python and layer chain,
    and run it the same way (--find-all, how long each run goes)."""
    words: list[str] = []
    path = getattr(options.config, "path", None)
    if path:
        words += ["--config", str(path)]
    words += ["--python", options.python]
    for layer in options.transport.layers:
        words += ["--via", layer.describe()]
    if options.find_all:
        words.append("--find-all")
    smoke = options.smoke
    if smoke.steps:
        words += ["--steps", str(smoke.steps)]
    if smoke.max_trial_s:
        words += ["--max-trial-s", f"{smoke.max_trial_s:g}"]
    if smoke.full_exit:
        words.append("--full-exit")
    return tuple(words)


def _remote_live_cd(options: RunOptions, diff: DiffResult) -> str | None:
    """Through layers, a shell script that ``cd``s above a bisected repo runs
    its relative paths in the live tree, not the state's worktree: said at the start."""
    if not options.transport.layers:
        return None
    repos = [str(c.key) for u in diff.units for c in u.changes if c.section == "git"]
    where = live_cd(options.smoke.argv, repos)
    if where is None:
        return None
    return (
        f"the command's shell script changes into {where}: through --via/--target its "
        "relative paths after that name the live repo there, not each state's worktree; "
        "type them absolute, or drop the cd and type them relative to the repo"
    )
