"""Below a guilty file version: which of its hunks makes it slow? Pure, no I/O.

(``isolate_hunks`` works on any n items whose subsets can be built: the package step
splits a guilty torch stack into its components with it; ``first_bad`` bisects ordered
items, the releases between two versions.)

``isolate_hunks(n, test)`` is Zeller's isolating delta debugging (dd with "+/-", as in the
change debugger) over the ``n`` hunks of one change: the caller's ``test(subset)`` says
whether the old content with that subset of hunks applied is good, bad or unresolved (a
subset that cannot be built or run is unresolved). The empty subset is known good and the
full one known bad (they are the two versions around the first bad commit), so neither is
tested. With conclusive verdicts it is binary splitting (⌈log2 n⌉ tests); an unresolved
half makes it test the complement, then split finer. Once one hunk separates a good subset
from a bad one, that hunk is the culprit; when the good subset is not empty, the hunk
alone on the old content is tested too (one test), to tell a culprit from a hunk that is
slow only together with others.

Every subset is tested at most once. A budget (tests) ends the search early, reporting the
hunks the cause is still among.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envbisect.search.verdict import Verdict

__all__ = ["FirstBad", "HunkIsolation", "HunkTestFn", "first_bad", "isolate_hunks"]

# The old content with the given hunks (0-based indices) applied: good, bad or unresolved.
HunkTestFn = Callable[[frozenset[int]], Verdict]


@dataclass(frozen=True)
class HunkIsolation:
    """What the search over hunks found.

    ``culprit``: the hunk (0-based) whose addition turns ``passing`` (measured or known
    good) into a bad state, or None when the search could not get down to one hunk:
    ``candidates`` then holds the hunks the cause is among. ``alone``: the verdict on the
    culprit alone on the old content (GOOD means it is slow only with ``passing``; None
    when ``passing`` is empty, so the culprit alone is the bad state itself). ``tested``:
    every subset tested, in order, with its verdict.
    """

    n: int
    culprit: int | None
    passing: frozenset[int]
    candidates: tuple[int, ...]
    alone: Verdict | None
    tested: tuple[tuple[frozenset[int], Verdict], ...]
    spent: bool = False  # the budget ended the search

    @property
    def cleared(self) -> tuple[int, ...]:
        """The hunks shown not to be the culprit (all but the culprit, or the candidates)."""
        keep = {self.culprit} if self.culprit is not None else set(self.candidates)
        return tuple(i for i in range(self.n) if i not in keep)

    def as_dict(self) -> dict[str, Any]:
        return {
            "hunks": self.n,
            "culprit": self.culprit,
            "with": sorted(self.passing),
            "candidates": list(self.candidates),
            "alone": self.alone.value if self.alone is not None else None,
            "tests": len(self.tested),
            "budget_spent": self.spent,
        }


class _Spent(Exception):
    """Internal: the test budget is spent."""


class _Tester:
    """The caller's test with a cache and a budget."""

    def __init__(self, test: HunkTestFn, budget: int | None) -> None:
        self.test = test
        self.budget = budget
        self.seen: dict[frozenset[int], Verdict] = {}

    def __call__(self, subset: frozenset[int]) -> Verdict:
        if subset not in self.seen:
            if self.budget is not None and len(self.seen) >= self.budget:
                raise _Spent
            self.seen[subset] = self.test(subset)
        return self.seen[subset]


def _parts(delta: list[int], k: int) -> list[frozenset[int]]:
    """``delta`` cut into ``k`` contiguous parts of near-equal size (file order kept, so
    neighbouring hunks, which often need each other, stay together)."""
    k = min(k, len(delta))
    return [frozenset(delta[i * len(delta) // k : (i + 1) * len(delta) // k]) for i in range(k)]


def _step(
    test: _Tester, passing: frozenset[int], failing: frozenset[int], k: int
) -> tuple[frozenset[int], frozenset[int]] | None:
    """One dd step at granularity ``k``: the narrower (passing, failing) pair, or None when
    every part and complement was unresolved."""
    for part in _parts(sorted(failing - passing), k):
        v = test(passing | part)
        if v is Verdict.BAD:
            return passing, passing | part
        if v is Verdict.GOOD:
            return passing | part, failing
        v = test(failing - part)
        if v is Verdict.GOOD:
            return failing - part, failing
        if v is Verdict.BAD:
            return passing, failing - part
    return None


def isolate_hunks(n: int, test: HunkTestFn, *, budget: int | None = None) -> HunkIsolation:
    """The hunk (of ``n``) that makes the change slow; see the module docstring.

    ``test(subset)`` is called with subsets of ``range(n)``, never ∅ nor the full set.
    ``budget``: at most this many tests. ``n == 1`` needs no test."""
    if n < 1:
        raise ValueError("no hunks to isolate")
    tester = _Tester(test, budget)
    passing: frozenset[int] = frozenset()
    failing = frozenset(range(n))
    k = 2
    spent = False
    try:
        while len(failing - passing) > 1:
            pair = _step(tester, passing, failing, k)
            if pair is not None:
                passing, failing = pair
                k = 2
            elif k >= len(failing - passing):
                break
            else:
                k = min(2 * k, len(failing - passing))
    except _Spent:
        spent = True
    delta = sorted(failing - passing)
    culprit = delta[0] if len(delta) == 1 else None
    alone = None
    if culprit is not None and passing:
        try:
            alone = tester(frozenset({culprit}))
        except _Spent:
            spent = True
    return HunkIsolation(
        n=n,
        culprit=culprit,
        passing=passing,
        candidates=tuple(delta),
        alone=alone,
        tested=tuple(tester.seen.items()),
        spent=spent,
    )


@dataclass(frozen=True)
class FirstBad:
    """What the search over ordered items found: ``candidates``, the positions that can
    still be the first bad one (one when found; several when unresolved items hide the
    boundary or the budget ran out); ``tested``: every position tested, with its verdict."""

    n: int
    candidates: tuple[int, ...]
    tested: tuple[tuple[int, Verdict], ...]
    spent: bool = False

    @property
    def first_bad(self) -> int | None:
        return self.candidates[0] if len(self.candidates) == 1 else None


def first_bad(n: int, test: Callable[[int], Verdict], *, budget: int | None = None) -> FirstBad:
    """The first bad of ``n`` ordered items (releases), binary search like ``git bisect``:
    position -1 (before the first item) is known good and ``n - 1`` known bad, so neither
    is tested; an unresolved item is skipped (``git bisect skip``). At most ⌈log2 n⌉ tests
    with conclusive verdicts; ``budget``: at most this many."""
    if n < 1:
        raise ValueError("no items to search")
    lo, hi = -1, n - 1
    skipped: set[int] = set()
    tested: list[tuple[int, Verdict]] = []
    spent = False
    while hi - lo > 1:
        choices = [p for p in range(lo + 1, hi) if p not in skipped]
        if not choices:
            break
        if budget is not None and len(tested) >= budget:
            spent = True
            break
        mid = (lo + hi) / 2
        p = min(choices, key=lambda q: (abs(q - mid), q))
        v = test(p)
        tested.append((p, v))
        if v is Verdict.GOOD:
            lo = p
        elif v is Verdict.BAD:
            hi = p
        else:
            skipped.add(p)
    return FirstBad(n, tuple(range(lo + 1, hi + 1)), tuple(tested), spent)
