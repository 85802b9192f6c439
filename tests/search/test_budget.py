"""The trial budget and the estimate of the trials left."""

from __future__ import annotations

import pytest

from envbisect.search.budget import Budget, Spent, log2ceil


def test_the_budget_refuses_a_trial_past_max_trials() -> None:
    budget = Budget(3)
    budget.check(2)
    assert budget.room(1) == 2
    with pytest.raises(Spent):
        budget.check(3)


def test_no_limit_never_spends() -> None:
    budget = Budget(None)
    budget.check(10_000)
    assert budget.room(10_000) is None


def test_the_estimate_counts_down_and_stops_at_zero() -> None:
    budget = Budget(None)
    budget.finished_one()
    assert budget.left is None  # no estimate before isolation
    budget.estimate_isolation(8, 1, ())
    assert budget.left == log2ceil(8) + 2 == 5
    for _ in range(7):
        budget.finished_one()
    assert budget.left == 0


def test_the_isolation_estimate_counts_rounds_of_workers_and_ordered_units() -> None:
    budget = Budget(None)
    budget.estimate_isolation(16, 3, (7,))  # ⌈log4 16⌉ = 2 rounds, +1 of confirmations
    assert budget.left == (2 + 1) * 3 + log2ceil(8)
    budget.estimate_narrowing(7, 1)
    assert budget.left == 3
    budget.estimate_narrowing(15, 3)
    assert budget.left == 2
