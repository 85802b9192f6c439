"""Issue 47: no claim from drift. When load was seen and everything but the culprit
measured slow, the good state and it are measured again back to back (A B A B); the claim
that other changes slow it too is made only when the pair still shows it."""

from __future__ import annotations

from envbisect.search.engine import search
from envbisect.search.state import Outcome, State


class Machine:
    """``a`` makes it 10x slower; ``b`` is innocent (or, with ``guilty_b``, 0.5x). The
    machine slows 4x, under other processes' load, from call ``slow_from`` on."""

    def __init__(self, slow_from: int, guilty_b: bool = False) -> None:
        self.calls = 0
        self.slow_from = slow_from
        self.guilty_b = guilty_b

    def __call__(self, state: State, n: int) -> Outcome:
        self.calls += 1
        speed = 1000.0 / (10.0 if "a" in state.applied else 1.0)
        if self.guilty_b and "b" in state.applied:
            speed *= 0.5
        loaded = self.calls >= self.slow_from
        if loaded:
            speed /= 4.0
        return Outcome(samples=(speed,) * n, contended=(loaded,) * n)


def _said(result) -> str:  # type: ignore[no-untyped-def]
    return str(result.message) + " | " + " | ".join(str(n) for n in result.notes)


def test_a_machine_that_slowed_between_trials_makes_no_other_slowdowns_claim() -> None:
    # Calls: good, bad (endpoints), a alone (isolated); load from the confirmation on.
    result = search(["a", "b"], Machine(slow_from=4), threshold_fraction=0.6)
    assert sorted(result.culprits[0].units) == ["a"]
    said = _said(result)
    assert "other changes slow it down too (--find-all" not in said
    assert "not said that other changes slow it down too" in said
    assert "the good state 1.0 Ktok/s earlier, 0.25 Ktok/s now" in said


def test_a_real_second_cause_is_still_said_when_the_pair_shows_it() -> None:
    result = search(["a", "b"], Machine(slow_from=4, guilty_b=True), threshold_fraction=0.6)
    said = _said(result)
    assert "reverting it alone does not restore speed: other changes slow it down too" in said
    assert "not said that" not in said


def test_without_load_nothing_is_measured_again() -> None:
    quiet = Machine(slow_from=10**9, guilty_b=True)
    result = search(["a", "b"], quiet, threshold_fraction=0.6)
    assert "other changes slow it down too" in _said(result)
    calls = quiet.calls
    assert calls == len(result.trials) or calls <= len(result.trials) + 2
