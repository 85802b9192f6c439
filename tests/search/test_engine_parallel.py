"""The engine with k workers: k states per round, never one state twice at once."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import pytest
from helpers_oracle import Oracle, make_oracle, unit_names

from envbisect.search import Outcome, SearchOutcome, SearchResult, State, Verdict, search


def rounds_bound(n: int, k: int) -> int:
    """⌈log_{k+1} N⌉ + 2: the isolation rounds, the endpoints' and the confirmations'."""
    return math.ceil(math.log(n, k + 1) - 1e-9) + 2


class Batches:
    """A batch test function over an oracle that records every batch and names a worker."""

    def __init__(self, oracle: Oracle, k: int) -> None:
        self.oracle = oracle
        self.k = k
        self.batches: list[list[tuple[State, int]]] = []
        self.worker_of: dict[State, str] = {}

    def __call__(self, calls: Sequence[tuple[State, int]]) -> list[Outcome]:
        self.batches.append(list(calls))
        outs = []
        for i, (state, n) in enumerate(calls):
            worker = self.worker_of.setdefault(state, f"w{i}")
            out = self.oracle(state, n)
            outs.append(Outcome(samples=out.samples, failure=out.failure, worker=worker))
        return outs


def run(oracle: Oracle, k: int, **kwargs: object) -> tuple[SearchResult, Batches]:
    batches = Batches(oracle, k)
    result = search(
        oracle.units,
        oracle,
        workers=k,
        test_many=batches,
        **kwargs,  # type: ignore[arg-type]
    )
    return result, batches


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("n", [8, 16, 32, 64])
def test_single_culprit_in_log_k_plus_1_rounds(k: int, n: int) -> None:
    for seed in range(12):
        oracle = make_oracle(n, "single", seed)
        result, batches = run(oracle, k)
        assert result.outcome is SearchOutcome.FOUND
        assert {frozenset(c.units) for c in result.culprits} == set(oracle.causes)
        assert result.rounds <= rounds_bound(n, k), (seed, [t.round for t in result.trials])
        # The endpoints' round also carries the first split's k states (speculative).
        assert len(batches.batches[0]) <= 2 + k
        assert all(len(b) <= k for b in batches.batches[1:])


def test_endpoints_share_the_first_round_and_confirmations_share_one() -> None:
    units = unit_names(16)
    oracle = Oracle(units=units, causes=(frozenset({units[5]}),))
    result, _ = run(oracle, 2)
    first = [t for t in result.trials if t.round == 1]
    assert [t.purpose for t in first] == [
        "endpoint: good",
        "endpoint: bad",
        "isolate (speculative)",
        "isolate (speculative)",
    ]
    # The first split's states: the first 5 and the first 10 units on top of good.
    assert [len(t.state.applied) for t in first[2:]] == [5, 10]
    assert [t.verdict for t in first[2:]] == [Verdict.GOOD, Verdict.BAD]
    alone = next(t for t in result.trials if t.purpose == "confirm: alone")
    without = next(t for t in result.trials if t.purpose == "confirm: without")
    assert alone.round == without.round
    assert result.culprits[0].without is not None


@pytest.mark.parametrize("k", [2, 3, 8])
def test_no_state_is_measured_twice_and_batches_are_distinct(k: int) -> None:
    oracle = make_oracle(32, "single", 3, cv=0.05, drop=1.3)
    result, batches = run(oracle, k, repeats=1)
    assert result.outcome is SearchOutcome.FOUND
    for batch in batches.batches:
        assert len({s for s, _ in batch}) == len(batch)
        assert len(batch) <= k + 2
    # Each state is started once; later calls only add samples to the same trial.
    starts = Counter(b[0] for batch in batches.batches for b in batch)
    trial_states = {t.state for t in result.trials}
    assert set(starts) == trial_states
    for trial in result.trials:
        calls = [n for batch in batches.batches for s, n in batch if s == trial.state]
        assert sum(calls) == len(trial.samples)


def test_every_trial_of_a_state_names_one_worker_and_its_round() -> None:
    oracle = make_oracle(16, "single", 1)
    result, batches = run(oracle, 4)
    for trial in result.trials:
        assert trial.worker == batches.worker_of[trial.state]
        assert trial.round >= 1
    data = result.as_dict()
    assert data["rounds"] == result.rounds
    assert all("round" in t and "worker" in t for t in data["trials"])
    rounds = [t.round for t in result.trials]
    assert rounds == sorted(rounds)


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("seed", range(6))
def test_interaction_and_independent_culprits_as_with_one_worker(k: int, seed: int) -> None:
    inter = make_oracle(24, "interaction", seed)
    result, _ = run(inter, k)
    assert {frozenset(c.units) for c in result.culprits} == set(inter.causes)
    indep = make_oracle(24, "independent", seed)
    result, _ = run(indep, k, find_all=True)
    assert {frozenset(c.units) for c in result.culprits} == set(indep.causes)


@pytest.mark.parametrize("seed", range(4))
def test_unbuildable_states_are_never_blamed(seed: int) -> None:
    oracle = make_oracle(32, "unbuildable", seed)
    result, _ = run(oracle, 4, on_failure="skip")
    for culprit in result.culprits:
        assert frozenset(culprit.units) in set(oracle.causes)


def test_ordered_unit_is_narrowed_k_commits_at_a_time() -> None:
    units = unit_names(4)
    commits = [f"c{i:02d}" for i in range(40)]
    oracle = Oracle(units=units, causes=(frozenset({"u02"}),), first_bad={"u02": 27})
    one = search(units, oracle, ordered={"u02": commits})
    result, _ = run(oracle, 4, ordered={"u02": commits})
    narrowed = result.culprits[0].narrowed[0]
    assert narrowed.first_bad == 27 and narrowed.items == ("c27",)
    assert narrowed.evidence is not None
    assert result.rounds < one.rounds


def test_noise_never_yields_a_wrong_culprit_with_workers() -> None:
    for seed in range(30):
        oracle = make_oracle(16, "single", seed, cv=0.10, drop=3.0)
        result, _ = run(oracle, 4)
        for culprit in result.culprits:
            assert frozenset(culprit.units) in set(oracle.causes)


def test_budget_is_kept_with_workers() -> None:
    oracle = make_oracle(64, "single", 2)
    result, _ = run(oracle, 8, max_trials=6)
    assert result.outcome is SearchOutcome.ABORTED
    assert len(result.trials) <= 6
    assert all(t.samples or t.failure for t in result.trials)


def test_interrupt_in_a_round_aborts_with_what_is_known() -> None:
    oracle = make_oracle(16, "single", 0)
    seen = []

    def batch(calls: Sequence[tuple[State, int]]) -> list[Outcome]:
        seen.append(calls)
        if len(seen) == 3:
            raise KeyboardInterrupt
        return [oracle(s, n) for s, n in calls]

    result = search(oracle.units, oracle, workers=3, test_many=batch)
    assert result.outcome is SearchOutcome.ABORTED and result.interrupted


def test_replay_feeds_earlier_trials_back_with_workers() -> None:
    oracle = make_oracle(32, "single", 4)
    done, _ = run(oracle, 4)
    replay = {t.state: Outcome(samples=t.samples) for t in done.trials}
    again = Batches(oracle, 4)
    result = search(oracle.units, oracle, workers=4, test_many=again, replay=replay)
    assert again.batches == []
    assert [t.state for t in result.trials] == [t.state for t in done.trials]


def test_one_worker_with_a_batch_function_is_the_sequential_search() -> None:
    for seed in range(10):
        oracle = make_oracle(32, "single", seed, cv=0.05, drop=1.3)
        plain = search(oracle.units, make_oracle(32, "single", seed, cv=0.05, drop=1.3))
        batched, batches = run(oracle, 1)
        assert [t.state for t in plain.trials] == [t.state for t in batched.trials]
        assert [t.round for t in batched.trials] == list(range(1, len(batched.trials) + 1))
        assert all(len(b) == 1 for b in batches.batches) or not batches.batches


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        search(["a", "b"], make_oracle(2), workers=0)


def test_full_set_failing_fast_endpoints_with_workers() -> None:
    units = unit_names(8)

    def crash(state: State, n: int) -> Outcome:
        if units[6] in state.applied:
            return Outcome(failure="crash: CUDA error: no kernel image")
        return Outcome(samples=(12_000.0,) * n)

    result = search(units, crash, workers=4)
    assert result.outcome is SearchOutcome.FOUND
    assert result.culprits[0].units == (units[6],)
    assert result.culprits[0].alone.bad.verdict is Verdict.BAD


@pytest.mark.parametrize("workers", [2, 3])
def test_a_good_state_that_fails_at_once_leaves_the_speculated_states_unjudged(
    workers: int,
) -> None:
    # With workers free, states are measured beside the endpoints; when the good state fails
    # before its first sample there is no threshold to judge them by: no verdict, no crash.
    units = unit_names(6)

    def broken(state: State, n: int) -> Outcome:
        if not state.applied:
            return Outcome(failure="oom: killed by signal 9")
        return Outcome(samples=(12_000.0,) * n)

    trials: list[tuple[int, Verdict | None]] = []
    result = search(
        units,
        broken,
        workers=workers,
        progress=lambda e: (
            trials.append((len(e.trial.state.applied), e.trial.verdict))
            if e.trial is not None and e.trial.verdict is not None
            else None
        ),
    )
    assert result.outcome is SearchOutcome.NOT_REPRODUCED
    assert result.message.startswith("the good state fails here too (oom: killed by signal 9)")
    speculated = [v for n, v in trials if 0 < n < len(units)]
    assert speculated and set(speculated) == {Verdict.UNRESOLVED}
