"""The engine's result as a run's: the outcome as users read it, the culprits with their
evidence and details, the trial table numbered as the session numbers trials, and the
trials of the steps below the engine (hunks, packages) added."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from envbisect.model.events import VerdictEvent
from envbisect.model.facts import explain as explain_facts
from envbisect.model.history import HunkCulprit
from envbisect.model.metric import figure_unit, format_ktok, format_tok
from envbisect.run import probed
from envbisect.run.context import RunContext
from envbisect.run.options import RunOptions
from envbisect.run.result import (
    Culprit,
    RunOutcome,
    RunResult,
    TrialRow,
    TrialVerdict,
    applied_names,
    trial_number,
    trial_outlier,
)
from envbisect.run.triallog import read_timing
from envbisect.search import Evidence, Isolation, SearchResult, State, Trial
from envbisect.search.crashrate import CrashRate
from envbisect.search.verdict import Noise, median

if TYPE_CHECKING:
    from envbisect.diff import Unit
    from envbisect.search.hunkrun import HunkTrial
    from envbisect.search.pkgrun import PackageFinding


def step_rows(
    trials: Sequence[HunkTrial],
    context: RunContext,
    number: Callable[[State], int],
    labels: Mapping[State, str] | None = None,
) -> tuple[TrialRow, ...]:
    """The trials of a step below the engine as rows (``labels``: what a state's position
    stands for, shown instead of it); their verdicts logged."""
    rows = []
    for t in trials:
        n = number(t.state)
        applied = applied_names(t.state.applied, t.state.positions)
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
                verdict=TrialVerdict(t.verdict.value),
                failure=t.failure,
                purpose=t.purpose,
            )
        )
        verdict = VerdictEvent(n, t.verdict.value, rows[-1].median, judged_outlier=False)
        context.session.append(verdict)
    return tuple(rows)


def with_within(
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


def with_hunk(out: RunResult, hunk: HunkCulprit | None, rows: tuple[TrialRow, ...]) -> RunResult:
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


def unfaithful_good(
    outcome: RunOutcome,
    message: str,
    result: SearchResult,
    blocked: Mapping[str, str],
    *,
    callers_threshold: bool,
) -> tuple[RunOutcome, str]:
    """A good endpoint that is not clearly fast while changes that could not be realized
    stayed in their bad form is no evidence that "the cause is outside the recorded
    software" or that the regression "does not reproduce": the cause may be exactly one of
    those changes. Say so instead of "not reproduced". A bad endpoint above the caller's own
    threshold is a real answer (it is the bad state as it is); judged against the default,
    midway between the endpoints, a "fast" bad endpoint only says the two ran alike, which
    is what a good state left partly bad does (on a noisy machine either may come out
    ahead)."""
    if outcome is not RunOutcome.NOT_REPRODUCED or not blocked or not result.trials:
        return outcome, message
    ends = {t.state.applied: t for t in result.trials[:2]}
    good = ends.get(frozenset())
    bad = next((t for a, t in ends.items() if a), None)
    if good is None or good.verdict.value == "good":
        return outcome, message
    if callers_threshold and bad is not None and bad.verdict.value == "good":
        return outcome, message
    reasons = "; ".join(blocked[u] for u in sorted(blocked))
    return RunOutcome.UNFAITHFUL, (
        "the good state could not be realized faithfully: these changes stayed as in the "
        f"bad state ({reasons}); with them in place it did not run clearly faster than the "
        "bad state, so the cause is probably among them — make them realizable and run again"
    )


def _details(unit: Unit, commit: str | None, context: RunContext) -> tuple[str, ...]:
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
            blob=actuator.blob,
            via=actuator.git_via,
        )
    except (OSError, ValueError) as exc:
        return (f"(cannot show the change: {exc})",)


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
        f"{figure_unit()}): a threshold of {format_tok(mid)} would separate them"
    )


def run_result(result: SearchResult, context: RunContext, numbers: Mapping[str, int]) -> RunResult:
    """The run's result from the engine's: the outcome as users read it, the culprits with
    their evidence and details, the trial table numbered as the session numbers trials."""
    outcome, message = unfaithful_good(
        RunOutcome(result.outcome.value),
        result.message or "",
        result,
        context.blocked,
        callers_threshold=context.options.goal.value is not None,
    )
    if outcome is RunOutcome.NOT_REPRODUCED:
        message += _threshold_hint(result, context.options)
    culprits, notes = _culprits(result, context, numbers)
    session = context.session
    rows = tuple(
        replace(
            r,
            facts=probed.trial_facts(session.trial_dir(r.index)),
            timing=read_timing(session.trial_dir(r.index)),
        )
        for r in _rows(result, numbers)
    )
    culprits = tuple(replace(c, why=_why(c, rows)) for c in culprits)
    full = {u for t in result.trials for u in t.state.applied}
    bad_med = next(
        (t.median for t in result.trials if t.state.applied == full and not t.state.positions),
        None,
    )
    failed = (
        _failed_confirmation(result, culprits, numbers) if outcome is RunOutcome.FOUND else None
    )
    if failed is not None:
        outcome, message, culprits = RunOutcome.UNCONFIRMED, failed, ()
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
    named = [frozenset([c.unit.id, *c.together_with]) for c in culprits]
    for units in named:
        without = by_state.get(full - units)
        if without is None or not without.failure or not (full - units):
            continue
        if any(other <= full - units for other in named if other != units):
            continue  # --find-all: another named culprit is in it, and fails it
        return (
            f"{' + '.join(sorted(units))} looked guilty, but the confirmation with everything "
            f"but it (trial {trial_number(without, numbers)}) failed ({without.failure}): "
            "no culprit is named; see that trial's log"
        )
    return None


def _culprits(
    result: SearchResult, context: RunContext, numbers: Mapping[str, int]
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
                    good_trial=trial_number(evidence.good, numbers),
                    bad_trial=trial_number(evidence.bad, numbers),
                    crash=culprit_crash(found.alone, evidence),
                    hidden=found.hidden_by is not None,
                    with_rest=with_rest(found, evidence),
                )
            )
    return tuple(culprits), tuple(notes)


def with_rest(found: Isolation, evidence: Evidence) -> tuple[float, float] | None:
    """Everything but the culprit → everything, when its own state has no figure (the field's
    grown data crashed in its runs alone; its slowdown showed with the rest of the drift)."""
    rest = found.without
    if evidence.bad.median is not None or rest is None:
        return None
    good, bad = rest.good.median, rest.bad.median
    return (good, bad) if good is not None and bad is not None and bad < good else None


def culprit_crash(alone: Evidence, evidence: Evidence) -> str | None:
    """The crash finding of a culprit told by ``evidence`` (a commit's pair when a repo was
    narrowed): a commit's trial ran once or twice, the unit's own state to its rate, so the
    line says the unit's rate and what the commit's trial showed."""
    if evidence is alone or not alone.bad.crashes or alone.bad.runs <= evidence.bad.runs:
        return crash_finding(evidence.good, evidence.bad)
    at = f"; the commit's own trial {evidence.bad.crash_rate.describe()}"
    return f"{crash_finding(alone.good, alone.bad)}{at}"


def crash_finding(good: Trial, bad: Trial) -> str | None:
    """``crashed 5 of 5 (good: 0 of 4): RuntimeError: ...`` when the culprit's state crashed."""
    if not bad.crashes:
        return None
    rate = CrashRate(bad.crashes, max(bad.runs, bad.crashes)).describe()
    if good.runs:
        rate += f" (good: {good.crashes} of {good.runs})"
    error = str(bad.failure).removeprefix("crash: ") if bad.failure else None
    return f"{rate}: {error}" if error else rate


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
        bad_t = full_t if full_t is not None and not full_t.failure else None
        return trial_outlier(t, good_t, bad_t, sigma)

    return tuple(TrialRow.of(t, trial_number(t, numbers), flag(t)) for t in result.trials)
