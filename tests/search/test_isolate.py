"""Isolation with dd: one culprit, an interaction, and where it stops short."""

from __future__ import annotations

import pytest
from helpers_oracle import Oracle
from helpers_search import Wired, wire

from envbisect.search.isolate import Ambiguous, Isolator, chain
from envbisect.search.state import OnFailure, Outcome, State, TestFn
from envbisect.search.verdict import Verdict
from envbisect.search.wording import Say

UNITS = tuple("abcdefgh")


def phase(test: TestFn, **options: object) -> tuple[Wired, Isolator]:
    w = wire(UNITS, test, threshold=6000.0, **options)
    for state in (State.of(()), State.of(UNITS)):
        w.scheduler.measure(state, "endpoint")
    return w, Isolator(w.cache, w.scheduler, w.budget, w.units)


def test_a_k_ary_chain_nests_states_between_the_pair() -> None:
    delta = list("abcdef")
    states = chain(frozenset(), frozenset(delta), delta, 2)
    assert states == [frozenset(), frozenset("ab"), frozenset("abcd"), frozenset(delta)]
    assert chain(frozenset("x"), frozenset("xab"), ["a", "b"], 3) == [
        frozenset("x"),
        frozenset("xa"),
        frozenset("xab"),
    ]


@pytest.mark.parametrize("workers", [1, 3])
def test_dd_narrows_to_the_one_culprit(workers: int) -> None:
    w, isolator = phase(Oracle(UNITS, (frozenset({"f"}),)), workers=workers)
    passing, failing = isolator.dd(frozenset(), frozenset(UNITS), "isolate")
    assert failing - passing == {"f"}
    assert w.cache[State.of(failing)].verdict is Verdict.BAD
    assert isolator.find_core(frozenset(UNITS)) == {"f"}
    speculative = [] if workers == 1 else [frozenset("ab"), frozenset("abcd"), frozenset("abcdef")]
    assert [state.applied for state, _ in isolator.first_split()] == speculative


def test_an_interaction_is_found_whole() -> None:
    w, isolator = phase(Oracle(UNITS, (frozenset({"b", "g"}),)))
    assert isolator.find_core(frozenset(UNITS)) == {"b", "g"}
    assert "b alone is fast: looking for what it needs" in w.messages() or (
        "g alone is fast: looking for what it needs" in w.messages()
    )


def test_unbuildable_states_leave_the_cause_among_candidates() -> None:
    def only_ends(state: State, n: int) -> Outcome:
        if state.applied and state.applied != frozenset(UNITS):
            return Outcome(failure="build: broken")
        return Outcome((4000.0 if state.applied else 12_000.0,) * n)

    w, isolator = phase(only_ends, on_failure=OnFailure.SKIP)
    with pytest.raises(Ambiguous) as caught:
        isolator.find_core(frozenset(UNITS))
    assert caught.value.why.code is Say.ALL_UNRESOLVED
    assert caught.value.candidates == frozenset(UNITS)


def test_a_culprit_that_cannot_be_judged_alone_is_ambiguous() -> None:
    def lone_fails(state: State, n: int) -> Outcome:
        if state.applied == {"c"}:
            return Outcome(failure="build: alone it does not build")
        return Outcome((4000.0 if "c" in state.applied else 12_000.0,) * n)

    w, isolator = phase(lone_fails, on_failure=OnFailure.SKIP)
    with pytest.raises(Ambiguous) as caught:
        isolator.find_core(frozenset(UNITS))
    assert caught.value.why.code is Say.UNJUDGED_ALONE
    assert "c" in caught.value.candidates
    assert str(caught.value).startswith("c makes it slow, but c alone failed: build:")
