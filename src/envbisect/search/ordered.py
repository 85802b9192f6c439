"""Ordered units (a git repo with the commits between good and bad) found guilty, bisected
over their item list with the rest of the culprit applied, skipping unmeasurable items the
way ``git bisect skip`` does (k items a round with k workers)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from envbisect.search.budget import Budget
from envbisect.search.result import EventKind, Evidence, Narrowed
from envbisect.search.samples import SampleCache
from envbisect.search.scheduler import Scheduler
from envbisect.search.state import Purpose, State, Units
from envbisect.search.verdict import Verdict
from envbisect.search.wording import Say, say


class CommitNarrower:
    """The narrowing phase of one search: ``ordered`` maps a unit to its items, oldest
    first, the last one being the bad state's."""

    def __init__(
        self,
        cache: SampleCache,
        scheduler: Scheduler,
        budget: Budget,
        units: Units,
        ordered: Mapping[str, tuple[str, ...]],
    ) -> None:
        self.cache = cache
        self.scheduler = scheduler
        self.budget = budget
        self.units = units
        self.ordered = ordered
        self.workers = scheduler.workers

    def narrow(self, core: frozenset[str]) -> tuple[Narrowed, ...]:
        """Each ordered unit of the culprit ``core``, bisected over its items."""
        out = []
        for unit in self.units.sorted(core):
            items = self.ordered.get(unit)
            if not items:
                continue
            out.append(self._narrow_one(core, unit, items))
        return tuple(out)

    def _narrow_one(self, core: frozenset[str], unit: str, items: tuple[str, ...]) -> Narrowed:
        if len(items) > 1:
            self.cache.emit(EventKind.PHASE, say(Say.BISECTING_ITEMS, unit=unit, items=len(items)))
        last = len(items) - 1

        def state_at(p: int) -> State:
            if p < 0:
                return State.of(core - {unit})
            return State.of(core, {unit: p} if p < last else None)

        lo, hi = -1, last  # state_at(lo) good, state_at(hi) bad
        skipped: set[int] = set()
        purpose = Purpose.NARROW.value + unit
        while hi - lo > 1:
            mid = (lo + hi) / 2
            choices = [p for p in range(lo + 1, hi) if p not in skipped]
            if not choices:
                break
            if self.workers > 1 and len(choices) > 1:
                lo, hi = self._narrow_round(choices, state_at, purpose, (lo, hi), skipped)
                continue
            self.budget.estimate_narrowing(len(choices), 1)
            p = min(choices, key=lambda q: (abs(q - mid), q))
            v = self.scheduler.measure(state_at(p), purpose)
            if v is Verdict.GOOD:
                lo = p
            elif v is Verdict.BAD:
                hi = p
            else:
                skipped.add(p)
        candidates = tuple(range(lo + 1, hi + 1))
        evidence = None
        # The rest of an interaction without this unit is good by inference (it lies inside
        # a state measured good) but may not have been measured itself: measure it for the
        # evidence.
        if len(candidates) == 1 and (
            lo >= 0 or self.scheduler.measure(state_at(lo), purpose) is Verdict.GOOD
        ):
            evidence = Evidence.of(
                self.scheduler.trial(state_at(lo)), self.scheduler.trial(state_at(hi))
            )
        return Narrowed(unit, candidates, tuple(items[p] for p in candidates), evidence)

    def _narrow_round(
        self,
        choices: list[int],
        state_at: Callable[[int], State],
        purpose: str,
        bounds: tuple[int, int],
        skipped: set[int],
    ) -> tuple[int, int]:
        """k-ary narrowing: k items spread over ``choices``, measured together; the new
        (good, bad) bounds. Unresolved items are added to ``skipped``."""
        lo, hi = bounds
        self.budget.estimate_narrowing(len(choices), self.workers)
        m = min(self.workers, len(choices))
        points = [choices[(i + 1) * len(choices) // (m + 1)] for i in range(m)]
        verdicts = self.scheduler.measure_many([(state_at(p), purpose) for p in points])
        marked = list(zip(points, verdicts, strict=True))
        skipped.update(p for p, v in marked if v is Verdict.UNRESOLVED)
        hi = min([p for p, v in marked if v is Verdict.BAD], default=hi)
        return max([lo, *(p for p, v in marked if v is Verdict.GOOD and p < hi)]), hi
