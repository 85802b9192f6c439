"""Which trials run when: one at a time, or rounds of k states (with speculation)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from helpers_oracle import Oracle
from helpers_search import wire

from envbisect.search.budget import Spent
from envbisect.search.result import EventKind
from envbisect.search.state import Outcome, State
from envbisect.search.verdict import Verdict

UNITS = ("a", "b", "c", "d")


def oracle(cv: float = 0.0) -> Oracle:
    return Oracle(UNITS, (frozenset({"c"}),), cv=cv, seed=1)


def judged_endpoints(w) -> None:  # type: ignore[no-untyped-def]
    good = w.scheduler.start(State.of(()), "endpoint: good", 3)
    bad = w.scheduler.start(State.of(UNITS), "endpoint: bad", 3)
    w.threshold.set_from_endpoints(good, bad)


def test_a_state_is_measured_once_then_read_from_the_cache() -> None:
    truth = oracle()
    w = wire(UNITS, truth)
    judged_endpoints(w)
    assert w.scheduler.measure(State.of(("c",)), "isolate") is Verdict.BAD
    calls = truth.calls
    assert w.scheduler.measure(State.of(("c",)), "isolate") is Verdict.BAD
    assert truth.calls == calls
    assert w.events[-1].kind is EventKind.TRIAL_FINISHED
    assert w.events[-1].message.startswith("trial 3: bad (median 4.3 Ktok/s of 3 samples")


def test_one_worker_runs_one_state_a_round_and_speculates_nothing() -> None:
    w = wire(UNITS, oracle())
    recs = w.scheduler.start_round(
        [(State.of(()), "endpoint: good"), (State.of(UNITS), "endpoint: bad")],
        3,
        speculative=[(State.of(("a",)), "isolate (speculative)")],
    )
    assert [r.round for r in recs] == [1, 2]
    assert len(w.cache) == 2 and not w.scheduler.speculated


def test_k_workers_share_a_round_and_a_replayed_state_takes_no_worker() -> None:
    batches: list[int] = []

    def many(calls: Sequence[tuple[State, int]]) -> list[Outcome]:
        batches.append(len(calls))
        return [oracle()(s, n) for s, n in calls]

    replayed = {State.of(()): Outcome(samples=(12_800.0,) * 3)}
    w = wire(UNITS, oracle(), workers=2, replay=replayed)
    w.cache.test_many = many
    requests = [(State.of(s), "isolate") for s in ((), ("a",), ("b",), ("c",))]
    recs = w.scheduler.start_round(requests, 3, speculative=[(State.of(("d",)), "spec")])
    # The replayed state, then two on the two workers; the speculative one rides along.
    assert [r.state for r in recs] == [s for s, _ in requests[:3]]
    assert {r.round for r in w.cache} == {1}
    assert batches == [3]
    assert [r.state for r in w.scheduler.speculated] == [State.of(("d",))]


def test_a_round_past_the_budget_is_refused_and_trimmed_within_it() -> None:
    w = wire(UNITS, oracle(), workers=3, max_trials=2)
    recs = w.scheduler.start_round([(State.of(s), "isolate") for s in ((), ("a",), ("b",))], 3)
    assert len(recs) == 2
    with pytest.raises(Spent):
        w.scheduler.start_round([(State.of(("c",)), "isolate")], 3)


def test_measuring_many_measures_the_fresh_states_together_once_each() -> None:
    w = wire(UNITS, oracle(), workers=2)
    judged_endpoints(w)
    requests = [(State.of(("c",)), "isolate"), (State.of(("a",)), "isolate")] * 2
    verdicts = w.scheduler.measure_many(requests)
    assert verdicts == [Verdict.BAD, Verdict.GOOD] * 2
    assert len(w.cache) == 4
    assert w.cache[State.of(("c",))].round == w.cache[State.of(("a",))].round == 3


def test_a_noisy_state_gets_more_samples_up_to_the_cap() -> None:
    w = wire(UNITS, oracle(cv=0.3), max_samples=5)
    judged_endpoints(w)
    w.scheduler.measure(State.of(("a", "b")), "isolate")
    rec = w.cache[State.of(("a", "b"))]
    assert 3 <= len(rec.samples) <= 5
    more = [e for e in w.events if e.kind is EventKind.MORE_SAMPLES]
    assert all(e.message.endswith("more sample(s)") for e in more)


def test_measuring_again_sets_the_loaded_samples_aside() -> None:
    w = wire(UNITS, oracle())
    judged_endpoints(w)
    w.scheduler.measure(State.of(("c",)), "isolate")
    rec = w.cache[State.of(("c",))]
    rec.contended = [True, True, False]
    assert w.scheduler.measure_again(rec, endpoint=False) is Verdict.BAD
    assert len(rec.set_aside) == 2 and len(rec.samples) == 3 and not any(rec.contended)
    assert "measuring it again before relying on it" in w.messages()[-2]


def test_a_state_whose_process_gives_every_sample_at_once_gets_more_processes() -> None:
    """Found as a user (session 7, one core kept busy): each process of a script printing
    one figure gave 20 samples from its timed steps (±50% apart under load); the bad
    endpoint sat inside the noise band, the cap of 9 samples was already passed, and the run
    ended "within the noise after 20 samples" with one process a state."""
    spread = [0.5 + i / 19 for i in range(20)]  # 0.5x .. 1.5x, median 1.0x
    speeds = {State.of(()): 12_800.0, State.of(UNITS): 4_000.0}

    def bulk(state: State, n: int) -> Outcome:
        speed = speeds.get(state, 7_160.0)  # the middle state: at the threshold
        return Outcome(samples=tuple(speed * f for f in spread))

    w = wire(UNITS, bulk, max_samples=9)
    judged_endpoints(w)
    w.scheduler.measure(State.of(("a", "b")), "isolate")
    rec = w.cache[State.of(("a", "b"))]
    assert rec.runs == 3 and len(rec.samples) == 60
    more = [e.message for e in w.events if e.kind is EventKind.MORE_SAMPLES]
    assert more == [
        f"trial {rec.index}: one more process (its median is within the noise of the "
        f"threshold after {n} process(es))"
        for n in (1, 2)
    ]
    assert w.cache[State.of(())].runs == 1  # a state the first process settled takes no more
