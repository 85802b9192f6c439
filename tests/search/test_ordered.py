"""An ordered unit found guilty, bisected over its items (commits)."""

from __future__ import annotations

import pytest
from helpers_oracle import Oracle
from helpers_search import wire

from envbisect.search.ordered import CommitNarrower
from envbisect.search.state import Outcome, State

UNITS = ("repo", "pkg")
COMMITS = tuple(f"c{i}" for i in range(8))


@pytest.mark.parametrize("workers", [1, 2])
def test_the_first_bad_commit_is_found_with_evidence(workers: int) -> None:
    truth = Oracle(UNITS, (frozenset({"repo"}),), first_bad={"repo": 5})
    w = wire(UNITS, truth, threshold=6000.0, workers=workers)
    narrower = CommitNarrower(w.cache, w.scheduler, w.budget, w.units, {"repo": COMMITS})
    [found] = narrower.narrow(frozenset({"repo"}))
    assert (found.unit, found.first_bad, found.items) == ("repo", 5, ("c5",))
    assert found.evidence is not None
    assert found.evidence.good.state == State.of({"repo"}, {"repo": 4})
    assert found.evidence.bad.state == State.of({"repo"}, {"repo": 5})
    assert w.messages()[0] == "repo is guilty: bisecting its 8 items"


def test_unmeasurable_commits_leave_candidates() -> None:
    def skips(state: State, n: int) -> Outcome:
        pos = state.position("repo")
        if pos in (3, 4):
            return Outcome(failure="build: broken commit")
        slow = "repo" in state.applied and (pos is None or pos >= 4)
        return Outcome(((4000.0 if slow else 12_000.0),) * n)

    w = wire(UNITS, skips, threshold=6000.0, on_failure="skip")
    narrower = CommitNarrower(w.cache, w.scheduler, w.budget, w.units, {"repo": COMMITS})
    [found] = narrower.narrow(frozenset({"repo"}))
    assert found.first_bad is None
    assert found.candidates == (3, 4, 5) and found.items == ("c3", "c4", "c5")
    assert found.evidence is None


def test_units_without_items_are_not_narrowed() -> None:
    w = wire(UNITS, Oracle(UNITS, (frozenset({"pkg"}),)), threshold=6000.0)
    narrower = CommitNarrower(w.cache, w.scheduler, w.budget, w.units, {"repo": COMMITS})
    assert narrower.narrow(frozenset({"pkg"})) == ()
