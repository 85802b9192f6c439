"""The sample cache: what one call of the test function adds to a trial, replays, batches."""

from __future__ import annotations

import math

import pytest

from envbisect.search.budget import Budget, Spent
from envbisect.search.result import Event, EventKind
from envbisect.search.samples import Record, SampleCache
from envbisect.search.state import Outcome, State
from envbisect.search.wording import Say


def test_a_record_keeps_finite_samples_with_their_load_flags() -> None:
    rec = Record(1, State.of(()), "endpoint: good")
    rec.take(Outcome(samples=(10.0, math.nan, 12.0), contended=(True,), worker="w1"))
    assert rec.samples == [10.0, 12.0]
    assert rec.contended == [True, False]
    assert (rec.runs, rec.crashes, rec.failure, rec.worker) == (1, 0, None, "w1")
    trial = rec.freeze()
    assert trial.median == 11.0 and trial.samples == (10.0, 12.0)


def test_a_crash_counts_as_one_and_no_samples_is_a_failure() -> None:
    rec = Record(1, State.of(("a",)), "isolate")
    rec.take(Outcome(failure="crash: segfault"))
    assert rec.crashes == 1 and rec.failure is not None and rec.failure.startswith("crash")
    empty = Record(2, State.of(("b",)), "isolate")
    empty.take(Outcome(samples=(math.inf,)))
    assert empty.failure == "no samples"


def test_a_record_refuses_what_is_not_an_outcome() -> None:
    with pytest.raises(TypeError, match="not Outcome"):
        Record(1, State.of(()), "x").take((1.0,))  # type: ignore[arg-type]


def test_the_cache_replays_before_it_calls_and_announces_each_trial() -> None:
    calls: list[State] = []
    events: list[Event] = []

    def test(state: State, n: int) -> Outcome:
        calls.append(state)
        return Outcome(samples=(5.0,) * n)

    good, bad = State.of(()), State.of(("a",))
    cache = SampleCache(
        test, Budget(None), progress=events.append, replay={good: Outcome(samples=(9.0,))}
    )
    for state in (good, bad):
        cache.call(cache.new(state, "endpoint"), 2)
    assert calls == [bad]
    assert cache[good].samples == [9.0] and cache[bad].samples == [5.0, 5.0]
    assert [e.kind for e in events] == [EventKind.TRIAL_STARTED] * 2
    assert events[1].message == "trial 2: 1 applied: a (endpoint)"
    assert events[1].reason is not None and events[1].reason.code is Say.TRIAL_STARTED
    assert len(cache) == 2 and [t.index for t in cache.trials()] == [1, 2]


def test_a_batch_function_must_answer_every_state() -> None:
    cache = SampleCache(
        lambda s, n: Outcome(samples=(1.0,)),
        Budget(None),
        progress=None,
        replay={},
        test_many=lambda calls: [Outcome(samples=(1.0,))],
    )
    recs = [cache.new(State.of(s), "isolate") for s in ((), ("a",))]
    with pytest.raises(TypeError, match="1 outcomes for 2"):
        cache.call_many([(r, 1) for r in recs])


def test_a_new_trial_past_the_budget_is_refused() -> None:
    cache = SampleCache(lambda s, n: Outcome(), Budget(2), progress=None, replay={})
    cache.new(State.of(()), "a")
    cache.new(State.of(("a",)), "b")
    with pytest.raises(Spent):
        cache.new(State.of(("b",)), "c")
