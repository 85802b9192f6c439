"""The search's words: every reason code has its sentence, said word for word."""

from __future__ import annotations

import pytest

from envbisect.search.crashrate import CrashRate
from envbisect.search.state import State
from envbisect.search.verdict import Verdict
from envbisect.search.wording import SENTENCES, Say, say


def test_a_finished_trial_names_its_median_or_its_failure_and_a_crash_rate() -> None:
    ran = say(
        Say.TRIAL_FINISHED,
        index=3,
        verdict=Verdict.BAD,
        failure=None,
        median=6400.0,
        samples=5,
        rate=None,
    )
    assert ran.text() == "trial 3: bad (median 6.4 Ktok/s of 5 samples)"
    crashed = say(
        Say.TRIAL_FINISHED,
        index=4,
        verdict=Verdict.BAD,
        failure="crash: boom",
        median=None,
        samples=0,
        rate=CrashRate(1, 2),
    )
    assert str(crashed) == "trial 4: bad (crash: boom; crashed 1 of 2)"


def test_a_started_trial_describes_its_state_and_purpose() -> None:
    reason = say(Say.TRIAL_STARTED, index=1, state=State.of(()), purpose="endpoint: good")
    assert reason.text() == "trial 1: good state (nothing applied) (endpoint: good)"


def test_reasons_nest_inside_the_outcome_sentence() -> None:
    why = say(Say.ALL_UNRESOLVED, units=["a", "b"])
    assert say(Say.AMBIGUOUS, units=2, why=why).text() == (
        "the cause is among 2 units but cannot be isolated: one of a, b makes it slow, "
        "but every state between them was unresolved"
    )
    found = say(Say.FOUND, culprits=[("a",), ("b", "c")], notes=[say(Say.RESTORE_UNRESOLVED)])
    spent = say(Say.BUDGET_SPENT, trials=6)
    assert say(Say.ABORTED, why=spent, found=found, candidates=3).text() == (
        "the budget of 6 trials is spent; found so far: culprits: a; b + c; whether "
        "reverting the culprits restores speed is unresolved; the cause is among 3 units"
    )
    assert say(Say.ABORTED, why=say(Say.INTERRUPTED), found=None, candidates=1).text() == (
        "interrupted; the cause is among 1 units"
    )


def test_the_unclear_endpoints_say_the_noise_and_a_missing_bad_median() -> None:
    text = say(Say.UNCLEAR, good=12_800.0, bad=None, threshold=9000.0, sigma=0.034, n=9).text()
    assert text == (
        "the regression does not reproduce clearly: good state 12.8 Ktok/s, full set no "
        "samples, threshold 9.0 Ktok/s are within the noise (±3.4% per sample) after 9 samples"
    )


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [(True, "since the threshold rests on it"), (False, "before relying on it")],
)
def test_measuring_again_says_why(endpoint: bool, why: str) -> None:
    text = say(Say.MEASURE_AGAIN, index=2, loaded=3, samples=4, endpoint=endpoint).text()
    assert text.startswith("trial 2: 3 of 4 samples were taken while other processes")
    assert text.endswith(f"measuring it again {why}")


def test_every_code_has_words() -> None:
    assert set(SENTENCES) == set(Say)
