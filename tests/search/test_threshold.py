"""The threshold: the caller's, a fraction of good, half good when the bad state fails, or
the endpoints' geometric mean; and the verdicts judged against it."""

from __future__ import annotations

import math

from helpers_search import wire

from envbisect.search.state import OnFailure, Outcome, State
from envbisect.search.verdict import Verdict


def constant(state: State, n: int) -> Outcome:
    """ "a" makes it 2.5 times slower, "d" a little; "b" does not build."""
    if state.applied == {"b"}:
        return Outcome(failure="build: no wheel")
    speed = 400.0 if "a" in state.applied else 700.0 if "d" in state.applied else 1000.0
    return Outcome(samples=(speed,) * n)


def endpoints(**kwargs: object):  # type: ignore[no-untyped-def]
    w = wire(["a"], constant, **kwargs)  # type: ignore[arg-type]
    good = w.scheduler.start(State.of(()), "endpoint: good", 3)
    bad = w.scheduler.start(State.of(("a",)), "endpoint: bad", 3)
    return w, good, bad


def test_the_default_threshold_is_the_geometric_mean_of_the_endpoints() -> None:
    w, good, bad = endpoints()
    w.threshold.set_from_endpoints(good, bad)
    assert w.threshold.value is not None
    assert math.isclose(w.threshold.value, math.sqrt(1000.0 * 400.0))
    assert w.threshold.decide(good) is Verdict.GOOD
    assert w.threshold.decide(bad) is Verdict.BAD
    assert not w.threshold.loose(good, bad)


def test_a_fraction_is_fixed_from_the_good_endpoint_like_a_callers_threshold() -> None:
    w, good, bad = endpoints(threshold_fraction=0.5)
    w.threshold.set_from_endpoints(good, bad)
    assert w.threshold.value == 500.0 == w.threshold.caller
    assert w.threshold.decide(bad) is Verdict.BAD


def test_a_bad_state_that_fails_makes_slow_mean_under_half_the_good_speed() -> None:
    w = wire(["b"], constant)
    good = w.scheduler.start(State.of(()), "endpoint: good", 3)
    bad = w.scheduler.start(State.of(("b",)), "endpoint: bad", 3)
    w.threshold.set_from_endpoints(good, bad)
    assert w.threshold.value == 500.0
    assert w.threshold.decide(bad) is Verdict.BAD
    assert not w.threshold.loose(good, bad)


def test_a_failure_counts_as_bad_or_is_skipped_and_untestable_is_unresolved() -> None:
    for on_failure, verdict in ((OnFailure.BAD, Verdict.BAD), (OnFailure.SKIP, Verdict.UNRESOLVED)):
        w = wire(["b"], constant, threshold=700.0, on_failure=on_failure)
        rec = w.scheduler.start(State.of(("b",)), "isolate", 3)
        assert w.threshold.decide(rec) is verdict
        rec.untestable = True
        assert w.threshold.decide(rec) is Verdict.UNRESOLVED


def test_states_judged_at_an_endpoints_speed_refine_the_default_threshold() -> None:
    w = wire(["a", "c", "d"], constant)
    good = w.scheduler.start(State.of(()), "endpoint: good", 3)
    bad = w.scheduler.start(State.of(("a", "c", "d")), "endpoint: bad", 3)
    fast_one = w.scheduler.start(State.of(("c",)), "isolate", 3)
    fast_one.verdict = Verdict.GOOD
    slow_one = w.scheduler.start(State.of(("a",)), "isolate", 3)
    slow_one.verdict = Verdict.BAD
    between = w.scheduler.start(State.of(("d",)), "isolate", 3)
    between.verdict = Verdict.BAD  # in-between speed: left out
    fast, slow = w.threshold.levels(good, bad, w.cache.noise())
    assert fast == [1000.0] * 6 and slow == [400.0] * 6
