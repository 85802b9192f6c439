"""narrow.isolate_hunks: dd over hunks with an injected test function (no I/O)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import pytest

from envbisect.search.narrow import isolate_hunks
from envbisect.search.verdict import Verdict

G, B, U = Verdict.GOOD, Verdict.BAD, Verdict.UNRESOLVED


def oracle(
    slow: Iterable[int],
    *,
    needs: Iterable[int] = (),
    broken: Callable[[frozenset[int]], bool] = lambda s: False,
) -> tuple[Callable[[frozenset[int]], Verdict], list[frozenset[int]]]:
    """Bad when every hunk of ``slow`` is applied (with ``needs`` too when given);
    unresolved where ``broken``; records what was tested."""
    slow_set, need = frozenset(slow), frozenset(needs)
    calls: list[frozenset[int]] = []

    def test(subset: frozenset[int]) -> Verdict:
        calls.append(subset)
        if broken(subset):
            return U
        return B if slow_set <= subset and need <= subset else G

    return test, calls


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 16, 33])
def test_one_guilty_hunk_costs_at_most_ceil_log2_n_tests(n: int) -> None:
    for culprit in range(n):
        test, calls = oracle([culprit])
        found = isolate_hunks(n, test)
        assert found.culprit == culprit and found.candidates == (culprit,)
        assert len(calls) == len(set(calls)) == len(found.tested)
        assert frozenset() not in calls and frozenset(range(n)) not in calls
        # + 1: the hunk alone, when hunks before it were applied with it
        assert len(calls) <= math.ceil(math.log2(n)) + 1
        assert found.alone in (None, B)
        assert set(found.cleared) == set(range(n)) - {culprit}


def test_a_single_hunk_needs_no_test() -> None:
    test, calls = oracle([0])
    found = isolate_hunks(1, test)
    assert found.culprit == 0 and calls == []


def test_a_hunk_slow_only_with_another_is_named_with_its_context() -> None:
    # hunk 3 turns it slow, but only once hunk 0 (e.g. the definition it calls) is there
    test, _ = oracle([3], needs=[0])
    found = isolate_hunks(5, test)
    assert found.culprit == 3
    assert 0 in found.passing
    assert found.alone is G  # alone on the old content it is fast


def test_subsets_that_do_not_build_are_unresolved_and_split_around() -> None:
    # hunks 1 and 2 only build together (a helper and its call): a subset with exactly one
    # of them is unresolved. With the slow hunk elsewhere, dd splits around them ...
    test, calls = oracle([4], broken=lambda s: (1 in s) != (2 in s))
    found = isolate_hunks(6, test)
    assert found.culprit == 4
    # ... and when the slow hunk is one of them, the cause is said to be among the two.
    test, calls = oracle([1], broken=lambda s: (1 in s) != (2 in s))
    found = isolate_hunks(6, test)
    assert found.culprit is None and found.candidates == (1, 2)
    assert [v for _, v in found.tested].count(U) == 2
    assert found.cleared == (0, 3, 4, 5)


def test_when_every_split_is_unresolved_the_candidates_are_said() -> None:
    test, _ = oracle([0], broken=lambda s: True)
    found = isolate_hunks(4, test)
    assert found.culprit is None
    assert found.candidates == (0, 1, 2, 3)
    assert found.cleared == ()


def test_a_budget_ends_the_search_with_the_hunks_left() -> None:
    test, calls = oracle([6])
    found = isolate_hunks(8, test, budget=1)
    assert found.spent and len(calls) == 1
    assert found.culprit is None and 6 in found.candidates and len(found.candidates) == 4
    assert found.as_dict()["budget_spent"] is True


def test_no_hunks_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        isolate_hunks(0, lambda s: B)
