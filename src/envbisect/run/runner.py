"""``envbisect run`` as a core function: diff → units → engine search → trials → result.

Nothing here prints. Progress goes to an injected callback (one line per event); the
commands render the returned ``RunResult``. ``run_bisect`` orchestrates: the session, the
endpoints, the checks before the first trial, the search (one trial at a time, or on the
run's workers through ``envbisect.run.parallel``), the steps below the engine (hunks,
packages), and the clean-up that leaves the machine as it was on every path.
"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from envbisect.model import manifest as mf
from envbisect.model.errors import ActuationError, EnvBisectError, Interrupted
from envbisect.model.events import EndEvent, InterruptedEvent, SessionEvent
from envbisect.model.history import HunkCulprit
from envbisect.model.session import Session, state_key
from envbisect.model.sources import uv_args
from envbisect.realize.actuate import Actuator
from envbisect.run.context import RunContext
from envbisect.run.convert import run_result, step_rows, with_hunk, with_within
from envbisect.run.endpoints import load_states, make_actuator
from envbisect.run.options import RunOptions
from envbisect.run.profiling import profile_culprit
from envbisect.run.progress import Progress, ProgressLines, both_handlers, quiet
from envbisect.run.result import RunOutcome, RunResult, TrialRow
from envbisect.run.trial import TrialRunner
from envbisect.search import Event, SearchResult, State, search

if TYPE_CHECKING:
    from envbisect.diff import DiffResult
    from envbisect.run.workers import WorkerPool
    from envbisect.search.pkgrun import PackageFinding
    from envbisect.search.releases import Releases, Resolve


def run_bisect(options: RunOptions, progress: Progress = quiet) -> RunResult:
    """The whole of ``envbisect run``: endpoints, search, culprit; the machine left as it was."""
    from envbisect.diff import diff_manifests

    session = _open_session(options, progress)
    try:
        good, bad, bad_path = load_states(options, session.root, progress)
    except BaseException as exc:
        session.append(EndEvent("error", str(exc)))
        session.unlock()
        raise
    data_map = dict(getattr(options.config, "data_map", {}) or {})
    diff = diff_manifests(good, bad, data_map=data_map)
    _guard(options, session, good, bad, diff, progress)
    actuator = make_actuator(options, good, bad, diff, session, progress)
    atexit.register(_quietly, actuator.restore)
    tester: TrialRunner | None = None
    try:
        context = RunContext.start(diff, session, options, bad_path, bad, actuator, progress)
        units = [u.id for u in diff.units if u.bisectable and u.id not in context.blocked]
        ordered = actuator.ordered()
        tester = TrialRunner(options, session, actuator, progress, n_units=len(units))
        if not units:
            return _nothing_to_bisect(context, actuator)
        _check_sources(options, actuator, diff, context.blocked, progress)
        result = _search(context, tester, units, {u: ordered[u] for u in units if u in ordered})
        hunk, hunk_rows = _hunk_step(result, context, tester)
        within, within_rows = _package_step(result, context, tester)
        kernels = profile_culprit(result, tester, options.profile, progress)
    except EnvBisectError as exc:
        # e.g. uv missing: nothing to resume from; leave no worktree behind (here or there).
        _abandon(session, actuator, tester, EndEvent("error", str(exc)))
        raise
    except KeyboardInterrupt:
        _abandon(session, actuator, tester, InterruptedEvent())
        raise Interrupted(
            f"interrupted; files restored, session saved in {session.root} "
            "(continue with 'envbisect run --resume', clean up with 'envbisect reset')"
        ) from None
    finally:
        _quietly(actuator.restore)  # first: it reports files kept as the user edited them
        session.journal.restore()
        atexit.unregister(_quietly)
    out = with_hunk(run_result(result, context, tester.index_of), hunk, hunk_rows)
    out = with_within(out, within, within_rows)
    out = replace(out, kernels=kernels[0], kernels_note=kernels[1])
    if tester.fill_notes:  # how warm was made, said once in the report and --json
        out = replace(out, notes=(*out.notes, *dict.fromkeys(tester.fill_notes)))
    if actuator.kept:  # files the user edited while the run went on: said again at the end
        out = replace(out, notes=(*out.notes, *actuator.kept))
    session.append(
        EndEvent(
            out.outcome.value,
            out.message,
            culprits=[c.unit.id for c in out.culprits],
            trials=[t.as_dict() for t in out.trials],
        )
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
        session.append(EndEvent("refused", str(exc)))
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


def _open_session(options: RunOptions, progress: Progress) -> Session:
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
    session = Session.start(options.session_dir, header, fresh=options.fresh)
    if session.replaced:
        progress(f"note: {session.replaced}")
    return session


def _search(
    context: RunContext,
    tester: TrialRunner,
    units: list[str],
    ordered: Mapping[str, Sequence[str]],
) -> SearchResult:
    """The engine over ``units``, one trial at a time or on the run's workers."""
    options, session, progress = context.options, context.session, tester.progress
    events = ProgressLines(progress, session, tester.index_of, tester.at_once.expected_s)
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
        on_event = both_handlers(pool.progress, events)
    settings = options.search_settings(ordered, len(pool.workers) if pool is not None else 1)
    # Runs at once for a crash rate share this runner's machine (workers: one run each).
    at_once = pool is None and tester.at_once.enabled
    result = search(
        units,
        tester,
        settings,
        progress=on_event,
        test_many=pool,
        test_rate=tester.together if at_once else None,
        rate_width=tester.at_once.width if at_once else None,
    )
    if result.interrupted:
        raise KeyboardInterrupt
    return result


