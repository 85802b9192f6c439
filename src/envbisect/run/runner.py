"""``run`` and ``check`` as core functions: diff → units → engine search → trials → result.

Nothing here prints. Progress goes to an injected callback (one line per event); the
commands render the returned ``RunResult``/``CheckResult``.

A trial realizes a state with ``bisect.actuate.Actuator`` and runs the smoke command as many
times as the engine asks, each run through ``Transport.run`` (its process group is killed at
the per-trial timeout) with full stdout/stderr under ``<session>/trials/NNN/``. Every trial
is appended to the session log before the engine sees it, so ``--resume`` after ``kill -9``
feeds the logged samples back instead of measuring again.

Through ``--via``/``--target`` the state's environment reaches the far process as innermost
``env [-u NAME ...] NAME=value ...`` layers (the difference from this process's own
environment), for the built-in drafter shipped on stdin and for a user command alike; the
actuator realizes everything else on the target (see ``bisect.actuate``).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbisect.agent.redact import redact_env as redact_value
from envbisect.agent.redact import redact_tree
from envbisect.model import manifest as mf
from envbisect.model.errors import (
    ActuationError,
    CommandFailed,
    EnvBisectError,
    Interrupted,
    TransportError,
    UsageError,
)
from envbisect.model.facts import explain as explain_facts
from envbisect.model.facts import from_drafter
from envbisect.model.failure import Failure, FailureKind
from envbisect.model.history import HunkCulprit
from envbisect.model.metric import (
    RESULT_ENV,
    SAMPLES_ENV,
    Measurement,
    MetricSpec,
    Threshold,
    format_ktok,
    format_tok,
    measure,
)
from envbisect.model.session import Session, TrialRecord, state_key
from envbisect.model.sources import Sources, uv_args
from envbisect.realize.actuate import Actuator, Realized
from envbisect.realize.faithful import StateCheck, check_state, expected_facts
from envbisect.run import cmdcheck, contention, probed
from envbisect.search.engine import (
    Event,
    EventKind,
    Outcome,
    SearchResult,
    SearchSettings,
    State,
    Trial,
    search,
)
from envbisect.search.verdict import Judge, Noise, Verdict, median
from envbisect.sections.caches import CACHE_ENV
from envbisect.transport import Layer, LayerKind, Transport
from envbisect.transport.bundle import build_bundle, find_frame

if TYPE_CHECKING:
    from envbisect.diff import DiffResult, Unit
    from envbisect.model.config import Config
    from envbisect.run.slurm import Allocations
    from envbisect.run.workers import Worker, WorkerPool
    from envbisect.search.hunkrun import HunkTrial
    from envbisect.search.pkgrun import PackageFinding, Releases, Resolve

DRAFTER = "envbisect.agent.drafter"

Progress = Callable[[str], None]


def _quiet(_line: str) -> None:
    return None


# ----------------------------------------------------------------------------- one run

# Failures of a run that count towards a state's crash rate (a build failure is no run).
CRASH_KINDS = (FailureKind.CRASH, FailureKind.TIMEOUT)


@dataclass(frozen=True)
class SmokeCommand:
    """What a trial runs: a user argv (after ``--``) or, when ``argv`` is empty, the drafter."""

    argv: tuple[str, ...] = ()
    metric: MetricSpec | None = None
    drafter_params: Mapping[str, Any] = field(default_factory=lambda: {"preset": "auto"})
    probe: bool = True  # a Python command runs under the probe (envbisect.run.probed)

    @property
    def builtin(self) -> bool:
        return not self.argv

    def describe(self) -> str:
        if self.builtin:
            preset = self.drafter_params.get("preset", "auto")
            return f"built-in drafter smoke test (preset {preset})"
        import shlex

        return shlex.join(self.argv)


@dataclass(frozen=True)
class RunSpec:
    """Where and how one run of the smoke command goes (see ``run_once``)."""

    transport: Transport
    python: str
    env: Mapping[str, str] | None  # the run's whole environment; None: this process's
    cwd: Path | None
    timeout_s: float
    log_dir: Path  # <name>.stdout, <name>.stderr, <name>.result.json
    name: str
    argv_map: Callable[[Sequence[str]], list[str]] | None = None  # the state's paths
    samples: int = 1  # timed windows asked of the one process
    pin: tuple[str, ...] = ()  # words put in front of the innermost command (taskset -c N)

    @property
    def remote(self) -> bool:
        """Through layers: the local environment and cwd only reach the first hop."""
        return bool(self.transport.layers)


@dataclass(frozen=True)
class Launch:
    """One process of a run as it ended (``started`` False: it never did)."""

    argv: tuple[str, ...]  # as logged (the drafter's shows what went on stdin)
    program: str | None = None  # what a bare name resolved to under the state's PATH
    started: bool = False
    exit_status: int | None = None
    timed_out: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    # Known without reading a metric: the agent's own error, a command that cannot start.
    reading: Measurement | None = None
    probed: bool = False  # ran under the probe (envbisect.run.probed); argv is as typed


@dataclass(frozen=True)
class RunLog:
    """How one run went, as ``trial.json`` lists it under ``runs``."""

    name: str
    cwd: Path | None
    launch: Launch
    wall_s: float
    measurement: Measurement
    contention: Mapping[str, Any] | None = None  # other processes' load during the run

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "cwd": str(self.cwd) if self.cwd is not None else None,
            "argv": list(self.launch.argv),
        }
        if self.launch.program is not None:
            out["program"] = self.launch.program
        if self.launch.started:
            out.update(exit_status=self.launch.exit_status, timed_out=self.launch.timed_out)
        if self.launch.probed:
            out["probe"] = f"ran under the probe; facts in {self.name}{probed.FACTS_SUFFIX}"
        m = self.measurement
        return {
            **out,
            "wall_s": self.wall_s,
            "tok_per_s": m.tok_per_s,
            "samples": list(m.samples),
            "failure": m.failure,
            "source": m.source,
            **({"contention": dict(self.contention)} if self.contention is not None else {}),
        }


def run_once(
    smoke: SmokeCommand,
    spec: RunSpec | None = None,
    *,
    record: Callable[[RunLog], None] | None = None,
    **where: Any,
) -> Measurement:
    """Run the smoke command once and read its throughput (never raises for a bad run).

    ``spec`` says where and how; without it, its fields as keywords (``transport=...,
    python=..., env=..., cwd=..., timeout_s=..., log_dir=..., name=...``).
    ``spec.samples`` timed windows are asked of the one process (the built-in drafter
    through its params, any other command through ``$ENVBISECT_SAMPLES``): one start, one
    warm-up. ``record`` receives how the run went: argv, cwd, exit status, wall time, the
    reading.
    """
    spec = spec if spec is not None else RunSpec(**where)
    started = time.monotonic()
    launch, m = _run_once(smoke, spec)
    if record is not None:
        record(RunLog(spec.name, spec.cwd, launch, round(time.monotonic() - started, 3), m))
    return m


def _run_once(smoke: SmokeCommand, spec: RunSpec) -> tuple[Launch, Measurement]:
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    result_file = spec.log_dir / f"{spec.name}.result.json"
    if result_file.exists():
        result_file.unlink()
    run_env = dict(spec.env if spec.env is not None else os.environ)
    run_env[SAMPLES_ENV] = str(spec.samples)
    if not spec.remote:
        run_env[RESULT_ENV] = str(result_file)  # a path on this machine: not for a far side
    if smoke.builtin:
        launch, frame = _launch_drafter(smoke, spec, run_env)
    else:
        launch, frame = _launch_command(smoke, spec, run_env), None
    if launch.reading is not None:
        return launch, launch.reading
    return launch, measure(
        stdout=launch.stdout,
        stderr=launch.stderr,
        returncode=launch.exit_status,
        timed_out=launch.timed_out,
        timeout_s=spec.timeout_s,
        result_file=None if spec.remote else result_file,
        frame=frame,
        spec=smoke.metric,
    )


def _launch_drafter(
    smoke: SmokeCommand, spec: RunSpec, run_env: dict[str, str]
) -> tuple[Launch, dict[str, Any] | None]:
    """The drafter shipped on stdin; its result comes back in a frame on stdout."""
    params = {"samples": spec.samples, **dict(smoke.drafter_params)}
    bundle = build_bundle(DRAFTER, params, deadline_s=spec.timeout_s)
    launch = _launch(spec, run_env, [*spec.pin, spec.python, "-"], bundle.source, slack_s=5)
    launch = replace(launch, argv=(spec.python, "-", f"(stdin: {DRAFTER} {params})"))
    frame = find_frame(launch.stdout, bundle.nonce)
    if frame is not None and "__agent_error__" not in frame:
        # The drafter's facts in the probe's schema: the report explains both alike.
        with contextlib.suppress(TypeError, ValueError, OSError):
            facts = from_drafter(frame)
            probed.write_facts(spec.log_dir / f"{spec.name}{probed.FACTS_SUFFIX}", facts)
    if frame is not None and "__agent_error__" in frame:
        failed = Measurement(None, Failure.crash(f"{frame['__agent_error__']}"), "frame")
        return replace(launch, reading=failed), frame
    return launch, frame


def _launch_command(smoke: SmokeCommand, spec: RunSpec, run_env: dict[str, str]) -> Launch:
    """A user command, its paths mapped into the state; through layers it changes into the
    state's cwd on the far side."""
    typed = list(spec.argv_map(smoke.argv) if spec.argv_map else smoke.argv)
    argv, delivery = typed, None
    if smoke.probe:
        wrapped = probed.wrap(typed, spec.python)
        if wrapped.probed:
            argv = list(wrapped.argv)
            delivery = probed.Delivery.for_run(spec.log_dir, spec.name, spec.remote)
            run_env.update(delivery.env())
    # Logged as typed (the probe's bootstrap is a detail of how it ran: ``probed``).
    argv, logged = _placed(spec, argv), tuple(_placed(spec, typed))
    program = None
    if not spec.remote:
        program = shutil.which(argv[0], path=run_env.get("PATH")) or argv[0]
    try:
        launch = replace(_launch(spec, run_env, argv), program=program)
    except TransportError as exc:
        # e.g. the state's PATH has no such program: this state cannot run the command.
        failed = Measurement(None, Failure.crash(f"{exc}"), None)
        return Launch(logged, program, reading=failed)
    if delivery is None:
        return launch
    _facts, stdout = delivery.collect(launch.stdout, spec.log_dir, spec.name)
    return replace(launch, stdout=stdout, argv=logged, probed=True)


