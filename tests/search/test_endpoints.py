"""The endpoints: measured, judged, and why the regression does not reproduce."""

from __future__ import annotations

from helpers_oracle import Oracle
from helpers_search import Wired, wire

from envbisect.search.endpoints import Endpoints
from envbisect.search.recheck import LoadCheck
from envbisect.search.state import OnFailure, Outcome, State, TestFn
from envbisect.search.verdict import Verdict
from envbisect.search.wording import Say

UNITS = ("a", "b", "c")


def phase(test: TestFn, **options: object) -> tuple[Wired, Endpoints]:
    w = wire(UNITS, test, **options)
    load = LoadCheck(w.cache, w.scheduler, w.units.everything, enabled=False)
    return w, Endpoints(w.cache, w.scheduler, w.threshold, w.crashes, load, w.units.everything)


def test_slow_endpoints_reproduce_and_set_the_threshold() -> None:
    w, endpoints = phase(Oracle(UNITS, (frozenset({"b"}),)))
    assert endpoints.measure() is None
    good, bad = w.cache[State.of(())], w.cache[State.of(UNITS)]
    assert (good.verdict, bad.verdict) == (Verdict.GOOD, Verdict.BAD)
    assert len(good.samples) >= 3 and w.threshold.value is not None
    assert w.messages()[0] == "measuring the endpoints"


def test_a_fast_full_set_does_not_reproduce() -> None:
    w, endpoints = phase(Oracle(UNITS, ()), threshold=6000.0)
    why = endpoints.measure()
    assert why is not None and why.code is Say.BAD_FAST


def test_a_slow_good_state_points_outside_the_recorded_software() -> None:
    w, endpoints = phase(Oracle(UNITS, (frozenset(),)), threshold=6000.0)
    why = endpoints.measure()
    assert why is not None and why.code is Say.GOOD_SLOW


def test_a_good_state_that_fails_says_so() -> None:
    def broken(state: State, n: int) -> Outcome:
        return Outcome(failure="build: no such wheel") if not state.applied else Outcome((1.0,))

    w, endpoints = phase(broken)
    why = endpoints.measure()
    assert why is not None and why.code is Say.GOOD_FAILS
    assert why.text().startswith("the good state fails here too (build: no such wheel)")


def test_an_unmeasurable_full_set_is_not_the_regression_when_failures_are_skipped() -> None:
    def broken(state: State, n: int) -> Outcome:
        return Outcome(failure="build: x") if state.applied else Outcome((1000.0,) * n)

    w, endpoints = phase(broken, on_failure=OnFailure.SKIP)
    why = endpoints.measure()
    assert why is not None and why.code is Say.BAD_UNMEASURABLE


def test_an_endpoint_not_realized_as_recorded_is_unfaithful() -> None:
    def unfaithful(state: State, n: int) -> Outcome:
        if state.applied:
            return Outcome(failure="state not faithful: torch differs", untestable=True)
        return Outcome((1000.0,) * n)

    w, endpoints = phase(unfaithful)
    why = endpoints.measure()
    assert why is not None and why.code is Say.UNFAITHFUL
    assert why.text() == (
        "the bad state could not be realized as recorded (state not faithful: torch differs)"
    )
    assert w.cache[State.of(UNITS)].verdict is Verdict.UNRESOLVED


class Rates:
    """∅ at 1000, the full set at ``bad``; counts each call (one call: one process)."""

    def __init__(self, bad: float) -> None:
        self.bad, self.calls = bad, {"good": 0, "bad": 0}

    def __call__(self, state: State, n: int) -> Outcome:
        which = "good" if not state.applied else "bad"
        self.calls[which] += 1
        rate = 1000.0 if which == "good" else self.bad
        return Outcome(samples=tuple(rate * (1 + 0.002 * (i % 3 - 1)) for i in range(n)))


def test_endpoints_far_apart_cost_one_process_each() -> None:
    """Issue 32: endpoints measured once unless noise calls for more."""
    world = Rates(bad=90.0)  # the GPU scenario: 1594 → 143 Ktok/s, 11× apart
    w, endpoints = phase(world)
    assert endpoints.measure() is None
    assert world.calls == {"good": 1, "bad": 1}
    assert not any("more sample" in m for m in w.messages())


def test_close_endpoints_give_the_good_state_a_second_process() -> None:
    """Within 2× of each other, the between-process spread enters the noise model."""
    world = Rates(bad=600.0)
    w, endpoints = phase(world)
    assert endpoints.measure() is None
    assert world.calls["good"] >= 2 and world.calls["bad"] >= 1
    assert "trial 1: 2 more sample(s)" in w.messages()
