"""The engine's result as a run's: a good state left partly bad is never "not reproduced"."""

from __future__ import annotations

import pytest

from envbisect.run.convert import unfaithful_good
from envbisect.run.result import RunOutcome
from envbisect.search import Outcome, SearchResult, State, search

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