def _placed(spec: RunSpec, argv: list[str]) -> list[str]:
    """``argv`` behind the run's pin words and, through layers, in the state's cwd."""
    argv = [*spec.pin, *argv]
    if spec.remote and spec.cwd is not None:
        argv = ["sh", "-c", 'cd "$0" && exec "$@"', str(spec.cwd), *argv]
    return argv


def _launch(
    spec: RunSpec, run_env: dict[str, str], argv: list[str], stdin: bytes = b"", slack_s: float = 0
) -> Launch:
    # Through layers the local environment only reaches the first hop: the state's
    # variables ride in an innermost env layer instead.
    via = _far_transport(spec.transport, run_env) if spec.remote else spec.transport
    res = via.run(
        argv,
        stdin=stdin,
        timeout_s=spec.timeout_s + slack_s,
        log_dir=spec.log_dir,
        env=None if spec.remote else run_env,
        cwd=None if spec.remote else spec.cwd,
        name=spec.name,
    )
    return Launch(
        tuple(argv),
        started=True,
        exit_status=res.returncode,
        timed_out=res.timed_out,
        stdout=res.stdout(),
        stderr=res.stderr_path.read_bytes(),
    )


def _far_transport(transport: Transport, env: Mapping[str, str]) -> Transport:
    """``transport`` plus innermost ``env`` layers that make the far process's environment
    differ from its own as ``env`` differs from ours: changed variables set, removed ones
    unset (``env -u NAME``)."""
    changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
    unset = [w for k in sorted(os.environ) if k not in env for w in ("-u", k)]
    if unset:
        transport = Transport((*transport.layers, Layer(("env", *unset), LayerKind.ARGV)))
    return transport.with_env(changed)


# ----------------------------------------------------------------------------- check


@dataclass(frozen=True)
class CheckResult:
    """One measurement of the current state against a threshold."""

    threshold: float
    samples: tuple[float, ...]
    failure: Failure | None
    log_dir: Path | None
    # When it failed: the command's own first error line and how it ran (cmdcheck).
    detail: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def verdict(self) -> str:
        if self.failure is not None or self.median is None:
            return "skip"
        return "good" if self.median >= self.threshold else "bad"

    @property
    def noise(self) -> float:
        """Per-sample spread (log scale) of these samples, with the engine's prior."""
        return Noise.from_groups([self.samples]).sigma

    @property
    def within_noise(self) -> bool:
        """The median sits inside the noise band of the threshold: the verdict may flip."""
        if self.verdict == "skip":
            return False
        judge = Judge(self.threshold, Noise.from_groups([self.samples]))
        return judge.verdict(self.samples) is Verdict.UNRESOLVED

    @property
    def exit_code(self) -> int:
        return {"good": 0, "bad": 1}.get(self.verdict, 125)


def check(
    smoke: SmokeCommand,
    *,
    threshold: float,
    transport: Transport,
    python: str,
    repeats: int = 3,
    timeout_s: float = 600,
    log_root: Path | None = None,
) -> CheckResult:
    """Measure the current state ``repeats`` times; logs kept only when something failed."""
    log_dir = Path(tempfile.mkdtemp(prefix="envbisect-check-", dir=log_root))
    samples: list[float] = []
    failure: Failure | None = None
    k = 0
    while len(samples) < repeats:
        k += 1
        spec = RunSpec(
            transport=transport,
            python=python,
            env=None,
            cwd=None,
            timeout_s=timeout_s,
            log_dir=log_dir,
            name=f"run-{k}",
            samples=repeats - len(samples),
        )
        runs: list[RunLog] = []
        m = run_once(smoke, spec, record=runs.append)
        if not m.ok:
            failure = m.failure
            break
        samples.extend(m.samples)
    if failure is None:
        shutil.rmtree(log_dir, ignore_errors=True)
        return CheckResult(threshold, tuple(samples), None, None)
    detail = None
    if runs and not smoke.builtin:
        last = runs[-1]
        facts = cmdcheck.RunFacts(
            argv=last.launch.argv,
            cwd=Path.cwd(),
            interpreter=last.launch.program or python,
            started=last.launch.started,
            exit_status=last.launch.exit_status,
            stdout=last.launch.stdout.decode("utf-8", "replace"),
            stderr=last.launch.stderr.decode("utf-8", "replace"),
            failure=failure or Failure.crash("?"),
        )
        detail = cmdcheck.message("current", facts)
    return CheckResult(threshold, tuple(samples), failure, log_dir, detail)


# ----------------------------------------------------------------------------- run


@dataclass(frozen=True)
class RunOptions:
    """Everything ``envbisect run`` was asked to do."""

    good: Path
    bad: Path | None
    smoke: SmokeCommand
    python: str
    # A throughput, a fraction of the measured good state (--until 70%), or the default.
    goal: Threshold = field(default_factory=Threshold)
    transport: Transport = field(default_factory=Transport)
    session_dir: Path = Path(".envbisect/session")
    resume: bool = False
    fresh: bool = False
    repeats: int = 3
    max_samples: int = 9
    max_trials: int | None = None
    timeout_s: float = 600
    on_crash: str = "bad"
    crash_runs: int = 0  # runs of a bad endpoint that is not slow, looking for a crash
    find_all: bool = False  # go on after the first cause while reverting it is not enough
    recheck_loaded: bool = False  # measure again a verdict taken under passing load
    # OMP_NUM_THREADS of a user's command's trials: "auto" (the free cores when the machine
    # is busy at the start), "off" (as the environment has it), or a number.
    cpu_threads: str = "auto"
    config: Config | None = None
    cwd: Path | None = None
    workers: tuple[Worker, ...] = ()  # (): one, the target
    trust: tuple[Path, ...] = ()  # foreign manifests the user accepted (--trust)

    def search_settings(self, ordered: Mapping[str, Sequence[str]], workers: int) -> SearchSettings:
        """What the engine is asked: these options, the ordered units, ``workers`` at once."""
        return SearchSettings(
            threshold=self.goal.value,
            threshold_fraction=self.goal.fraction,
            repeats=self.repeats,
            max_samples=self.max_samples,
            max_trials=self.max_trials,
            ordered=ordered,
            on_failure=self.on_crash,
            workers=workers,
            crash_runs=self.crash_runs,
            find_all=self.find_all,
            recheck_loaded=self.recheck_loaded,
        )


