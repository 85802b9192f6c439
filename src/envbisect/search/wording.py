"""The search's words: reason codes, and the one place that turns a code and its data into
the sentence a user reads (progress events, notes, the outcome's message).

The engine's phases never write a sentence: they return or emit a ``Reason`` (a ``Say`` code
plus the data it names), and ``Reason.text()`` says it here, word for word as it always has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from envbisect.model.metric import figure_unit, format_ktok


class Say(str, Enum):
    """What the search has to say: a progress event, a note, or why it ended as it did."""

    # progress
    TRIAL_STARTED = "trial-started"
    MORE_SAMPLES = "more-samples"
    ANOTHER_PROCESS = "another-process"
    TRIAL_FINISHED = "trial-finished"
    CRASH_ESTIMATE = "crash-estimate"
    CRASH_REGIME = "crash-regime"
    LOOK_FOR_CRASH = "look-for-crash"
    CULPRIT_RATE = "culprit-rate"
    RUNS_AT_ONCE = "runs-at-once"
    BASE_RATE = "base-rate"
    GOOD_RETRY = "good-retry"
    CRASH_BASELINE = "crash-baseline"
    AGAINST_BASE = "against-base"
    CLEAN_RUN = "clean-run"
    RATE_COST = "rate-cost"
    MEASURE_AGAIN = "measure-again"
    MEASURING_ENDPOINTS = "measuring-endpoints"
    ISOLATING = "isolating"
    NEEDS_MORE_UNITS = "needs-more-units"
    NARROWING_CONTEXT = "narrowing-context"
    BISECTING_ITEMS = "bisecting-items"
    SCREENING = "screening"
    HIDDEN_CAUSE = "hidden-cause"
    # notes of a result
    RECHECKED = "rechecked"
    ENDPOINT_RECHECKED = "endpoint-rechecked"
    RESTORE_UNRESOLVED = "restore-unresolved"
    OTHERS_FAIL = "others-fail"
    OTHERS_SLOW = "others-slow"
    SHORTFALL = "shortfall"
    DRIFTED = "drifted"
    ANOTHER_CAUSE = "another-cause"
    # why the endpoints do not show the regression
    UNFAITHFUL = "unfaithful"
    GOOD_FAILS = "good-fails"
    BAD_UNMEASURABLE = "bad-unmeasurable"
    BAD_FAST = "bad-fast"
    GOOD_SLOW = "good-slow"
    UNCLEAR = "unclear"
    # why isolation stopped short of one unit
    TOO_NOISY = "too-noisy"
    ALL_UNRESOLVED = "all-unresolved"
    UNJUDGED_ALONE = "unjudged-alone"
    # outcomes
    FOUND = "found"
    AMBIGUOUS = "ambiguous"
    BUDGET_SPENT = "budget-spent"
    INTERRUPTED = "interrupted"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Reason:
    """A code and the data its sentence names; ``text()`` is that sentence."""

    code: Say
    data: Mapping[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        return SENTENCES[self.code](**self.data)

    def __str__(self) -> str:
        return self.text()


def say(code: Say, **data: Any) -> Reason:
    return Reason(code, data)


def ktok(tok_per_s: float | None) -> str:
    """Throughputs in messages, written as in every table: ``12.6 Ktok/s``."""
    return f"{format_ktok(tok_per_s)} {figure_unit()}"


def _names(units: Iterable[str]) -> str:
    return ", ".join(units)


def _finished(
    index: int,
    verdict: Any,
    failure: Any,
    median: float | None,
    samples: int,
    rate: Any,
) -> str:
    crashes = f"; {rate.describe()}" if rate is not None else ""
    if failure:
        return f"trial {index}: {verdict.value} ({failure}{crashes})"
    return f"trial {index}: {verdict.value} (median {ktok(median)} of {samples} samples{crashes})"


def _measure_again(index: int, loaded: int, samples: int, endpoint: bool) -> str:
    why = "since the threshold rests on it" if endpoint else "before relying on it"
    return (
        f"trial {index}: {loaded} of {samples} samples were taken while "
        f"other processes loaded the machine: measuring it again {why}"
    )


def _rechecked(index: int, after: Any, before: Any, median: float | None, failure: Any) -> str:
    return (
        f"trial {index} measured again: {after.value} at "
        f"{ktok(median) if median is not None else failure}, not "
        f"{before.value} as its samples under load said"
    )


def _endpoint_rechecked(which: str, index: int, median: float | None) -> str:
    if median is None:
        return f"the endpoint of trial {index} was measured again"
    return (
        f"the {which} endpoint was measured again: its "
        f"first samples were taken under load; now {ktok(median)}"
    )


def _unfaithful(failures: Sequence[tuple[str, Any]]) -> str:
    return "; ".join(
        f"the {name} state could not be realized as recorded ({failure})"
        for name, failure in failures
    )


def _unclear(good: float, bad: float | None, threshold: float | None, sigma: float, n: int) -> str:
    b = ktok(bad) if bad is not None else "no samples"
    return (
        f"the regression does not reproduce clearly: good state {ktok(good)}, full set "
        f"{b}, threshold {ktok(threshold)} are within the noise "
        f"(±{sigma:.1%} per sample) after {n} samples"
    )


def _unjudged_alone(core: Sequence[str], failure: Any, together: Sequence[str]) -> str:
    why = f"failed: {failure}" if failure else "is within the noise"
    text = f"{_names(core)} makes it slow, but {_names(core)} alone {why}"
    if together:
        text += f"; it is slow together with {_names(together)}"
    return text


def _found(culprits: Sequence[Sequence[str]], notes: Sequence[Reason]) -> str:
    names = "; ".join(" + ".join(units) for units in culprits)
    msg = f"culprit: {names}" if len(culprits) == 1 else f"culprits: {names}"
    return "; ".join([msg, *(n.text() for n in notes)])


def _aborted(why: Reason, found: Reason | None, candidates: int) -> str:
    known = f"; found so far: {found.text()}" if found is not None else ""
    return f"{why.text()}{known}; the cause is among {candidates} units"


# The rule that ends each crash-counting phase, by the code its runs are said with; ``of``:
# the runs the phase goes to at most.
RATE_RULES: dict[Say, Callable[[int], str]] = {
    Say.CRASH_ESTIMATE: lambda of: (
        f"the rate is known at 3 crashes in every run, at 3 crashes in 10 or more runs, "
        f"or at {of} runs"
    ),
    Say.LOOK_FOR_CRASH: lambda of: f"ends at the first crash, or at {of} runs (--crash-runs)",
    Say.CLEAN_RUN: lambda of: f"ends at a crash, or at {of} clean runs",
    Say.CULPRIT_RATE: lambda of: f"ends at {of} runs (--crash-rate-runs)",
    Say.BASE_RATE: lambda of: f"ends at {of} runs",
    Say.AGAINST_BASE: lambda of: (
        f"ends once its rate tells from the good state's (Fisher test), or at {of} runs"
    ),
    Say.GOOD_RETRY: lambda of: f"ends at its first clean run, or at {of} runs",
}


# Each code's sentence, from the data its reason carries.
SENTENCES: dict[Say, Callable[..., str]] = {
    Say.TRIAL_STARTED: lambda index, state, purpose: (
        f"trial {index}: {state.describe()} ({purpose})"
    ),
    Say.MORE_SAMPLES: lambda index, n: f"trial {index}: {n} more sample(s)",
    Say.ANOTHER_PROCESS: lambda index, runs: (
        f"trial {index}: one more process (its median is within the noise of the threshold "
        f"after {runs} process(es))"
    ),
    Say.TRIAL_FINISHED: _finished,
    Say.CRASH_ESTIMATE: lambda index, rate: (
        f"trial {index}: {rate.describe()}; one more run to estimate its crash rate"
    ),
    Say.CRASH_REGIME: lambda rate, runs, confidence: (
        f"the bad state {rate.describe()} runs: a state counts as not crashing "
        f"after {runs} clean runs (a rate like that shows in them with "
        f"{confidence:.0%} probability)"
    ),
    Say.LOOK_FOR_CRASH: lambda index, run, of: (
        f"trial {index}: not slow; run {run} of {of} looking for an intermittent crash"
    ),
    Say.BASE_RATE: lambda index, rate: (
        f"trial {index}: the good state {rate.describe()} but also ran clean; one more run "
        "for its own crash rate"
    ),
    Say.GOOD_RETRY: lambda index, rate, of: (
        f"trial {index}: the good state {rate.describe()}; run {rate.runs + 1} of {of}: a "
        "race strikes now and then, a broken state every time"
    ),
    Say.CRASH_BASELINE: lambda rate, alpha: (
        f"the good state {rate.describe()} runs: that is the baseline; a state counts as "
        f"crashing only when it crashes more often (one-sided Fisher test, p < {alpha:.3f}), "
        "else its clean runs judge it"
    ),
    Say.AGAINST_BASE: lambda index, rate, base: (
        f"trial {index}: {rate.describe()} (good: {base.crashes} of {base.runs}); one more "
        "run to tell its crash rate from the good state's"
    ),
    Say.CULPRIT_RATE: lambda index, rate, of: (
        f"trial {index}: the culprit's own state {rate.describe()}; runs to {of} for its crash rate"
    ),
    Say.RUNS_AT_ONCE: lambda index, rate, runs, why: (
        f"trial {index}: {rate.describe()}; {runs} more runs at once {why} "
        "(--rate-runs-at-once; only whether each crashed counts)"
    ),
    Say.CLEAN_RUN: lambda index, runs, of, rate: (
        f"trial {index}: clean run {runs} of {of} needed (the bad state {rate.describe()})"
    ),
    Say.RATE_COST: lambda step, left, width, rule: (
        f"{step.text()}; at most {left} more run{'' if left == 1 else 's'}"
        f"{f', {width} at a time' if width > 1 else ''}: {rule}"
    ),
    Say.MEASURE_AGAIN: _measure_again,
    Say.MEASURING_ENDPOINTS: lambda: "measuring the endpoints",
    Say.ISOLATING: lambda units: f"isolating among {units} units",
    Say.NEEDS_MORE_UNITS: lambda units: f"{_names(units)} alone is fast: looking for what it needs",
    Say.NARROWING_CONTEXT: lambda units: f"narrowing what {_names(units)} is slow with",
    Say.BISECTING_ITEMS: lambda unit, items: f"{unit} is guilty: bisecting its {items} items",
    Say.SCREENING: lambda groups: (
        f"looking for causes the other changes hide: {groups} group(s) of the remaining "
        "changes, each alone on top of good"
    ),
    Say.HIDDEN_CAUSE: lambda units, index: (
        f"{_names(units)} is bad alone, but the bad state hides it: everything but the "
        f"culprits before it ran good{f' (trial {index})' if index is not None else ''}"
    ),
    Say.RECHECKED: _rechecked,
    Say.ENDPOINT_RECHECKED: _endpoint_rechecked,
    Say.RESTORE_UNRESOLVED: lambda: "whether reverting the culprits restores speed is unresolved",
    Say.OTHERS_FAIL: lambda failure: (
        f"everything but it fails too ({failure}): --find-all isolates why"
    ),
    Say.OTHERS_SLOW: lambda: (
        "reverting it alone does not restore speed: other changes slow it "
        "down too (--find-all isolates them)"
    ),
    Say.DRIFTED: lambda claim, before, now, other: (
        f"not said that {claim}: measured again beside the good state (paired, back to "
        f"back) it does not hold; the machine's speed moved under other processes' load "
        f"(the good state {ktok(before)} earlier, {ktok(now)} now, everything but the "
        f"culprits {ktok(other)} beside it): run again on a quiet machine to decide it"
    ),
    Say.SHORTFALL: lambda got, good: (
        f"reverting it brings back {ktok(got)}, not the good state's "
        f"{ktok(good)}: smaller slowdowns stay above the threshold "
        "(a higher threshold and --find-all would isolate them)"
    ),
    Say.ANOTHER_CAUSE: lambda units, why: f"another cause among {units} units: {why.text()}",
    Say.UNFAITHFUL: _unfaithful,
    Say.GOOD_FAILS: lambda failure: (
        f"the good state fails here too ({failure}): if its trial log shows it "
        "ran as recorded, the cause is outside the recorded software (see the "
        "non-bisectable changes); a failure of the realized state itself is not"
    ),
    Say.BAD_UNMEASURABLE: lambda failure: (
        f"the full set of changes could not be measured ({failure}); with "
        "on_failure='skip' a failure is not the regression"
    ),
    Say.BAD_FAST: lambda: (
        "the regression does not reproduce: the full set of changes runs fast here"
    ),
    Say.GOOD_SLOW: lambda: (
        "the good state is slow here too — the cause is outside the recorded "
        "software: see the non-bisectable changes"
    ),
    Say.UNCLEAR: _unclear,
    Say.TOO_NOISY: lambda states, sigma, max_samples: (
        f"{states} states stayed within the noise band (±"
        f"{sigma:.1%} per sample) after up to {max_samples} "
        "samples: the drop is too small for this noise; allow more samples or "
        "quiet the machine"
    ),
    Say.ALL_UNRESOLVED: lambda units: (
        f"one of {_names(units)} makes it slow, but every state between them was unresolved"
    ),
    Say.UNJUDGED_ALONE: _unjudged_alone,
    Say.FOUND: _found,
    Say.AMBIGUOUS: lambda units, why: (
        f"the cause is among {units} units but cannot be isolated: {why.text()}"
    ),
    Say.BUDGET_SPENT: lambda trials: f"the budget of {trials} trials is spent",
    Say.INTERRUPTED: lambda: "interrupted",
    Say.ABORTED: _aborted,
}
