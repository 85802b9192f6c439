"""Confirmation of an isolated culprit: alone on top of good it is bad (``Isolator``); here,
everything *but* it must be good. If that is still slow another cause remains; if it is fast
enough but clearly short of the good speed, a note says so."""

from __future__ import annotations

import math
from dataclasses import dataclass

from envbisect.search.recheck import PAIRED_ROUNDS, LoadCheck, Paired
from envbisect.search.result import Evidence
from envbisect.search.samples import SampleCache
from envbisect.search.scheduler import Scheduler
from envbisect.search.state import Purpose, State
from envbisect.search.verdict import Verdict, median
from envbisect.search.wording import Reason, Say, say


@dataclass(frozen=True)
class Without:
    """Everything but a culprit, measured: its ``verdict``; ``without`` (it vs the bad set it
    was isolated in) and ``restored`` (it vs everything) when it is good."""

    verdict: Verdict
    without: Evidence | None
    restored: Evidence | None


class Confirmation:
    """The confirmation phase of one search."""

    def __init__(
        self,
        cache: SampleCache,
        scheduler: Scheduler,
        load: LoadCheck,
        everything: frozenset[str],
        *,
        find_all: bool,
    ) -> None:
        self.cache = cache
        self.scheduler = scheduler
        self.load = load
        self.everything = everything
        self.find_all = find_all

    def alone(self, core: frozenset[str]) -> Evidence:
        """∅ (good) vs ``core`` alone (bad)."""
        return Evidence.of(self.scheduler.trial(State.of(())), self.scheduler.trial(State.of(core)))

    def without(self, core: frozenset[str], bad: frozenset[str]) -> Without:
        """Measure everything in ``bad`` but ``core``."""
        remainder = State.of(bad - core)
        v = self.scheduler.measure(remainder, Purpose.CONFIRM_WITHOUT)
        if v is Verdict.BAD and self.load.recheck(remainder):
            v = self.cache[remainder].verdict
        if v is not Verdict.GOOD:
            return Without(v, None, None)
        trial = self.scheduler.trial(remainder)
        return Without(
            v,
            Evidence.of(trial, self.scheduler.trial(State.of(bad))),
            Evidence.of(trial, self.scheduler.trial(State.of(self.everything))),
        )

    def notes(self, core: frozenset[str], bad: frozenset[str], verdict: Verdict) -> list[Reason]:
        """What a culprit leaves open, once it is narrowed (its trials refine the noise)."""
        remainder = State.of(bad - core)
        if verdict is Verdict.GOOD:
            return self.shortfall(remainder)
        if verdict is Verdict.UNRESOLVED:
            return [say(Say.RESTORE_UNRESOLVED)]
        if self.find_all:
            return []
        failure = self.cache[remainder].failure
        if failure:
            return [say(Say.OTHERS_FAIL, failure=failure)]
        pair = self.load.paired(remainder)
        if pair is not None and pair.ratio() >= self._bar(pair):
            return [self._drifted("other changes slow it down too", pair)]
        return [say(Say.OTHERS_SLOW)]

    def _bar(self, pair: Paired) -> float:
        """The share of the good state's speed the threshold asks for (from the earlier
        good median; paired, the good state measured now stands for it)."""
        value = self.scheduler.threshold.value
        return value / pair.before if value and pair.before > 0 else 1.0

    def _drifted(self, claim: str, pair: Paired) -> Reason:
        return say(Say.DRIFTED, claim=claim, before=pair.before, now=pair.now, other=pair.other)

    def shortfall(self, restored: State) -> list[Reason]:
        """A note when reverting the culprits is fast enough but clearly short of good."""
        got, good = self.cache[restored], self.cache[State.of(())]
        if not got.samples or got.failure:
            return []
        noise = self.cache.noise()
        gap = math.log(median(good.samples)) - math.log(median(got.samples))
        se = math.hypot(noise.median_se(len(got.samples)), noise.median_se(len(good.samples)))
        if gap <= max(0.05, 2.5 * se):
            return []
        pair = self.load.paired(restored)
        if pair is not None and math.log(max(pair.now, 1e-12)) - math.log(
            max(pair.other, 1e-12)
        ) <= max(0.05, 2.5 * noise.median_se(PAIRED_ROUNDS)):
            return [self._drifted("smaller slowdowns stay", pair)]
        return [say(Say.SHORTFALL, got=median(got.samples), good=median(good.samples))]