@dataclass(frozen=True)
class TrialRow:
    """One trial as the run presents it: a row of the trial table, numbered as the session
    numbers trials (the engine's is ``search.Trial``, the logged one ``TrialRecord``)."""

    index: int
    applied: tuple[str, ...]
    samples: tuple[float, ...]
    median: float | None
    verdict: str
    failure: str | None = None
    outlier: str | None = None  # faster than good / slower than bad beyond the noise
    purpose: str = ""  # why the engine measured it: "endpoint: good", "confirm: alone", ...
    round: int = 0
    worker: str | None = None
    facts: Mapping[str, Any] | None = None  # its last run's (probe or drafter), if any
    runs: int = 0  # processes run; a crash ends one
    crashes: int = 0
    contended: int = 0  # samples taken while other processes loaded the machine
    set_aside: tuple[float, ...] = ()  # samples under load, set aside when measured again

    @property
    def crash_rate(self) -> str | None:
        """``crashed 2 of 6`` when a run of this state crashed."""
        return f"crashed {self.crashes} of {self.runs}" if self.crashes else None

    @classmethod
    def of(cls, trial: Trial, index: int, outlier: str | None) -> TrialRow:
        """The engine's trial, as trial ``index`` of the session."""
        return cls(
            index=index,
            applied=_applied_names(trial.state.applied, trial.state.positions),
            samples=tuple(trial.samples),
            median=trial.median,
            verdict=trial.verdict.value,
            failure=trial.failure,
            outlier=outlier,
            purpose=trial.purpose,
            round=trial.round,
            worker=trial.worker,
            runs=trial.runs,
            crashes=trial.crashes,
            contended=sum(trial.contended),
            set_aside=tuple(trial.set_aside),
        )

    @classmethod
    def from_record(cls, rec: TrialRecord, verdict: Mapping[str, Any]) -> TrialRow:
        """A logged trial, judged as its logged ``verdict`` event says (``{}``: not yet)."""
        return cls(
            index=rec.index,
            applied=_applied_names(rec.applied, rec.positions),
            samples=rec.samples,
            median=median(rec.samples) if rec.samples else None,
            verdict=str(verdict.get("verdict") or "-"),
            failure=rec.failure,
            outlier=verdict.get("outlier"),
            round=rec.round or 0,
            worker=rec.worker,
            runs=rec.runs,
            crashes=rec.crashes,
            contended=sum(rec.contended),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "purpose": self.purpose,
            "applied": list(self.applied),
            "samples": [round(s, 3) for s in self.samples],
            "median": None if self.median is None else round(self.median, 3),
            "verdict": self.verdict,
            "failure": self.failure,
            "outlier": self.outlier,
            "round": self.round,
            "worker": self.worker,
            "runs": self.runs,
            "crashes": self.crashes,
            "crash_rate": self.crash_rate,
            "contended_samples": self.contended,
            "set_aside_samples": [round(s, 3) for s in self.set_aside],
            "facts": self.facts,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrialRow:
        return cls(
            index=int(d["index"]),
            applied=tuple(d.get("applied") or ()),
            samples=tuple(float(x) for x in d.get("samples") or ()),
            median=d.get("median"),
            verdict=str(d.get("verdict") or "-"),
            failure=d.get("failure"),
            outlier=d.get("outlier"),
            purpose=str(d.get("purpose") or ""),
            round=int(d.get("round") or 0),
            worker=d.get("worker"),
            runs=int(d.get("runs") or 0),
            crashes=int(d.get("crashes") or 0),
            contended=int(d.get("contended_samples") or 0),
            set_aside=tuple(float(x) for x in d.get("set_aside_samples") or ()),
            facts=d.get("facts"),
        )


def _applied_names(applied: Iterable[str], positions: Iterable[tuple[str, int]]) -> tuple[str, ...]:
    """``git:/r@3`` for an ordered unit applied at a position, else the unit id; sorted."""
    at = dict(positions)
    return tuple(f"{u}@{at[u]}" if u in at else u for u in sorted(applied))


@dataclass(frozen=True)
class Culprit:
    """A unit (and, for a repo, the first bad commit) found guilty, as the run presents it
    (one per unit of the engine's ``search.Isolation``)."""

    unit: Unit
    commit: str | None = None
    good_median: float | None = None  # the evidence: good state without it ...
    bad_median: float | None = None  # ... and with it (alone on top of good)
    together_with: tuple[str, ...] = ()  # other units of an interaction
    details: tuple[str, ...] = ()  # what it changed: content diff, commits, versions
    good_trial: int | None = None  # the trial numbers of the evidence
    bad_trial: int | None = None
    hunk: HunkCulprit | None = None  # a file in a repo: its first bad version and hunk
    # A package unit: the torch stack's guilty component, the first bad release.
    within: PackageFinding | None = None
    why: tuple[str, ...] = ()  # the facts that differ, good vs bad (envbisect.model.facts)

    def changes(self) -> list[dict[str, Any]]:
        from envbisect.render.diff import show_value

        out = []
        for c in self.unit.changes:
            old, new = c.old, c.new
            if c.section == "git" and self.commit:
                new = self.commit
            out.append({"key": c.key, "old": show_value(old), "new": show_value(new)})
        return out


@dataclass(frozen=True)
class RunResult:
    """What a bisection found."""

    outcome: str  # found | ambiguous | not-reproduced | unfaithful | aborted
    threshold: float | None
    culprits: tuple[Culprit, ...]
    trials: tuple[TrialRow, ...]
    diff: DiffResult
    blocked: Mapping[str, str]
    notes: tuple[str, ...]
    session: Path
    message: str
    good_path: Path
    bad_path: Path
    smoke: SmokeCommand
    good_median: float | None = None
    bad_median: float | None = None
    target_args: tuple[str, ...] = ()  # --config/--python/--via words that reproduce the run
    # What the search says beside its culprits: others remain, a state measured again.
    findings: tuple[str, ...] = ()
    threshold_source: str = "default"
    threshold_fraction: float | None = None
    noise: float | None = None  # per-sample spread (log scale) the verdicts used
    machine: Mapping[str, Any] = field(default_factory=dict)  # the report's header
    # How the report's Next reproduces a state: the target interpreter, the command's cwd,
    # the uv that built the venvs and the package sources' uv options.
    python: str | None = None
    cwd: str | None = None
    uv: str = "uv"
    uv_args: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return 0 if self.outcome == "found" and self.culprits else 1


@dataclass
class _TrialWork:
    """One trial while it runs: where, on what, and what it has gathered so far (mutable:
    runs and samples accumulate while the state is realized)."""

    state: State
    n: int
    worker: Worker | None
    cancel: threading.Event | None
    trial_dir: Path
    actuator: Actuator
    transport: Transport
    first_run: int  # more samples of a trial continue its run numbering
    samples: list[float] = field(default_factory=list)
    runs: list[RunLog] = field(default_factory=list)
    contended: list[bool] = field(default_factory=list)  # per sample
    failure: Failure | None = None
    untestable: bool = False
    notes: tuple[str, ...] = ()
    check: StateCheck | None = None

    @property
    def applied(self) -> frozenset[str]:
        return frozenset(self.state.applied)

    @property
    def positions(self) -> dict[str, int]:
        return dict(self.state.positions)

    @property
    def name(self) -> str | None:
        return self.worker.name if self.worker is not None else None

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def outcome(self) -> Outcome:
        """What the engine (or calibration, which reads samples and failure) is told."""
        crashed = self.failure is not None and self.failure.kind in CRASH_KINDS and self.runs
        return Outcome(
            samples=tuple(self.samples),
            failure=self.failure,
            untestable=self.untestable,
            worker=self.name,
            runs=len(self.runs),
            crashes=1 if crashed else 0,
            contended=tuple(self.contended),
        )


class _TrialRunner:
    """The engine's test function: realize, check, run, log; replay logged trials on resume.

    One state is one trial: more samples of a state go into the same trial number and
    directory (``run-4``, ``run-5``, ...), so ``run``, ``log``, the session directory and the
    report count trials the same way.
    """

    def __init__(
        self,
        options: RunOptions,
        session: Session,
        actuator: Actuator,
        progress: Progress,
    ) -> None:
        self.o = options
        self.session = session
        self.actuator = actuator
        self.progress = progress
        self.replay: dict[str, TrialRecord] = {}
        self.index_of: dict[str, int] = {}
        for rec in session.trials():
            self.replay[rec.key] = rec
            self.index_of[rec.key] = rec.index
        self.records: list[TrialRecord] = []
        self.n_units = 0  # the endpoints' samples come from two processes (see _sample)
        # Workers measure in threads: trial numbers, the log and the replay under one lock.
        self._lock = threading.Lock()
        self.actuators: dict[str, Actuator] = {}  # worker name -> its own (a target's)
        self.rounds: Mapping[State, int] = {}  # state -> round, filled from engine events
        # Set by envbisect.run.parallel: a worker's reading of a finished run (Slurm's reason
        # for a kill) and the Slurm allocations to cancel at the end.
        self.after_run: Callable[[Measurement, Path, Worker], Measurement] | None = None
        self.filled: set[str] = set()  # states whose warm caches a run has made (_fill)
        self.fill_writes_nothing = False  # a filling run left its cache dirs empty
        self.fill_notes: list[str] = []  # how warm caches were made, for the result
        self.allocations: Allocations | None = None
        self.endpoint_runs: dict[str, cmdcheck.RunFacts] = {}  # "good"/"bad" → a failed run

    def __call__(self, state: State, n: int) -> Outcome:
        return self.measure(state, n)

    def measure(
        self,
        state: State,
        n: int,
        worker: Worker | None = None,
        cancel: threading.Event | None = None,
        *,
        calibration: bool = False,
    ) -> Outcome:
        """``n`` samples of ``state`` (on ``worker``, when several run); logged and replayed
        as trials, except ``calibration`` runs (the caller logs those). Nothing is logged
        when ``cancel`` is set by the end: the round was abandoned (Ctrl-C)."""
        key = state_key(frozenset(state.applied), state.positions)
        logged, index = (None, 0) if calibration else self._claim(key)
        if logged is not None:
            self.progress(f"  replayed from the session log: {logged.log_dir}")
            return Outcome(
                samples=logged.samples,
                failure=logged.failure,
                untestable=logged.untestable,
                worker=logged.worker,
                runs=logged.runs,
                crashes=logged.crashes,
                contended=logged.contended,
            )
        work = self._work(
            state, n, worker, cancel, self._trial_dir(index, _worker_name(worker), calibration)
        )
        started = time.monotonic()
        with work.actuator.realize(work.applied, work.positions, work.trial_dir) as realized:
            realized = self._gather(work, realized)
            if calibration:
                return work.outcome()
            call = TrialCall(
                realized,
                work.transport,
                work.check,
                tuple(work.runs),
                time.monotonic() - started,
                work.failure,
            )
            _write_trial_log(work.trial_dir, index, sorted(work.applied), work.positions, call)
        outcome = self._log(work, key, index)
        self._endpoint_guard(work, realized)
        return outcome

    def _endpoint_guard(self, work: _TrialWork, realized: Realized) -> None:
        """Stop the run, in the command's own words, when the good endpoint cannot run the
        command or both endpoints fail the same way (``envbisect.run.cmdcheck``)."""
        if work.failure is None or work.untestable or work.positions or not work.runs:
            return
        run = _run_facts(work, realized.python, realized.origin)
        if not work.applied:
            self.endpoint_runs["good"] = run
            if cmdcheck.good_stops(run):
                raise CommandFailed(cmdcheck.message("good", run))
        elif len(work.applied) == self.n_units:
            self.endpoint_runs["bad"] = run
            if cmdcheck.no_metric(run.failure) and "good" not in self.endpoint_runs:
                raise CommandFailed(cmdcheck.message("bad", run))
        good, bad = self.endpoint_runs.get("good"), self.endpoint_runs.get("bad")
        if good is not None and bad is not None and cmdcheck.same_failure(good, bad):
            raise CommandFailed(cmdcheck.message("good", good, both=True))

    def _claim(self, key: str) -> tuple[TrialRecord | None, int]:
        """The logged trial of this state to replay, or the trial number to measure it as."""
        with self._lock:
            logged = self.replay.pop(key, None)
            if logged is not None:
                self.records.append(logged)
                return logged, 0
            known = self.index_of.get(key)
            if known is None:
                # Trials of one round are numbered before any of them is logged.
                taken = max(self.index_of.values(), default=0)
                known = max(self.session.next_trial_index(), taken + 1)
                self.index_of[key] = known
            return None, known

    def _trial_dir(self, index: int, name: str | None, calibration: bool) -> Path:
        if not calibration:
            return self.session.trial_dir(index)
        trial_dir = self.session.root / "calibration" / str(name)
        trial_dir.mkdir(parents=True, exist_ok=True)
        return trial_dir

    def _work(
        self,
        state: State,
        n: int,
        worker: Worker | None,
        cancel: threading.Event | None,
        trial_dir: Path,
    ) -> _TrialWork:
        transport = self.o.transport
        if worker is not None and worker.transport is not None:
            transport = worker.transport
        return _TrialWork(
            state=state,
            n=n,
            worker=worker,
            cancel=cancel,
            trial_dir=trial_dir,
            actuator=self.actuators.get(str(_worker_name(worker)), self.actuator),
            transport=transport,
            first_run=1 + len(list(trial_dir.glob("run-*.stdout"))),
        )

    def _gather(self, work: _TrialWork, realized: Realized) -> Realized:
        """Check the realized state, then sample it; raises KeyboardInterrupt when the round
        was abandoned meanwhile."""
        if work.worker is not None and work.worker.env:
            realized = dataclasses.replace(realized, env={**realized.env, **work.worker.env})
        work.notes = realized.notes
        if realized.failure is not None:
            failure = work.failure = Failure.of(realized.failure)
            # A state that cannot be built says nothing about speed: unresolved, never bad.
            work.untestable = failure is not None and failure.kind is FailureKind.BUILD
        else:
            check = work.check = self._check(realized, work)
            if check.error is not None:
                work.notes = (*work.notes, check.summary())
            elif not check.faithful:
                work.failure, work.untestable = Failure(check.summary()), True
        if work.failure is None and realized.fill:
            work.failure = self._fill(work, realized)
        if work.failure is None:
            endpoint = not work.applied or len(work.applied) == self.n_units
            work.failure = self._sample(work, realized, endpoint)
            # No number is no verdict (as in check), whatever --on-crash says.
            work.untestable = cmdcheck.no_metric(work.failure) and not endpoint
        if work.cancelled():
            raise KeyboardInterrupt
        return realized

    def _log(self, work: _TrialWork, key: str, index: int) -> Outcome:
        """Append the trial to the session log; one progress line."""
        rec = TrialRecord(
            index=index,
            key=key,
            applied=tuple(sorted(work.applied)),
            positions=tuple(sorted(work.positions.items())),
            samples=tuple(work.samples),
            failure=work.failure,
            log_dir=str(work.trial_dir),
            notes=work.notes,
            untestable=work.untestable,
            worker=work.name,
            round=self.rounds.get(work.state),
            runs=len(work.runs),
            crashes=work.outcome().crashes,
            contended=tuple(work.contended),
        )
        with self._lock:
            self.session.append(rec.as_event())
            self.records.append(rec)
        shown = ", ".join(
            format_ktok(s) + ("*" if busy else "")
            for s, busy in zip(
                work.samples, work.contended + [False] * len(work.samples), strict=False
            )
        )
        shown = shown or "-"
        tail = f"; {work.failure}" if work.failure else ""
        if any(work.contended):
            tail += "; * other processes loaded the machine"
        on = f" on {work.name}" if work.name else ""
        self.progress(f"  {shown} Ktok/s{tail}{on}  [log {work.trial_dir}]")
        return work.outcome()

    def _check(self, realized: Realized, work: _TrialWork) -> StateCheck:
        """Snapshot the realized state and compare it with good + the applied units."""
        actuator = work.actuator
        values = actuator.state_values(work.applied, work.positions)
        where = {k: realized.map_argv([k])[0] for (_s, k) in values}
        expected = expected_facts(actuator.good, actuator.bad, values, where)
        remote = bool(work.transport.layers)
        via = _far_transport(work.transport, realized.env) if remote else work.transport
        return check_state(
            transport=via,
            python=realized.python,
            env=None if remote else realized.env,
            expected=expected,
            log_dir=work.trial_dir,
        )

    def _sample(self, work: _TrialWork, realized: Realized, endpoint: bool) -> Failure | None:
        """Fill ``work.samples`` up to ``work.n``: one process gives as many timed windows as
        asked (a command that reports one figure gives one); returns the failure, if any.

        Windows of one process vary less than processes do (on the H200 0.2% against a few
        percent), and the noise model is pooled from these samples: the endpoints, which
        set the noise and the default threshold, take theirs from two processes, so the
        between-process spread is in the estimate. Every other state costs one process."""
        n, samples = work.n, work.samples
        per_run = -(-n // 2) if endpoint and n > 1 else n
        k = work.first_run - 1
        # A log with a throughput per step gives all n in one process: an endpoint still
        # takes a second one.
        while len(samples) < n or (endpoint and n > 1 and k - work.first_run < 1):
            if work.cancelled():
                raise KeyboardInterrupt
            k += 1
            m = self._run(work, realized, f"run-{k}", max(1, min(per_run, n - len(samples))))
            if not m.ok:
                return m.failure
            samples.extend(m.samples)
        return None

    def _fill(self, work: _TrialWork, realized: Realized) -> Failure | None:
        """Make the warm caches whose recorded content is gone: run the state once into
        their empty dirs (the built-in drafter with one drafter thread: compiling in threads
        is what races), once per trial; its runs then measure with what that run compiled."""
        key = state_key(work.applied, work.state.positions)
        if key in self.filled:
            return None
        names = ", ".join(realized.fill)
        if self.fill_writes_nothing:
            # An earlier filling run left its dirs empty: the command keeps no compile cache
            # there, so a run now would make exactly the empty dir the state already has.
            self.progress(f"  caches {names}: warm is the empty dir (the command writes none)")
            return None
        smoke, how = self.o.smoke, "one run of this state's command"
        if smoke.builtin:
            params = {**smoke.drafter_params, "drafter_threads": 1}
            smoke, how = replace(smoke, drafter_params=params), "one single-threaded run"
        m = run_once(smoke, self._spec(work, realized, "fill", samples=1))
        if not m.ok:
            return Failure.build(f"caches {names}: making the warm cache failed: {m.failure}")
        wrote = _wrote_into(realized, work.transport)
        with self._lock:
            self.filled.add(key)
            self.fill_writes_nothing = wrote is False
        note = (
            f"caches {names}: the recorded warm cache is gone; warm made by {how} into an "
            "empty dir, then measured"
            + ("; it wrote nothing there, so later states skip that run" if wrote is False else "")
        )
        work.notes = (*work.notes, note)
        self.progress(f"  {note}")
        with self._lock:
            self.fill_notes.append(note)
        return None

    def _spec(self, work: _TrialWork, realized: Realized, name: str, samples: int) -> RunSpec:
        """How one process of a state runs: the state's interpreter, env and cwd, the
        command mapped into it as typed (the filling run of a warm cache too)."""
        return RunSpec(
            transport=work.transport,
            python=realized.python,
            env=realized.env,
            cwd=realized.cwd,
            timeout_s=self.o.timeout_s,
            log_dir=work.trial_dir,
            name=name,
            argv_map=realized.command_argv,
            samples=samples,
            pin=work.worker.pin_argv() if work.worker is not None else (),
        )

    def _run(self, work: _TrialWork, realized: Realized, name: str, samples: int) -> Measurement:
        spec = self._spec(work, realized, name, samples)
        if not work.transport.layers:
            # A cold cache is cold for every run, not only the trial's first: what an
            # earlier run of the trial compiled into it is removed.
            for path in realized.cold:
                _empty_dir(Path(path))
        window = None if work.transport.layers else contention.Window.start()
        m = run_once(self.o.smoke, spec, record=work.runs.append)
        if window is not None:
            # Measured here, on the machine the run used: a remote target's load is not ours.
            reading = window.finish()
            work.runs[-1] = replace(work.runs[-1], contention=reading.as_dict())
            work.contended.extend([reading.contended] * len(m.samples))
        if self.after_run is not None and work.worker is not None:
            m = self.after_run(m, work.trial_dir / f"{name}.stderr", work.worker)
        return m


def _run_facts(work: _TrialWork, python: str, origin: str | None) -> cmdcheck.RunFacts:
    """The last run of a failed trial, as ``cmdcheck`` judges it."""
    last = work.runs[-1]
    return cmdcheck.RunFacts(
        argv=last.launch.argv,
        cwd=last.cwd,
        interpreter=python,
        started=last.launch.started,
        exit_status=last.launch.exit_status,
        stdout=last.launch.stdout.decode("utf-8", "replace"),
        stderr=last.launch.stderr.decode("utf-8", "replace"),
        failure=Failure.of(work.failure) or Failure.crash("?"),
        log_dir=work.trial_dir,
        origin=origin,
    )


def _wrote_into(realized: Realized, transport: Transport) -> bool | None:
    """Whether the filling run put files into the cache dirs it filled; None when they are
    on a remote target (not looked at from here)."""
    if transport.layers:
        return None
    dirs = [Path(realized.env[CACHE_ENV[name]]) for name in realized.fill]
    return any(path.is_dir() and any(path.iterdir()) for path in dirs)


def _empty_dir(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
        path.mkdir()


def _worker_name(worker: Worker | None) -> str | None:
    """A worker's name; None for the target itself (no workers)."""
    return worker.name if worker is not None else None


TRIAL_LOG = "trial.json"


def env_diff(env: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, Any]:
    """How ``env`` differs from ``base`` (default: this process's environment, i.e. the
    user's): variables set or changed, and unset; values redacted as in manifests."""
    base = os.environ if base is None else base
    return {
        "set": {k: redact_value(k, v) for k, v in sorted(env.items()) if base.get(k) != v},
        "unset": sorted(k for k in base if k not in env),
    }


@dataclass(frozen=True)
class TrialCall:
    """One call of a trial's test function (more samples of a state add a call): how it
    ran, for ``trial.json``."""

    realized: Realized
    transport: Transport
    check: StateCheck | None
    runs: tuple[RunLog, ...]
    wall_s: float
    failure: Failure | None

    def as_dict(self) -> dict[str, Any]:
        realized, python = self.realized, self.realized.python
        return {
            "interpreter": python,
            "interpreter_resolved": os.path.realpath(python) if not self.transport.layers else None,
            "venv": str(realized.venv) if realized.venv else None,
            "cwd": str(realized.cwd) if realized.cwd else None,
            "via": [layer.describe() for layer in self.transport.layers],
            "env_diff": env_diff(realized.env),
            "state_check": self.check.as_dict() if self.check is not None else None,
            "build_failure": realized.failure,
            "runs": [run.as_dict() for run in self.runs],
            "wall_s": round(self.wall_s, 3),
            "failure": self.failure,
        }


def _write_trial_log(
    trial_dir: Path, index: int, applied: list[str], positions: Mapping[str, int], call: TrialCall
) -> None:
    """``trials/NNN/trial.json``: how the trial ran, one entry per call, so an odd number
    can be traced to its argv, cwd, interpreter and environment."""
    import json

    path = trial_dir / TRIAL_LOG
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {"trial": index, "applied": applied, "positions": dict(positions), "calls": []}
    doc["calls"].append(call.as_dict())
    # Secret-shaped text anywhere (an argv --token, a failure line) is masked too.
    mf.atomic_write_text(path, json.dumps(redact_tree(doc), indent=2, default=str) + "\n")


def load_states(
    options: RunOptions, session_root: Path, progress: Progress
) -> tuple[mf.Manifest, mf.Manifest, Path]:
    """The good manifest, and the bad one (a fresh snapshot saved in the session by default)."""
    good = mf.load(options.good)
    if options.bad is not None:
        return good, mf.load(options.bad), options.bad
    saved = session_root / "bad.yaml"
    if saved.exists():
        return good, mf.load(saved), saved
    from envbisect.snapshot import take_snapshot

    progress("taking a snapshot of the current state (the bad side) …")
    config = options.config
    if config is None:
        from envbisect.model.config import Config

        config = Config.load(cwd=options.cwd)
    snap = take_snapshot(config, options.transport, options.python, label="bad")
    session_root.mkdir(parents=True, exist_ok=True)
    from envbisect.model.trust import sign

    mf.save(sign(snap), saved)
    return good, mf.load(saved), saved


def run_bisect(options: RunOptions, progress: Progress = _quiet) -> RunResult:
    """The whole of ``envbisect run``: endpoints, search, culprit; the machine left as it was."""
    from envbisect.diff import diff_manifests

    session = _open_session(options)
    try:
        good, bad, bad_path = load_states(options, session.root, progress)
    except BaseException as exc:
        session.append({"type": "end", "outcome": "error", "message": str(exc)})
        session.unlock()
        raise
    data_map = dict(getattr(options.config, "data_map", {}) or {})
    diff = diff_manifests(good, bad, data_map=data_map)
    _guard(options, session, good, bad, diff, progress)
    actuator = _actuator(options, good, bad, diff, session, progress)
    atexit.register(_quietly, actuator.restore)
    tester: _TrialRunner | None = None
    try:
        context = _RunContext.start(diff, session, options, bad_path, bad, actuator, progress)
        units = [u.id for u in diff.units if u.bisectable and u.id not in context.blocked]
        ordered = actuator.ordered()
        tester = _TrialRunner(options, session, actuator, progress)
        tester.n_units = len(units)
        if not units:
            return _nothing_to_bisect(context, actuator)
        _check_sources(options, actuator, diff, context.blocked, progress)
        result = _search(context, tester, units, {u: ordered[u] for u in units if u in ordered})
        hunk, hunk_rows = _hunk_step(result, context, tester)
        within, within_rows = _package_step(result, context, tester)
    except EnvBisectError as exc:
        # e.g. uv missing: nothing to resume from; leave no worktree behind (here or there).
        _abandon(
            session, actuator, tester, {"type": "end", "outcome": "error", "message": str(exc)}
        )
        raise
    except KeyboardInterrupt:
        _abandon(session, actuator, tester, {"type": "interrupted"})
        raise Interrupted(
            f"interrupted; files restored, session saved in {session.root} "
            "(continue with 'envbisect run --resume', clean up with 'envbisect reset')"
        ) from None
    finally:
        _quietly(actuator.restore)  # first: it reports files kept as the user edited them
        session.journal.restore()
        atexit.unregister(_quietly)
    out = _with_hunk(_result(result, context, tester.index_of), hunk, hunk_rows)
    out = _with_within(out, within, within_rows)
    if tester.fill_notes:  # how warm was made, said once in the report and --json
        out = replace(out, notes=(*out.notes, *dict.fromkeys(tester.fill_notes)))
    if actuator.kept:  # files the user edited while the run went on: said again at the end
        out = replace(out, notes=(*out.notes, *actuator.kept))
    session.append(
        {
            "type": "end",
            "outcome": out.outcome,
            "culprits": [c.unit.id for c in out.culprits],
            "message": out.message,
            "trials": [t.as_dict() for t in out.trials],
        }
    )
    actuator.close()
    _close_workers(tester)
    session.unlock()
    return out


def _guard(
    options: RunOptions,
    session: Session,
    good: mf.Manifest,
    bad: mf.Manifest,
    diff: DiffResult,
    progress: Progress,
) -> None:
    """What the manifests may touch and run, checked before the first trial (a refusal ends
    the session as refused)."""
    from envbisect.model.guard import check_run

    try:
        for line in check_run(
            options.config,
            good,
            bad,
            diff,
            trusted=options.trust,
            local=not options.transport.layers,
        ):
            progress(f"note: {line}")
    except EnvBisectError as exc:
        session.append({"type": "end", "outcome": "refused", "message": str(exc)})
        session.unlock()
        raise


def _check_sources(
    options: RunOptions,
    actuator: Actuator,
    diff: DiffResult,
    blocked: Mapping[str, str],
    progress: Progress,
) -> None:
    """SourcesMissing before the first trial when a package version either endpoint's state
    needs is in none of the configured sources (``envbisect.realize.precheck``)."""
    from envbisect.realize.precheck import check_sources, check_sources_on_target, package_needs

    needs = package_needs(actuator.good, actuator.bad, diff.units, blocked)
    if not needs:
        return
    target = actuator.target()
    installed = {name: str(d.get("version")) for name, d in target.dists.items()}
    if actuator.remote:
        # The sources' paths, network and uv cache are the target's: its uv is asked.
        far_uv = target.uv
        if far_uv is None:
            return  # said by the first state that needs a venv
        log = actuator.session.root / "remote"

        def ask(batch: list[list[Any]]) -> list[list[str]]:
            params = {"uv": list(far_uv), "python": target.python, "needs": batch}
            return list(actuator.agent("available", params, log, "sources")["missing"])

        check_sources_on_target(
            needs,
            actuator.package_sources(),
            installed=installed,
            ask=ask,
            config_path=getattr(options.config, "path", None),
        )
        return
    try:
        uv: str | None = actuator.uv_path()
    except ActuationError:
        uv = None  # said by the first state that needs it
    check_sources(
        needs,
        actuator.package_sources(),
        installed=installed,
        python=target.version,
        uv=uv,
        config_path=getattr(options.config, "path", None),
    )


def _open_session(options: RunOptions) -> Session:
    """The session, resumed or started. Manifests given by path are checked before a session
    exists: a typo must not leave an unfinished session behind."""
    mf.load(options.good)
    if options.bad is not None:
        mf.load(options.bad)
    if options.resume:
        return Session.resume(options.session_dir)
    header = {
        "good": str(options.good),
        "bad": str(options.bad) if options.bad else None,
        "threshold": options.goal.value,
        "threshold_fraction": options.goal.fraction,
        "threshold_source": options.goal.source,
        "smoke": list(options.smoke.argv),
        "repeats": options.repeats,
        "on_crash": options.on_crash,
    }
    return Session.start(options.session_dir, header, fresh=options.fresh)


def _actuator(
    options: RunOptions,
    good: mf.Manifest,
    bad: mf.Manifest,
    diff: DiffResult,
    session: Session,
    progress: Progress,
) -> Actuator:
    """The actuator that realizes this run's states, as envbisect.yaml configures it."""
    config = options.config
    return Actuator(
        good=good,
        bad=bad,
        units=diff.units,
        session=session,
        python=options.python,
        transport=options.transport,
        sources=Sources.from_config(config),
        data_map=dict(getattr(config, "data_map", {}) or {}),
        blob_dirs=(config.blobs_dir,) if config is not None else (),
        cwd=options.cwd,
        on_note=lambda line: progress(f"note: {line}"),
    )


def _search(
    context: _RunContext,
    tester: _TrialRunner,
    units: list[str],
    ordered: Mapping[str, Sequence[str]],
) -> SearchResult:
    """The engine over ``units``, one trial at a time or on the run's workers."""
    options, session, progress = context.options, context.session, tester.progress
    events = _Progress(progress, session, tester)
    on_event: Callable[[Event], None] = events
    pool: WorkerPool | None = None
    if options.workers:
        from envbisect.run.parallel import prepare

        pool = prepare(
            options.workers,
            tester=tester,
            actuator=tester.actuator,
            units=units,
            diff=context.diff,
            options=options,
            session=session,
            progress=progress,
        )
        on_event = _both(pool.progress, events)
    settings = options.search_settings(ordered, len(pool.workers) if pool is not None else 1)
    result = search(units, tester, settings, progress=on_event, test_many=pool)
    if result.interrupted:
        raise KeyboardInterrupt
    return result


def _step_settings(result: SearchResult, context: _RunContext, tester: _TrialRunner) -> Any:
    """How a step below the engine measures (``hunkrun.HunkSettings``): as the engine did,
    within what is left of ``--max-trials``; None when nothing is left."""
    from envbisect.search.hunkrun import HunkSettings

    o = context.options
    if o.max_trials is not None and len(tester.index_of) >= o.max_trials:
        return None
    bad_end = result.trials[1] if len(result.trials) > 1 else None
    return HunkSettings(
        repeats=o.repeats,
        max_samples=o.max_samples,
        budget=None if o.max_trials is None else o.max_trials - len(tester.index_of),
        crash_is_bad=o.on_crash == "bad" and bad_end is not None and bool(bad_end.failure),
    )


def _hunk_step(
    result: SearchResult, context: _RunContext, tester: _TrialRunner
) -> tuple[HunkCulprit | None, tuple[TrialRow, ...]]:
    """A guilty file inside a repo, narrowed to its first bad version: which hunk of it
    (``bisect.hunkrun``); its trials as rows, their verdicts logged as the engine's are."""
    from envbisect.search.hunkrun import find_hunk

    settings = _step_settings(result, context, tester)
    if settings is None:
        return None, ()

    def number(state: State) -> int:
        return tester.index_of.get(state_key(state.applied, state.positions), 0)

    hunk, trials = find_hunk(result, tester.actuator, tester, settings, tester.progress, number)
    return hunk, _step_rows(trials, context, number)


def _package_step(
    result: SearchResult, context: _RunContext, tester: _TrialRunner
) -> tuple[tuple[PackageFinding, ...], tuple[TrialRow, ...]]:
    """Guilty torch stacks and packages: their component, then their first bad release
    (``bisect.pkgrun``); the trials as rows, their verdicts logged as the engine's are."""
    from envbisect.search.pkgrun import find_within

    settings = _step_settings(result, context, tester)
    if settings is None:
        return (), ()

    def number(state: State) -> int:
        return tester.index_of.get(state_key(state.applied, state.positions), 0)

    act = tester.actuator
    releases, resolve = _releases(act), _resolver(act)
    found = find_within(result, act, tester, settings, tester.progress, number, releases, resolve)
    rows = tuple(
        row for f in found for row in _step_rows(f.trials, context, number, dict(f.labels))
    )
    return found, rows


def _releases(actuator: Actuator) -> Releases:
    """The releases of a package that the run's package sources hold (final ones, with a
    wheel that fits the target's python)."""
    from envbisect.model.listing import available_versions

    def releases(name: str) -> list[Any]:
        sources = replace(actuator.package_sources(), target_python=actuator.target().version)
        return available_versions(name, sources)

    return releases


def _resolver(actuator: Actuator) -> Resolve | None:
    """What a release of torch pins, resolved by uv against the run's package sources for
    the target's python (None: no uv here)."""
    from envbisect.model.sources import uv_args
    from envbisect.search.pkgrun import uv_resolver

    try:
        uv = actuator.uv_path()
    except EnvBisectError:
        return None
    return uv_resolver(uv, uv_args(actuator.package_sources()), actuator.target().version)


def _step_rows(
    trials: Sequence[HunkTrial],
    context: _RunContext,
    number: Callable[[State], int],
    labels: Mapping[State, str] | None = None,
) -> tuple[TrialRow, ...]:
    """The trials of a step below the engine as rows (``labels``: what a state's position
    stands for, shown instead of it); their verdicts logged."""
    rows = []
    for t in trials:
        n = number(t.state)
        applied = _applied_names(t.state.applied, t.state.positions)
        if labels and t.state in labels:
            at = dict(t.state.positions)
            applied = tuple(
                f"{u}[{labels[t.state]}]" if u in at else u for u in sorted(t.state.applied)
            )
        rows.append(
            TrialRow(
                index=n,
                applied=applied,
                samples=t.samples,
                median=median(t.samples) if t.samples else None,
                verdict=t.verdict.value,
                failure=t.failure,
                purpose=t.purpose,
            )
        )
        context.session.append(
            {"type": "verdict", "index": n, "verdict": t.verdict.value, "median": rows[-1].median}
        )
    return tuple(rows)


def _with_within(
    out: RunResult, within: Sequence[PackageFinding], rows: tuple[TrialRow, ...]
) -> RunResult:
    """The run's result with the package step's trials and each finding on its culprit."""
    if not within:
        return out
    by_unit = {f.unit: f for f in within}
    culprits = tuple(
        replace(c, within=by_unit[c.unit.id]) if c.unit.id in by_unit else c for c in out.culprits
    )
    return replace(out, culprits=culprits, trials=out.trials + rows)


def _with_hunk(out: RunResult, hunk: HunkCulprit | None, rows: tuple[TrialRow, ...]) -> RunResult:
    """The run's result with the hunk search's trials and the hunk on its culprit."""
    if not rows and hunk is None:
        return out
    culprits = tuple(
        replace(c, hunk=hunk, commit=hunk.version.item if hunk.version.committed else None)
        if hunk is not None and c.unit.id == hunk.unit
        else c
        for c in out.culprits
    )
    return replace(out, culprits=culprits, trials=out.trials + rows)


def _both(first: Callable[[Event], None], then: Callable[[Event], None]) -> Callable[[Event], None]:
    def both(event: Event) -> None:
        first(event)
        then(event)

    return both


def _abandon(
    session: Session, actuator: Actuator, tester: _TrialRunner | None, event: dict[str, Any]
) -> None:
    """A run that ends early (an error, Ctrl-C): nothing left behind, ``event`` logged."""
    _quietly(actuator.close)
    _close_workers(tester)
    session.append(event)
    session.unlock()


def _close_workers(tester: _TrialRunner | None) -> None:
    """Close the actuators of workers with a target of their own (worktrees, files, remote
    session dirs there) and cancel their Slurm jobs."""
    for act in tester.actuators.values() if tester is not None else ():
        _quietly(act.close)
    if tester is not None and tester.allocations is not None:
        tester.allocations.cancel_all()


def _quietly(undo: Callable[[], Any]) -> None:
    """Run a cleanup on an exit path, where a second error must not hide the first (a
    remote target that went away: ``envbisect reset`` retries later)."""
    with contextlib.suppress(EnvBisectError):
        undo()


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _cpu_threads(
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
    if want == "off" or options.smoke.builtin or options.transport.layers:
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
        mine = [v for v in THREAD_VARS if v in os.environ]
        gpus = (bad.section("gpu") or {}).get("devices")
        if reading is None or mine or gpus or not reading.contended:
            return None
        n = contention.free_cores(reading)
        if n >= reading.cores:
            return None
        why = (
            f"{reading.cores - n} of {reading.cores} cores busy at the start: torch would "
            "otherwise wait on a busy core at every parallel op; --cpu-threads N to choose, "
            "--cpu-threads off to leave it"
        )
    else:
        n = int(want)
        why = "--cpu-threads"
    actuator.base_env = {**os.environ, **dict.fromkeys(THREAD_VARS, str(n))}
    return f"every trial runs with OMP_NUM_THREADS={n} and MKL_NUM_THREADS={n} ({why})"


@dataclass(frozen=True)
class _RunContext:
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
    ) -> _RunContext:
        """The run's context; says what will not be bisected, and why, and the notes."""
        blocked = actuator.blockers()
        notes = tuple(actuator.notes())
        for unit in diff.units:
            if not unit.bisectable:
                progress(f"not bisected: {unit.title}: {unit.reason}")
            elif unit.id in blocked:
                # The actuator's reason already starts with the section and key.
                progress(f"not bisected: {blocked[unit.id]}")
        for note in notes:
            progress(f"note: {note}")
        reading = None if options.transport.layers else contention.probe()
        busy = None if reading is None else contention.busy_warning(reading)
        if busy is not None:  # said once; each trial's samples are flagged on their own
            progress(f"warning: {busy}")
            notes = (*notes, f"at the start: {busy}")
        threads = _cpu_threads(options, reading, diff, bad, actuator)
        if threads is not None:
            progress(f"note: {threads}")
            notes = (*notes, threads)
        return cls(diff, blocked, notes, session, options, bad_path, bad, actuator)

    def result(self, *, outcome: str, threshold: float | None, message: str) -> RunResult:
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
            target_args=_target_args(self.options),
            threshold_source=self.options.goal.source,
            threshold_fraction=self.options.goal.fraction,
            machine=machine_facts(self.bad, self.options),
            python=self.options.python,
            cwd=str(self.options.cwd or Path.cwd()),
            uv=_uv_word(self.actuator),
            uv_args=tuple(
                uv_args(
                    self.actuator.package_sources()
                    if self.actuator is not None
                    else Sources.from_config(self.options.config)
                )
            ),
        )


def _uv_word(actuator: Actuator | None) -> str:
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


def _nothing_to_bisect(context: _RunContext, actuator: Actuator) -> RunResult:
    session = context.session
    outcome = "not-reproduced"
    if not context.diff.units:
        why = "the manifests are identical"
    elif context.blocked:
        # The good state cannot be built at all: nothing about the cause is known.
        outcome = "unfaithful"
        why = "the good state cannot be realized: " + "; ".join(
            context.blocked[u] for u in sorted(context.blocked)
        )
    else:
        why = "no change can be realized"
    session.append({"type": "end", "outcome": outcome, "culprits": [], "message": why})
    actuator.close()
    session.unlock()
    return context.result(
        outcome=outcome,
        threshold=context.options.goal.value,
        message=f"nothing to bisect: {why}",
    )


def _unfaithful_good(
    outcome: str, message: str, result: SearchResult, blocked: Mapping[str, str]
) -> tuple[str, str]:
    """A good endpoint that is not clearly fast while changes that could not be realized
    stayed in their bad form is no evidence that "the cause is outside the recorded
    software" or that the regression "does not reproduce": the cause may be exactly one of
    those changes. Say so instead of "not reproduced". (A bad endpoint that runs fast is a
    real answer: it is the bad state as it is.)"""
    if outcome != "not-reproduced" or not blocked or not result.trials:
        return outcome, message
    ends = {t.state.applied: t for t in result.trials[:2]}
    good = ends.get(frozenset())
    bad = next((t for a, t in ends.items() if a), None)
    if good is None or good.verdict.value == "good" or (bad and bad.verdict.value == "good"):
        return outcome, message
    reasons = "; ".join(blocked[u] for u in sorted(blocked))
    return "unfaithful", (
        "the good state could not be realized faithfully: these changes stayed as in the "
        f"bad state ({reasons}); with them in place it did not run clearly faster than the "
        "bad state, so the cause is probably among them — make them realizable and run again"
    )


def _details(unit: Unit, commit: str | None, context: _RunContext) -> tuple[str, ...]:
    """What the culprit changed, shown (content diff, commits, versions); never fails."""
    from envbisect.run.explain import details

    actuator = context.actuator
    if actuator is None:
        return ()
    try:
        return details(
            unit,
            commit,
            good=actuator.good,
            bad=actuator.bad,
            blob=actuator._blob,
            local=not context.options.transport.layers,
        )
    except (OSError, ValueError) as exc:
        return (f"(cannot show the change: {exc})",)


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


def _threshold_hint(result: SearchResult, options: RunOptions) -> str:
    """When a given threshold does not separate endpoints that differ by more than the
    noise, the threshold that would: midway (geometric) between their medians."""
    if options.goal.value is None and options.goal.fraction is None:
        return ""
    ends = result.trials[:2]
    if len(ends) < 2 or any(t.failure or not t.samples for t in ends):
        return ""
    good, bad = (ends[0], ends[1]) if not ends[0].state.applied else (ends[1], ends[0])
    g, b = median(good.samples), median(bad.samples)
    noise = Noise(sigma=result.noise or 0.03, dof=1)
    se = math.hypot(noise.median_se(len(good.samples)), noise.median_se(len(bad.samples)))
    if math.log(g) - math.log(b) <= max(0.05, 3 * se):
        return ""
    mid = math.sqrt(g * b)
    return (
        f"; the endpoints themselves differ (good {format_ktok(g)}, bad {format_ktok(b)} "
        f"Ktok/s): a threshold of {format_tok(mid)} would separate them"
    )


def outlier(
    samples: Sequence[float],
    good: Sequence[float],
    bad: Sequence[float],
    sigma: float,
) -> str | None:
    """Why a state's speed is itself a finding, or None: faster than the good endpoint or
    slower than the bad one by more than the noise (z = 3 on the medians' difference, at
    least 5%). Nothing in between the endpoints explains such a state: look at its log."""
    if not samples or not good:
        return None
    noise = Noise(sigma=sigma, dof=1)
    m = median(samples)

    def beyond(ref: Sequence[float]) -> float:
        se = math.hypot(noise.median_se(len(samples)), noise.median_se(len(ref)))
        return max(0.05, 3 * se)

    g = median(good)
    if math.log(m) - math.log(g) > beyond(good):
        return f"{m / g:.2f}× faster than the good state"
    if bad:
        b = median(bad)
        if b > 0 and math.log(b) - math.log(m) > beyond(bad):
            return f"{b / m:.2f}× slower than the bad state"
    return None


def _trial_number(trial: Trial, numbers: Mapping[str, int]) -> int:
    """The session's number of the engine's trial (its own index when not logged)."""
    return numbers.get(state_key(trial.state.applied, trial.state.positions), trial.index)


class _Progress:
    """The engine's progress events as lines, numbered as the session numbers trials; every
    verdict is logged (``envbisect log`` prints what ``run`` printed) and outliers flagged."""

    def __init__(self, out: Progress, session: Session, tester: _TrialRunner) -> None:
        self.out = out
        self.session = session
        self.tester = tester
        self.samples: dict[frozenset[str], tuple[float, ...]] = {}
        self.all: frozenset[str] | None = None
        self.groups: dict[int, tuple[float, ...]] = {}

    def number(self, trial: Trial) -> int:
        return _trial_number(trial, self.tester.index_of)

    def __call__(self, event: Event) -> None:
        message = event.message
        trial = event.trial
        if trial is not None:
            number = self.number(trial)
            prefix = f"trial {trial.index}"
            if message.startswith(prefix):
                message = f"trial {number}" + message[len(prefix) :]
            if event.kind is EventKind.TRIAL_FINISHED:
                flag = self._finished(trial, number)
                if flag:
                    message += f" — outlier: {flag}; see its trial.json"
        left = f" (about {event.trials_left} trials left)" if event.trials_left is not None else ""
        self.out(f"{message}{left}")

    def _finished(self, trial: Trial, number: int) -> str | None:
        """Log the trial's verdict; its outlier flag, if any."""
        if trial.index == 2 and not trial.state.positions:
            self.all = trial.state.applied
        if not trial.failure:
            self.groups[number] = tuple(trial.samples)
        if not trial.state.positions:
            self.samples[trial.state.applied] = tuple(trial.samples)
        endpoint = not trial.state.applied or trial.state.applied == self.all
        flag = None
        if not endpoint and not trial.failure:
            sigma = Noise.from_groups(self.groups.values()).sigma
            bad = self.samples.get(self.all) if self.all is not None else None
            flag = outlier(trial.samples, self.samples.get(frozenset(), ()), bad or (), sigma)
        self.session.append(
            {
                "type": "verdict",
                "index": number,
                "verdict": trial.verdict.value,
                "median": trial.median,
                "outlier": flag,
            }
        )
        return flag


def _result(result: SearchResult, context: _RunContext, numbers: Mapping[str, int]) -> RunResult:
    """The run's result from the engine's: the outcome as users read it, the culprits with
    their evidence and details, the trial table numbered as the session numbers trials."""
    outcome, message = _unfaithful_good(
        result.outcome.value, result.message or "", result, context.blocked
    )
    if outcome == "not-reproduced":
        message += _threshold_hint(result, context.options)
    culprits, notes = _culprits(result, context, numbers)
    session = context.session
    rows = tuple(
        replace(r, facts=probed.trial_facts(session.trial_dir(r.index)))
        for r in _rows(result, numbers)
    )
    culprits = tuple(replace(c, why=_why(c, rows)) for c in culprits)
    full = {u for t in result.trials for u in t.state.applied}
    bad_med = next(
        (t.median for t in result.trials if t.state.applied == full and not t.state.positions),
        None,
    )
    failed = _failed_confirmation(result, culprits, numbers) if outcome == "found" else None
    if failed is not None:
        outcome, message, culprits = "unconfirmed", failed, ()
    return replace(
        context.result(outcome=outcome, threshold=result.threshold, message=message),
        culprits=culprits,
        trials=rows,
        notes=(*context.notes, *notes),
        findings=result.notes,
        good_median=next((r.median for r in rows if not r.applied), None),
        bad_median=bad_med,
        noise=result.noise,
    )


def _failed_confirmation(
    result: SearchResult, culprits: Sequence[Culprit], numbers: Mapping[str, int]
) -> str | None:
    """Why no culprit may be named although one was isolated: the state with everything but
    it gave no number (a crash, no metric), so nothing shows that reverting it restores
    speed. None when every culprit's confirmation ran."""
    full = frozenset(u for t in result.trials for u in t.state.applied)
    by_state = {t.state.applied: t for t in result.trials if not t.state.positions}
    for c in culprits:
        units = frozenset([c.unit.id, *c.together_with])
        without = by_state.get(full - units)
        if without is None or not without.failure or not (full - units):
            continue
        return (
            f"{' + '.join(sorted(units))} looked guilty, but the confirmation with everything "
            f"but it (trial {_trial_number(without, numbers)}) failed ({without.failure}): "
            "no culprit is named; see that trial's log"
        )
    return None


def _culprits(
    result: SearchResult, context: _RunContext, numbers: Mapping[str, int]
) -> tuple[tuple[Culprit, ...], tuple[str, ...]]:
    """One Culprit per unit the engine isolated (a repo's at its first bad commit), and a
    note for each repo whose first bad commit is one of several."""
    units = {u.id: u for u in context.diff.units}
    culprits: list[Culprit] = []
    notes: list[str] = []
    for found in result.culprits:
        narrowed = {n.unit: n for n in found.narrowed}
        for unit_id in found.units:
            commit = None
            n = narrowed.get(unit_id)
            if n is not None and n.first_bad is not None:
                commit = n.items[0]  # items holds the commits at the candidate positions
            elif n is not None:
                shown = ", ".join(i[:12] for i in n.items)
                notes.append(f"{unit_id}: the first bad commit is one of {shown}")
            evidence = n.evidence if n is not None and n.evidence is not None else found.alone
            culprits.append(
                Culprit(
                    units[unit_id],
                    commit,
                    good_median=evidence.good.median,
                    bad_median=evidence.bad.median,
                    together_with=tuple(u for u in found.units if u != unit_id),
                    details=_details(units[unit_id], commit, context),
                    good_trial=_trial_number(evidence.good, numbers),
                    bad_trial=_trial_number(evidence.bad, numbers),
                )
            )
    return tuple(culprits), tuple(notes)


def _why(culprit: Culprit, rows: Sequence[TrialRow]) -> tuple[str, ...]:
    """The facts of the culprit's evidence trials that differ, good vs bad."""
    by_index = {r.index: r.facts for r in rows}
    if culprit.good_trial is None or culprit.bad_trial is None:
        return ()
    return explain_facts(by_index.get(culprit.good_trial), by_index.get(culprit.bad_trial))


def _rows(result: SearchResult, numbers: Mapping[str, int]) -> tuple[TrialRow, ...]:
    """The trial table; a state faster than good or slower than bad is flagged."""
    good_t = next((t for t in result.trials if not t.state.applied), None)
    full_t = result.trials[1] if len(result.trials) > 1 else None
    sigma = result.noise or 0.03

    def flag(t: Trial) -> str | None:
        if t.failure or t is good_t or t is full_t or good_t is None:
            return None
        bad_samples = full_t.samples if full_t is not None and not full_t.failure else ()
        return outlier(t.samples, good_t.samples, bad_samples, sigma)

    return tuple(TrialRow.of(t, _trial_number(t, numbers), flag(t)) for t in result.trials)


def _target_args(options: RunOptions) -> tuple[str, ...]:
    """The words that point a re-run at the same config, target python and layer chain."""
    words: list[str] = []
    path = getattr(options.config, "path", None)
    if path:
        words += ["--config", str(path)]
    words += ["--python", options.python]
    for layer in options.transport.layers:
        words += ["--via", layer.describe()]
    return tuple(words)


def good_command_line(options: RunOptions) -> str:
    """``run --print-command``: the whole command the good state runs — its cwd, how its
    environment differs from this one, its interpreter and argv as mapped into the state
    (worktree paths are where the run makes them). Nothing is realized."""
    import shlex

    from envbisect.diff import diff_manifests

    good = mf.load(options.good)
    saved = options.session_dir / "bad.yaml"
    bad_path = options.bad or (saved if saved.exists() else None)
    bad = mf.load(bad_path) if bad_path is not None else good
    data_map = dict(getattr(options.config, "data_map", {}) or {})
    diff = diff_manifests(good, bad, data_map=data_map)
    act = _actuator(options, good, bad, diff, Session(options.session_dir), _quiet)
    plan = act.preview(frozenset(), options.session_dir / "trials" / "001")
    if plan.failure:
        raise UsageError(f"the good state cannot be realized: {plan.failure}")
    changed = env_diff(plan.env)
    words = ["env", *(w for k in changed["unset"] for w in ("-u", k))]
    words += [f"{k}={v}" for k, v in changed["set"].items()]
    command = shlex.join([*words, *plan.command_argv(options.smoke.argv)])
    cwd = plan.cwd or options.cwd or Path.cwd()
    return f"cd {shlex.quote(str(cwd))} && {command}"


def validate_options(options: RunOptions) -> None:
    """Bad combinations → UsageError (before anything runs)."""
    argv = options.smoke.argv
    if argv and not options.transport.layers and not _findable(argv[0], options):
        raise UsageError(f"smoke command {argv[0]!r}: no such program (on PATH or as a file)")
    if options.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    if options.on_crash not in ("bad", "skip"):
        raise UsageError("--on-crash must be 'bad' or 'skip'")
    if options.timeout_s <= 0:
        raise UsageError("--timeout must be positive")
    if options.resume and options.fresh:
        raise UsageError("--resume and --fresh exclude each other: continue or replace")
    if options.max_trials is not None and options.max_trials < 2:
        raise UsageError("--max-trials must be at least 2 (the two endpoints come first)")


def _findable(program: str, options: RunOptions) -> bool:
    if os.sep in program:
        base = options.cwd or Path.cwd()
        return (base / program).exists()
    path = os.environ.get("PATH", "")
    if os.path.isabs(options.python):
        path = str(Path(options.python).parent) + os.pathsep + path
    return shutil.which(program, path=path) is not None
