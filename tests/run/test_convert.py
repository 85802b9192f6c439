"""The engine's result as a run's: a good state left partly bad is never "not reproduced"."""

from __future__ import annotations

import pytest

from envbisect.model.failure import Failure
from envbisect.run.convert import crash_finding, culprit_crash, unfaithful_good, with_rest
from envbisect.run.result import RunOutcome
from envbisect.search import Evidence, Isolation, Outcome, SearchResult, State, Trial, search
from envbisect.search.verdict import Verdict

BLOCKED = {"files:/w/knob.txt": "files /w/knob.txt: no stored content"}


def _alike_but_bad_ahead(threshold: float | None) -> SearchResult:
    """Endpoints that ran alike but for the noise of a shared machine, the bad one ahead."""

    def test(state: State, n: int) -> Outcome:
        return Outcome(samples=(1_100.0 if state.applied else 1_000.0,) * n)

    return search(["files:/w/knob.txt", "env:EB_OTHER"], test, threshold=threshold)


def test_a_bad_endpoint_ahead_of_a_partly_bad_good_one_is_unfaithful_not_fast() -> None:
    # CI once saw this: the good state ran with the bad knob (its content was gone), the
    # two endpoints ran alike, and noise put the bad one ahead of the midway threshold.
    result = _alike_but_bad_ahead(threshold=None)
    outcome, message = unfaithful_good(
        RunOutcome(result.outcome.value), result.message, result, BLOCKED, callers_threshold=False
    )
    assert outcome is RunOutcome.UNFAITHFUL
    assert "files /w/knob.txt: no stored content" in message
    assert "the cause is probably among them" in message


def test_a_bad_endpoint_above_the_callers_threshold_is_a_real_answer() -> None:
    result = _alike_but_bad_ahead(threshold=1_050.0)
    assert result.outcome.value == "not-reproduced"
    outcome, message = unfaithful_good(
        RunOutcome(result.outcome.value), result.message, result, BLOCKED, callers_threshold=True
    )
    assert (outcome, message) == (RunOutcome.NOT_REPRODUCED, result.message)


@pytest.mark.parametrize("blocked", [{}, BLOCKED])
def test_a_clearly_fast_good_endpoint_keeps_the_engines_answer(blocked: dict[str, str]) -> None:
    def test(state: State, n: int) -> Outcome:
        return Outcome(samples=(1_000.0 if state.applied else 2_000.0,) * n)

    result = search(["a", "b"], test, threshold=500.0)  # nothing is slow: not reproduced
    outcome, _ = unfaithful_good(
        RunOutcome(result.outcome.value), result.message, result, blocked, callers_threshold=True
    )
    assert outcome is RunOutcome.NOT_REPRODUCED


def _trial(index: int, applied: tuple[str, ...], runs: int, crashes: int) -> Trial:
    failure = Failure.of("crash: exit 1: RuntimeError: deadlock") if crashes else None
    samples = () if crashes == runs else (1000.0,)
    return Trial(
        index, State.of(applied), samples, None, Verdict.BAD if crashes else Verdict.GOOD,
        failure=failure, runs=runs, crashes=crashes,
    )  # fmt: skip


def test_a_narrowed_commits_crash_line_says_the_units_rate_not_its_one_run() -> None:
    # Seen on CPU with a user's repo whose second commit deadlocks: the culprit line said
    # "crashed 1 of 1", the commit's trial, where the repo's change had crashed 5 of 5.
    good = _trial(1, (), 4, 0)
    alone = Evidence.of(good, _trial(3, ("git:/w/repo",), 5, 5))
    commit = Evidence.of(_trial(6, (), 1, 0), _trial(7, ("git:/w/repo",), 1, 1))
    line = culprit_crash(alone, commit)
    assert line is not None
    assert line.startswith("crashed 5 of 5 (good: 0 of 4): exit 1: RuntimeError: deadlock")
    assert line.endswith("; the commit's own trial crashed 1 of 1")
    assert culprit_crash(alone, alone) == crash_finding(good, alone.bad)


def test_a_culprit_whose_runs_alone_all_crashed_shows_its_slowdown_with_the_rest() -> None:
    # The H100's grown data: its two runs alone crashed and the rate runs at once keep no
    # figure, so its line had no Ktok/s; everything but it ran 57.5, everything 5.6 Ktok/s.
    def trial(index: int, applied: tuple[str, ...], rate: float | None) -> Trial:
        crashed = rate is None
        failure = Failure.of("crash: exit 1: RuntimeError: FX") if crashed else None
        samples = () if crashed else (rate,)
        verdict = Verdict.BAD if crashed or rate < 10_000 else Verdict.GOOD
        return Trial(index, State.of(applied), samples, rate, verdict, failure=failure, runs=1)

    good, data = trial(1, (), 54_800.0), trial(5, ("data",), None)
    rest = Evidence.of(trial(6, ("patch",), 57_500.0), trial(2, ("data", "patch"), 5_600.0))
    found = Isolation(("data",), Evidence.of(good, data), without=rest)
    assert with_rest(found, found.alone) == (57_500.0, 5_600.0)
    ran = Isolation(("data",), Evidence.of(good, trial(5, ("data",), 6_000.0)), without=rest)
    assert with_rest(ran, ran.alone) is None  # its own figure is the one shown
    assert with_rest(Isolation(("data",), found.alone), found.alone) is None
