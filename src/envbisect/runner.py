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
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbisect import manifest as mf
from envbisect.agent.bundle import build_bundle, find_frame
from envbisect.bisect.actuate import Actuator, Realized
from envbisect.bisect.session import Session, TrialRecord, state_key
from envbisect.errors import EnvBisectError, Interrupted, TransportError, UsageError
from envbisect.metric import (
    RESULT_ENV,
    SAMPLES_ENV,
    Measurement,
    MetricSpec,
    format_ktok,
    measure,
)
from envbisect.transport import Layer, LayerKind, Transport

DRAFTER = "envbisect.smoke.drafter"

Progress = Callable[[str], None]


def _quiet(_line: str) -> None:
    return None


# ----------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class SmokeCommand:
    """What a trial runs: a user argv (after ``--``) or, when ``argv`` is empty, the drafter."""

    argv: tuple[str, ...] = ()
    metric: MetricSpec | None = None
    drafter_params: Mapping[str, Any] = field(default_factory=lambda: {"preset": "auto"})

    @property
    def builtin(self) -> bool:
        return not self.argv

    def describe(self) -> str:
        if self.builtin:
            preset = self.drafter_params.get("preset", "auto")
            return f"built-in drafter smoke test (preset {preset})"
        import shlex

        return shlex.join(self.argv)


def run_once(
    smoke: SmokeCommand,
    *,
    transport: Transport,
    python: str,
    env: Mapping[str, str] | None,
    cwd: Path | None,
    timeout_s: float,
    log_dir: Path,
    name: str,
    argv_map: Callable[[Sequence[str]], list[str]] | None = None,
    samples: int = 1,
) -> Measurement:
    """Run the smoke command once and read its throughput (never raises for a bad run).

    ``samples`` timed windows are asked of the one process (the built-in drafter through its
    params, any other command through ``$ENVBISECT_SAMPLES``): one start, one warm-up."""
    log_dir.mkdir(parents=True, exist_ok=True)
    result_file = log_dir / f"{name}.result.json"
    if result_file.exists():
        result_file.unlink()
    run_env = dict(env if env is not None else os.environ)
    run_env[SAMPLES_ENV] = str(samples)
    remote = bool(transport.layers)
    if not remote:
        run_env[RESULT_ENV] = str(result_file)  # a path on this machine: not for a far side
    # Through layers the local environment only reaches the first hop: the state's
    # variables ride in an innermost env layer instead.
    via = _far_transport(transport, run_env) if remote else transport
    if smoke.builtin:
        params = {"samples": samples, **dict(smoke.drafter_params)}
        bundle = build_bundle(DRAFTER, params, deadline_s=timeout_s)
        res = via.run(
            [python, "-"],
            stdin=bundle.source,
            timeout_s=timeout_s + 5,
            log_dir=log_dir,
            env=None if remote else run_env,
            cwd=None if remote else cwd,
            name=name,
        )
        frame = find_frame(res.stdout(), bundle.nonce)
        if frame is not None and "__agent_error__" in frame:
            return Measurement(None, f"crash: {frame['__agent_error__']}", "frame")
    else:
        argv = list(argv_map(smoke.argv) if argv_map else smoke.argv)
        if remote and cwd is not None:
            argv = ["sh", "-c", 'cd "$0" && exec "$@"', str(cwd), *argv]
        try:
            res = via.run(
                argv,
                timeout_s=timeout_s,
                log_dir=log_dir,
                env=None if remote else run_env,
                cwd=None if remote else cwd,
                name=name,
            )
        except TransportError as exc:
            # e.g. the state's PATH has no such program: this state cannot run the command.
            return Measurement(None, f"crash: {exc}", None)
        frame = None
    return measure(
        stdout=res.stdout(),
        stderr=res.stderr_path.read_bytes(),
        returncode=res.returncode,
        timed_out=res.timed_out,
        timeout_s=timeout_s,
        result_file=None if transport.layers else result_file,
        frame=frame,
        spec=smoke.metric,
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
    failure: str | None
    log_dir: Path | None

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def verdict(self) -> str:
        if self.failure is not None or self.median is None:
            return "skip"
        return "good" if self.median >= self.threshold else "bad"

    @property
    def exit_code(self) -> int:
        return {"good": 0, "bad": 1}.get(self.verdict, 125)


def check(
    smoke: SmokeCommand,
    *,
    threshold: float,
    transport: Transport,
    python: str,
    repeats: int = 1,
    timeout_s: float = 600,
    log_root: Path | None = None,
) -> CheckResult:
    """Measure the current state ``repeats`` times; logs kept only when something failed."""
    log_dir = Path(tempfile.mkdtemp(prefix="envbisect-check-", dir=log_root))
    samples: list[float] = []
    failure: str | None = None
    k = 0
    while len(samples) < repeats:
        k += 1
        m = run_once(
            smoke,
            transport=transport,
            python=python,
            env=None,
            cwd=None,
            timeout_s=timeout_s,
            log_dir=log_dir,
            name=f"run-{k}",
            samples=repeats - len(samples),
        )
        if not m.ok:
            failure = m.failure
            break
        samples.extend(m.samples)
    if failure is None:
        shutil.rmtree(log_dir, ignore_errors=True)
        return CheckResult(threshold, tuple(samples), None, None)
    return CheckResult(threshold, tuple(samples), failure, log_dir)


# ----------------------------------------------------------------------------- run


@dataclass(frozen=True)
class RunOptions:
    """Everything ``envbisect run`` was asked to do."""

    good: Path
    bad: Path | None
    threshold: float | None
    smoke: SmokeCommand
    python: str
    transport: Transport = field(default_factory=Transport)
    session_dir: Path = Path(".envbisect/session")
    resume: bool = False
    repeats: int = 3
    max_samples: int = 9
    max_trials: int | None = None
    timeout_s: float = 600
    on_crash: str = "bad"
    config: Any = None  # envbisect.config.Config
    cwd: Path | None = None


@dataclass(frozen=True)
class TrialRow:
    """One row of the trial table."""

    index: int
    applied: tuple[str, ...]
    samples: tuple[float, ...]
    median: float | None
    verdict: str
    failure: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "applied": list(self.applied),
            "samples": [round(s, 3) for s in self.samples],
            "median": None if self.median is None else round(self.median, 3),
            "verdict": self.verdict,
            "failure": self.failure,
        }


