"""A trial: the engine's test function (``TrialRunner``) realizes a state, checks it, runs
the smoke command as the engine asks and logs it before the engine sees it (``--resume``
replays logged trials). One state is one trial: more samples go into its number and dir.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from envbisect.model.events import TrialRecord
from envbisect.model.failure import CRASH_KINDS, Failure, FailureKind
from envbisect.model.kernels import ProfileRequest
from envbisect.model.metric import Measurement, figure_unit, ktok_list
from envbisect.model.session import Session, state_key
from envbisect.model.steps import describe_timing
from envbisect.realize.actuate import Actuator, Realized
from envbisect.realize.faithful import StateCheck, check_state, expected_facts
from envbisect.run import cmdcheck, contention, dataread, interrupt, probed, together
from envbisect.run.compilecache import CacheUse, CompileCaches, with_cache
from envbisect.run.launch import RunLog, RunSpec, SmokeCommand, far_transport, form_note, run_once
from envbisect.run.options import RunOptions
from envbisect.run.progress import Progress
from envbisect.run.triallog import TrialCall, read_timing, write_trial_log
from envbisect.search import Outcome, State
from envbisect.sections.caches import CACHE_ENV
from envbisect.transport import Transport

if TYPE_CHECKING:
    from envbisect.run.slurm import Allocations
    from envbisect.run.workers import Worker

# Runs a warm cache's filling may take when an empty cache makes the command crash.
FILL_TRIES = 5

# A worker's reading of a finished run: its measurement, its stderr log, the worker.
AfterRun = Callable[[Measurement, Path, "Worker"], Measurement]


@dataclass
class TrialWork:
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
    index: int = 0  # the trial's number (0: calibration)
    fill_s: float = 0.0  # making a warm cache (TrialRunner._fill)
    compile_cache: CacheUse | None = None  # the shared compile cache it ran with
    together: bool = False  # ``n`` processes at once, for a crash rate (no samples)
    crashes: int = 0  # of the processes run together, those that crashed
    data: tuple[dataread.DataExpect, ...] = ()  # its datasets, whose reads the probe proves

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
        return interrupt.pending() or (self.cancel is not None and self.cancel.is_set())

    def outcome(self) -> Outcome:
        """What the engine (or calibration, which reads samples and failure) is told."""
        crashed = self.failure is not None and self.failure.kind in CRASH_KINDS and self.runs
        out = Outcome(
            samples=tuple(self.samples),
            failure=self.failure,
            untestable=self.untestable,
            worker=self.name,
            runs=len(self.runs),
            crashes=1 if crashed else 0,
            contended=tuple(self.contended),
        )
        # Processes at once for a crash rate: each crash counts; no figure was kept.
        return replace(out, crashes=self.crashes, rate_only=True) if self.together else out


class TrialRunner:
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
        *,
        n_units: int = 0,
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
        self.n_units = n_units  # which states are endpoints (_sample, _endpoint_guard)
        # Workers measure in threads: trial numbers, the log and the replay under one lock.
        self._lock = threading.Lock()
        self.actuators: dict[str, Actuator] = {}  # worker name -> its own (a target's)
        self.rounds: Mapping[State, int] = {}  # state -> round, filled from engine events
        # Set by use_workers: a worker's reading of a finished run (Slurm's reason for a
        # kill) and the Slurm allocations to cancel at the end.
        self.after_run: AfterRun | None = None
        self.filled: set[str] = set()  # states whose warm caches a run has made (_fill)
        self.fill_writes_nothing = False  # a filling run left its cache dirs empty
        self.fill_notes: list[str] = []  # how warm caches were made, for the result
        self.allocations: Allocations | None = None
        self.guard = cmdcheck.EndpointGuard()
        self.at_once = together.RunsAtOnce.for_run(options, progress)
        self.form_said = False  # how the command's figure is read, said at its first run
        # Trials whose compiled code is the same share one warm compile cache (never when
        # a cache is itself a unit of the difference: envbisect.run.compilecache).
        self.compile_caches = CompileCaches.for_run(
            session.root, getattr(actuator, "units", ()), bool(options.transport.layers)
        )

    def __call__(self, state: State, n: int) -> Outcome:
        return self.measure(state, n)

    def together(self, state: State, runs: int) -> Outcome:
        """The engine's ``test_rate``: ``runs`` processes at once (``run.together``)."""
        return self.measure(state, runs, together=True)

    def use_workers(self, *, after_run: AfterRun, allocations: Allocations) -> None:
        """Measure on workers (``envbisect.run.parallel``): ``after_run`` reads a worker's
        finished run; ``allocations`` are the Slurm jobs to cancel when the run ends."""
        self.after_run = after_run
        self.allocations = allocations

    def add_actuators(self, actuators: Mapping[str, Actuator]) -> None:
        """The actuators of workers with a target of their own, by worker name (the other
        workers share this runner's)."""
        self.actuators.update(actuators)

    def replay_as_good_endpoint(self, worker: str) -> None:
        """The search replays ``worker``'s trial of the good state as its good endpoint
        (rather than measuring it again): calibration measured it."""
        key = state_key((), ())
        with self._lock:
            for rec in reversed(self.records):
                if rec.key == key and rec.worker == worker:
                    self.records.remove(rec)
                    self.replay[key] = rec
                    return

    def measure(
        self,
        state: State,
        n: int,
        worker: Worker | None = None,
        cancel: threading.Event | None = None,
        *,
        calibration: bool = False,
        together: bool = False,
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
                rate_only=together,
            )
        work = self._work(
            state, n, worker, cancel, self._trial_dir(index, _worker_name(worker), calibration)
        )
        work.index = index
        work.together = together
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
                fill_s=work.fill_s,
                compile_cache=work.compile_cache.as_dict() if work.compile_cache else None,
            )
            write_trial_log(work.trial_dir, index, sorted(work.applied), work.positions, call)
        outcome = self._log(work, key, index)
        self._endpoint_guard(work, realized)
        return outcome

    def profile(self, state: State, label: str, request: ProfileRequest) -> Path:
        """One run of ``state`` under the profiler (``run --profile``, once the culprit is
        confirmed): realized and filled as a trial is, not logged as one; its logs, facts and
        Chrome trace in the session's ``profile/<label>``. Returns that directory."""
        log_dir = self.session.root / "profile" / label
        log_dir.mkdir(parents=True, exist_ok=True)
        work = self._work(state, 1, None, None, log_dir)
        with work.actuator.realize(work.applied, work.positions, log_dir) as realized:
            failure = realized.failure
            if failure is None and realized.fill:
                failure = self._fill(work, realized)
            if failure is None:
                spec = replace(self._spec(work, realized, "profile", 1), profile=request)
                run_once(self.o.smoke, spec)
        return log_dir

    def _endpoint_guard(self, work: TrialWork, realized: Realized) -> None:
        """Stop the run, in the command's own words, when the good endpoint cannot run the
        command or both endpoints fail the same way (``cmdcheck.EndpointGuard``)."""
        if work.untestable or work.positions or not work.runs:
            return
        full = len(work.applied) == self.n_units
        side = "good" if not work.applied else "bad" if full else None
        if side is not None:
            failed = None
            if work.failure is not None:
                failed = _run_facts(work, realized.python, realized.origin)
            self.guard.saw(side, len(work.runs), failed)

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
    ) -> TrialWork:
        transport = self.o.transport
        if worker is not None and worker.transport is not None:
            transport = worker.transport
        return TrialWork(
            state=state,
            n=n,
            worker=worker,
            cancel=cancel,
            trial_dir=trial_dir,
            actuator=self.actuators.get(str(_worker_name(worker)), self.actuator),
            transport=transport,
            first_run=1 + len(list(trial_dir.glob("run-*.stdout"))),
        )

    def _gather(self, work: TrialWork, realized: Realized) -> Realized:
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
            values = work.actuator.state_values(work.applied, work.positions)
            work.data = dataread.expected(values, work.actuator.good, work.actuator.bad, realized)
        if work.failure is None:
            realized = self._share_compile_cache(work, realized)
        if work.failure is None and realized.fill:
            filling = time.monotonic()
            work.failure = self._fill(work, realized)
            work.fill_s = time.monotonic() - filling
            # A warm cache that cannot be made is a state not realized as recorded: its own
            # finding (the empty cache's crash rate), never "the good state fails here too".
            work.untestable = work.failure is not None
        if work.failure is None and work.together:
            work.failure = self._sample_together(work, realized)
        elif work.failure is None:
            work.failure = self._sample(work, realized)
            if work.compile_cache is not None:
                facts = [run.launch.facts for run in work.runs]
                self.compile_caches.learn(work.compile_cache, facts)
            # No number is no verdict (as in check), whatever --on-crash says; an endpoint's
            # is the endpoints' to judge. A unit applied at a position (a commit, a release)
            # is no endpoint, even with one unit.
            full = len(work.applied) == self.n_units and not work.positions
            endpoint = not work.applied or full
            unfaithful = str(work.failure).startswith(dataread.UNFAITHFUL)
            work.untestable = (cmdcheck.no_metric(work.failure) and not endpoint) or unfaithful
        if work.cancelled():
            raise KeyboardInterrupt
        return realized

    def _share_compile_cache(self, work: TrialWork, realized: Realized) -> Realized:
        """The state's realized env with the shared compile cache its code keys to (none
        on a remote worker, or when caches are units of the difference)."""
        if work.transport.layers or not self.compile_caches.enabled or self.o.smoke.builtin:
            return realized  # the built-in drafter: its caches are its own params' business
        values = work.actuator.state_values(work.applied, work.positions)
        packages = {k: v for (sec, k), (_m, v) in values.items() if sec == "packages"}
        files = [realized.map_argv([k])[0] for (sec, k) in values if sec == "files"]
        use = self.compile_caches.choose(
            realized, self.o.smoke.argv, packages, files, work.index or None
        )
        work.compile_cache = use
        return with_cache(realized, use)

    def _log(self, work: TrialWork, key: str, index: int) -> Outcome:
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
            self.session.append(rec)
            self.records.append(rec)
        shown = ktok_list(work.samples, work.contended)
        tail = f"; {work.failure}" if work.failure else ""
        if any(work.contended):
            tail += "; * other processes loaded the machine"
        on = f" on {work.name}" if work.name else ""
        self.progress(f"  {shown} {figure_unit()}{tail}{on}  [log {work.trial_dir}]")
        timing = read_timing(work.trial_dir)
        if timing is not None and work.runs:
            self.progress(f"    time: {describe_timing(timing)}")
        return work.outcome()

    def _check(self, realized: Realized, work: TrialWork) -> StateCheck:
        """Snapshot the realized state and compare it with good + the applied units."""
        actuator = work.actuator
        values = actuator.state_values(work.applied, work.positions)
        where = {k: realized.map_argv([k])[0] for (_s, k) in values}
        expected = expected_facts(actuator.good, actuator.bad, values, where)
        remote = bool(work.transport.layers)
        via = (
            far_transport(work.transport, realized.env, realized.pinned_env)
            if remote
            else work.transport
        )
        return check_state(
            transport=via,
            python=realized.python,
            env=None if remote else realized.env,
            expected=expected,
            log_dir=work.trial_dir,
        )

    def _sample(self, work: TrialWork, realized: Realized) -> Failure | None:
        """Fill ``work.samples`` up to ``work.n``: one process gives as many timed windows as
        asked (a command that reports one figure gives one); returns the failure, if any.

        Every state costs one process (issue 32: endpoints measured once unless noise calls
        for more). Windows of one process vary less than processes do (on the H200 0.2%
        against a few percent): the endpoint phase takes a second process of the good state
        when the endpoints are close enough for that spread to matter
        (``search.endpoints.FAR_APART``), and a state inside the noise band gets more samples
        from a new one. A process that compiled inside its timed part gives its figure over
        all of it as its one sample (``model.steps.compiled_in_windows``), and ends the
        trial's sampling."""
        n, samples = work.n, work.samples
        k = work.first_run - 1
        while len(samples) < n:
            if work.cancelled():
                raise KeyboardInterrupt
            k += 1
            m = self._run(work, realized, f"run-{k}", max(1, n - len(samples)))
            if not m.ok:
                return m.failure
            samples.extend(m.samples)
            if m.result.get("compiled_in_windows"):
                # Its one figure (compiling included) is what the state costs: another
                # process would compile again, not sample noise. More only if noise asks.
                break
        return None

    def _sample_together(self, work: TrialWork, realized: Realized) -> Failure | None:
        """``work.n`` processes at once (``run.together``); ``work.crashes`` counts those
        that crashed. Returns the first crash (else the first other failure, else None)."""
        names = [f"run-{work.first_run + i}" for i in range(work.n)]
        for path in realized.cold:  # a local target (options): its caches are at hand
            together.empty_dir(Path(path))
        copies = work.trial_dir / "together"
        specs = [self._spec(work, realized, name, 1) for name in names]
        specs = [replace(s, env=together.own_caches(s.env, copies / s.name)) for s in specs]
        try:
            logs, found = self.at_once.run(self.o.smoke, specs)
        finally:
            shutil.rmtree(copies, ignore_errors=True)
        work.runs.extend(logs)
        failures = [m.failure for m in found if not m.ok and m.failure]
        crashes = [f for f in failures if f.kind in CRASH_KINDS]
        work.crashes = len(crashes)
        return next(iter(crashes or failures), None)

    def _fill(self, work: TrialWork, realized: Realized) -> Failure | None:
        """Make the warm caches whose recorded content is gone: run the state into their
        empty dirs, once per trial, with compiles kept apart (the built-in drafter with one
        drafter thread; a Python command under the probe, which lets one thread trace or
        compile at a time): threads compiling at once on an empty cache is the field's race.
        A run that crashes anyway is tried again, up to ``FILL_TRIES`` runs; the crashes are
        said as the empty cache's own rate. The trial's runs then measure warm."""
        key = state_key(work.applied, work.state.positions)
        if key in self.filled:
            return None
        names = ", ".join(realized.fill)
        if self.fill_writes_nothing:
            # An earlier filling run left its dirs empty: the command keeps no compile cache
            # there, so a run now would make exactly the empty dir the state already has.
            self.progress(f"  caches {names}: warm is the empty dir (the command writes none)")
            return None
        smoke, how = self._fill_command()
        crashed: list[Failure] = []
        while True:
            name = "fill" if not crashed else f"fill-{len(crashed) + 1}"
            spec = replace(self._spec(work, realized, name, samples=1), serialize_compiles=True)
            m = run_once(smoke, spec)
            if m.ok or m.failure is None or m.failure.kind not in CRASH_KINDS:
                break
            crashed.append(m.failure)
            if len(crashed) >= FILL_TRIES:
                break
            self.progress(f"  caches {names}: the filling run crashed ({m.failure}); again")
        rate = f"{len(crashed)} of {len(crashed) + (1 if m.ok else 0)}"
        if not m.ok:
            why = (
                f"an empty cache makes this command crash {rate} times ({crashed[0]})"
                if crashed
                else f"making the warm cache failed: {m.failure}"
            )
            return Failure.build(f"caches {names}: {why}, even with {how}")
        wrote = _wrote_into(realized, work.transport)
        with self._lock:
            self.filled.add(key)
            self.fill_writes_nothing = wrote is False
        note = (
            f"caches {names}: the recorded warm cache is gone; warm made by {how} into an "
            "empty dir, then measured"
            + (f" (an empty cache crashed it {rate} times first: {crashed[0]})" if crashed else "")
            + ("; it wrote nothing there, so later states skip that run" if wrote is False else "")
        )
        work.notes = (*work.notes, note)
        self.progress(f"  {note}")
        with self._lock:
            self.fill_notes.append(note)
        return None

    def _fill_command(self) -> tuple[SmokeCommand, str]:
        """What makes a warm cache, and how it is said: the built-in drafter with one drafter
        thread; a Python command under the probe with its compiles serialized; anything
        else as typed."""
        smoke = self.o.smoke
        if smoke.builtin:
            params = {**smoke.drafter_params, "drafter_threads": 1}
            return replace(smoke, drafter_params=params), "one single-threaded run"
        if smoke.probe and probed.wrap(smoke.argv, None).probed:
            return smoke, "one run of this state's command, its compiles one thread at a time"
        return smoke, "one run of this state's command"

    def _spec(self, work: TrialWork, realized: Realized, name: str, samples: int) -> RunSpec:
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
            hang_s=self.o.hang_after_s or None,
            pinned_env=realized.pinned_env,
            watch=dataread.watch(work.data),
        )

    def _run(self, work: TrialWork, realized: Realized, name: str, samples: int) -> Measurement:
        spec = self._spec(work, realized, name, samples)
        if not work.transport.layers:
            # A cold cache is cold for every run, not only the trial's first: what an
            # earlier run of the trial compiled into it is removed.
            for path in realized.cold:
                together.empty_dir(Path(path))
        window = None if work.transport.layers else contention.Window.start()
        m = run_once(self.o.smoke, spec, record=work.runs.append)
        self.at_once.saw(work.runs[-1])
        m, read = dataread.judged(m, work.data, work.runs[-1].launch.facts)
        work.notes = tuple(dict.fromkeys((*work.notes, *read)))
        if not self.form_said and (note := form_note(m)):
            self.form_said = True
            self.progress(note)
        if window is not None:
            # Measured here, on the machine the run used: a remote target's load is not ours.
            reading = window.finish()
            work.runs[-1] = replace(work.runs[-1], contention=reading.as_dict())
            work.contended.extend([reading.contended] * len(m.samples))
        if self.after_run is not None and work.worker is not None:
            m = self.after_run(m, work.trial_dir / f"{name}.stderr", work.worker)
        return m


def _run_facts(work: TrialWork, python: str, origin: str | None) -> cmdcheck.RunFacts:
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


def _worker_name(worker: Worker | None) -> str | None:
    """A worker's name; None for the target itself (no workers)."""
    return worker.name if worker is not None else None