def _step_settings(result: SearchResult, context: RunContext, tester: TrialRunner) -> Any:
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
    result: SearchResult, context: RunContext, tester: TrialRunner
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
    return hunk, step_rows(trials, context, number)


def _package_step(
    result: SearchResult, context: RunContext, tester: TrialRunner
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
    rows = tuple(row for f in found for row in step_rows(f.trials, context, number, dict(f.labels)))
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
    the target's python (None: no uv here); on a remote target by the target's own uv."""
    from envbisect.search.releases import uv_resolver

    if actuator.remote:
        return _far_resolver(actuator)
    try:
        uv = actuator.uv_path()
    except EnvBisectError:
        return None
    return uv_resolver(uv, uv_args(actuator.package_sources()), actuator.target().version)


def _far_resolver(actuator: Actuator) -> Resolve | None:
    """``_resolver`` on a remote target: its uv, its view of the sources (paths, network,
    cache), as the venvs it builds see them (None: no uv there)."""
    from envbisect.snapshot.resolver import compiled_pins

    target = actuator.target()
    if target.uv is None:
        return None
    far_uv, args = list(target.uv), uv_args(actuator.package_sources())

    def resolve(requirement: str) -> Mapping[str, str]:
        params = {
            "uv": far_uv,
            "python_version": target.version,
            "requirement": requirement,
            "args": args,
        }
        got = actuator.agent("compile", params, actuator.session.root / "remote", "resolve")
        if got.get("error"):
            raise ActuationError(f"uv pip compile on the target: {got['error']} ({requirement})")
        return compiled_pins(str(got.get("stdout") or ""))

    return resolve


def _abandon(
    session: Session, actuator: Actuator, tester: TrialRunner | None, event: SessionEvent
) -> None:
    """A run that ends early (an error, Ctrl-C): nothing left behind, ``event`` logged."""
    _quietly(actuator.close)
    _close_workers(tester)
    session.append(event)
    session.unlock()


def _close_workers(tester: TrialRunner | None) -> None:
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


def _nothing_to_bisect(context: RunContext, actuator: Actuator) -> RunResult:
    session = context.session
    outcome = RunOutcome.NOT_REPRODUCED
    if not context.diff.units:
        why = "the manifests are identical"
    elif context.blocked:
        # No change can be realized here (either side's value: a commit the repo lacks, a
        # dataset gone): nothing about the cause is known.
        outcome = RunOutcome.UNFAITHFUL
        why = "no change can be realized here: " + "; ".join(
            context.blocked[u] for u in sorted(context.blocked)
        )
    else:
        why = "no change can be realized"
    session.append(EndEvent(outcome.value, why, culprits=[]))
    actuator.close()
    session.unlock()
    return context.result(
        outcome=outcome,
        threshold=context.options.goal.value,
        message=f"nothing to bisect: {why}",
    )