@dataclass(frozen=True)
class Culprit:
    """A unit (and, for a repo, the first bad commit) found guilty."""

    unit: Any  # envbisect.diff.Unit
    commit: str | None = None
    good_median: float | None = None  # the evidence: good state without it ...
    bad_median: float | None = None  # ... and with it (alone on top of good)
    together_with: tuple[str, ...] = ()  # other units of an interaction

    def changes(self) -> list[dict[str, Any]]:
        from envbisect.render import show_value

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

    outcome: str  # found | ambiguous | not-reproduced | aborted
    threshold: float | None
    culprits: tuple[Culprit, ...]
    trials: tuple[TrialRow, ...]
    diff: Any  # envbisect.diff.DiffResult
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

    @property
    def exit_code(self) -> int:
        return 0 if self.outcome == "found" and self.culprits else 1


class _TrialRunner:
    """The engine's test function: realize, run, log; replay logged trials on resume."""

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
        self.replay: dict[str, list[TrialRecord]] = {}
        for rec in session.trials():
            self.replay.setdefault(rec.key, []).append(rec)
        self.records: list[TrialRecord] = []
        self.n_units = 0  # the endpoints' samples come from two processes (see _sample)

    def __call__(self, state: Any, n: int) -> Any:
        from envbisect.bisect.search import Outcome

        applied = frozenset(state.applied)
        positions = dict(getattr(state, "positions", ()) or ())
        key = state_key(applied, positions.items())
        logged = self.replay.get(key)
        if logged:
            rec = logged.pop(0)
            self.records.append(rec)
            self.progress(f"  replayed from the session log: {rec.log_dir}")
            return Outcome(samples=rec.samples, failure=rec.failure)
        index = self.session.next_trial_index()
        trial_dir = self.session.trial_dir(index)
        samples: list[float] = []
        failure: str | None = None
        notes: tuple[str, ...] = ()
        with self.actuator.realize(applied, positions, trial_dir) as realized:
            notes = realized.notes
            if realized.failure is not None:
                failure = realized.failure
            else:
                endpoint = not applied or len(applied) == self.n_units
                failure = self._sample(realized, trial_dir, n, samples, endpoint)
        rec = TrialRecord(
            index=index,
            key=key,
            applied=tuple(sorted(applied)),
            positions=tuple(sorted(positions.items())),
            samples=tuple(samples),
            failure=failure,
            log_dir=str(trial_dir),
            notes=notes,
        )
        self.session.append(rec.as_event())
        self.records.append(rec)
        shown = ", ".join(format_ktok(s) for s in samples) or "-"
        tail = f"; {failure}" if failure else ""
        self.progress(f"  {shown} Ktok/s{tail}  [log {trial_dir}]")
        return Outcome(samples=tuple(samples), failure=failure)

    def _sample(
        self, realized: Realized, trial_dir: Path, n: int, samples: list[float], endpoint: bool
    ) -> str | None:
        """Fill ``samples`` up to ``n``: one process gives as many timed windows as asked (a
        command that reports one figure gives one); returns the failure, if any.

        Windows of one process vary less than processes do (on the H200 0.2% against a few
        percent), and the noise model is pooled from these samples: the endpoints, which
        set the noise and the default threshold, take theirs from two processes, so the
        between-process spread is in the estimate. Every other state costs one process."""
        per_run = -(-n // 2) if endpoint and n > 1 else n
        k = 0
        while len(samples) < n:
            k += 1
            m = self._run(realized, trial_dir, f"run-{k}", min(per_run, n - len(samples)))
            if not m.ok:
                return m.failure
            samples.extend(m.samples)
        return None

    def _run(self, realized: Realized, trial_dir: Path, name: str, samples: int) -> Measurement:
        return run_once(
            self.o.smoke,
            transport=self.o.transport,
            python=realized.python,
            env=realized.env,
            cwd=realized.cwd,
            timeout_s=self.o.timeout_s,
            log_dir=trial_dir,
            name=name,
            argv_map=realized.map_argv,
            samples=samples,
        )


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
    from envbisect.collect import take_snapshot

    progress("taking a snapshot of the current state (the bad side) …")
    config = options.config
    if config is None:
        from envbisect.config import Config

        config = Config.load(cwd=options.cwd)
    snap = take_snapshot(config, options.transport, options.python, label="bad")
    session_root.mkdir(parents=True, exist_ok=True)
    mf.save(snap, saved)
    return good, mf.load(saved), saved


def run_bisect(options: RunOptions, progress: Progress = _quiet) -> RunResult:
    """The whole of ``envbisect run``: endpoints, search, culprit; the machine left as it was."""
    from envbisect.bisect.search import search
    from envbisect.diff import diff_manifests

    root = options.session_dir
    header = {
        "good": str(options.good),
        "bad": str(options.bad) if options.bad else None,
        "threshold": options.threshold,
        "smoke": list(options.smoke.argv),
        "repeats": options.repeats,
        "on_crash": options.on_crash,
    }
    # Manifests given by path are checked before a session exists: a typo must not leave
    # an unfinished session behind.
    mf.load(options.good)
    if options.bad is not None:
        mf.load(options.bad)
    session = Session.resume(root) if options.resume else Session.start(root, header)
    try:
        good, bad, bad_path = load_states(options, session.root, progress)
    except BaseException as exc:
        session.append({"type": "end", "outcome": "error", "message": str(exc)})
        session.unlock()
        raise
    diff = diff_manifests(good, bad)
    config = options.config
    actuator = Actuator(
        good=good,
        bad=bad,
        units=diff.units,
        session=session,
        python=options.python,
        transport=options.transport,
        index_url=getattr(config, "index_url", None),
        extra_index_urls=tuple(getattr(config, "extra_index_urls", ()) or ()),
        find_links=tuple(getattr(config, "find_links", ()) or ()),
        data_map=dict(getattr(config, "data_map", {}) or {}),
        cwd=options.cwd,
    )
    restore = actuator.restore
    atexit.register(_quietly, restore)
    try:
        blocked = actuator.blockers()
        notes = tuple(actuator.notes())
        units = [u.id for u in diff.units if u.bisectable and u.id not in blocked]
        for unit in diff.units:
            if not unit.bisectable:
                progress(f"not bisected: {unit.title}: {unit.reason}")
            elif unit.id in blocked:
                # The actuator's reason already starts with the section and key.
                progress(f"not bisected: {blocked[unit.id]}")
        for note in notes:
            progress(f"note: {note}")
        ordered = actuator.ordered()
        tester = _TrialRunner(options, session, actuator, progress)
        tester.n_units = len(units)
        context = _RunContext(diff, blocked, notes, session, options, bad_path)
        if not units:
            return _nothing_to_bisect(context, actuator)
        result = search(
            units,
            tester,
            threshold=options.threshold,
            repeats=options.repeats,
            max_samples=options.max_samples,
            max_trials=options.max_trials,
            ordered={u: ordered[u] for u in units if u in ordered},
            on_failure=options.on_crash,
            progress=lambda ev: progress(_event_text(ev)),
        )
        if result.interrupted:
            raise KeyboardInterrupt
    except EnvBisectError as exc:
        # e.g. uv missing: nothing to resume from; leave no worktree behind (here or there).
        _quietly(actuator.close)
        session.append({"type": "end", "outcome": "error", "message": str(exc)})
        session.unlock()
        raise
    except KeyboardInterrupt:
        _quietly(actuator.close)
        session.append({"type": "interrupted"})
        session.unlock()
        raise Interrupted(
            f"interrupted; files restored, session saved in {session.root} "
            "(continue with 'envbisect run --resume', clean up with 'envbisect reset')"
        ) from None
    finally:
        session.journal.restore()
        _quietly(actuator.restore)
        atexit.unregister(_quietly)
    out = _result(result, context)
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
    session.unlock()
    return out


def _quietly(undo: Callable[[], Any]) -> None:
    """Run a cleanup on an exit path, where a second error must not hide the first (a
    remote target that went away: ``envbisect reset`` retries later)."""
    with contextlib.suppress(EnvBisectError):
        undo()


@dataclass(frozen=True)
class _RunContext:
    """What every RunResult of a run carries besides its outcome: the diff, the units that
    could not be realized, notes, the session, and the endpoints, smoke and target."""

    diff: Any  # envbisect.diff.DiffResult
    blocked: Mapping[str, str]
    notes: tuple[str, ...]
    session: Session
    options: RunOptions
    bad_path: Path

    def result(
        self,
        *,
        outcome: str,
        threshold: float | None,
        message: str,
        culprits: tuple[Culprit, ...] = (),
        trials: tuple[TrialRow, ...] = (),
        notes: tuple[str, ...] | None = None,
        good_median: float | None = None,
        bad_median: float | None = None,
    ) -> RunResult:
        """This run's RunResult; ``notes``, when given, replaces the context's notes."""
        return RunResult(
            outcome=outcome,
            threshold=threshold,
            culprits=culprits,
            trials=trials,
            diff=self.diff,
            blocked=dict(self.blocked),
            notes=self.notes if notes is None else notes,
            session=self.session.root,
            message=message,
            good_path=self.options.good,
            bad_path=self.bad_path,
            smoke=self.options.smoke,
            good_median=good_median,
            bad_median=bad_median,
            target_args=_target_args(self.options),
        )


def _nothing_to_bisect(context: _RunContext, actuator: Actuator) -> RunResult:
    session = context.session
    why = "the manifests are identical" if not context.diff.units else "no change can be realized"
    session.append({"type": "end", "outcome": "not-reproduced", "culprits": [], "message": why})
    actuator.close()
    session.unlock()
    return context.result(
        outcome="not-reproduced",
        threshold=context.options.threshold,
        message=f"nothing to bisect: {why}",
    )


def _event_text(event: Any) -> str:
    left = f" (about {event.trials_left} trials left)" if event.trials_left is not None else ""
    return f"{event.message}{left}"


def _result(result: Any, context: _RunContext) -> RunResult:
    outcome = result.outcome.value
    notes = context.notes
    units = {u.id: u for u in context.diff.units}
    culprits: list[Culprit] = []
    for c in result.culprits:
        narrowed = {n.unit: n for n in c.narrowed}
        for unit_id in c.units:
            commit = None
            n = narrowed.get(unit_id)
            if n is not None and n.first_bad is not None:
                commit = n.items[0]  # items holds the commits at the candidate positions
            elif n is not None:
                shown = ", ".join(i[:12] for i in n.items)
                notes = (*notes, f"{unit_id}: the first bad commit is one of {shown}")
            evidence = n.evidence if n is not None and n.evidence is not None else c.alone
            culprits.append(
                Culprit(
                    units[unit_id],
                    commit,
                    good_median=evidence.good.median,
                    bad_median=evidence.bad.median,
                    together_with=tuple(u for u in c.units if u != unit_id),
                )
            )
    rows = tuple(
        TrialRow(
            index=t.index,
            applied=tuple(
                f"{u}@{dict(t.state.positions)[u]}" if u in dict(t.state.positions) else u
                for u in sorted(t.state.applied)
            ),
            samples=tuple(t.samples),
            median=t.median,
            verdict=t.verdict.value,
            failure=t.failure,
        )
        for t in result.trials
    )
    good_med = next((r.median for r in rows if not r.applied), None)
    full = {u for t in result.trials for u in t.state.applied}
    bad_med = next(
        (t.median for t in result.trials if t.state.applied == full and not t.state.positions),
        None,
    )
    return context.result(
        outcome=outcome,
        threshold=result.threshold,
        message=str(getattr(result, "message", "") or ""),
        culprits=tuple(culprits),
        trials=rows,
        notes=notes,
        good_median=good_med,
        bad_median=bad_med,
    )


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


def _findable(program: str, options: RunOptions) -> bool:
    if os.sep in program:
        base = options.cwd or Path.cwd()
        return (base / program).exists()
    path = os.environ.get("PATH", "")
    if os.path.isabs(options.python):
        path = str(Path(options.python).parent) + os.pathsep + path
    return shutil.which(program, path=path) is not None
