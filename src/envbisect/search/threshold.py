"""The threshold between fast and slow, and the verdict on a measured state.

The caller's threshold, a fraction of the good endpoint's speed, or (default) the geometric
mean of the endpoint medians, refined as the search goes by pooling with each endpoint the
states since judged at its speed.
"""

from __future__ import annotations

import math

from envbisect.search.samples import Record, SampleCache
from envbisect.search.state import OnFailure, State
from envbisect.search.verdict import Judge, Noise, Verdict, default_threshold, median


class Threshold:
    """The threshold of one search (``value``) and the verdicts judged against it."""

    def __init__(
        self,
        cache: SampleCache,
        everything: frozenset[str],
        *,
        caller: float | None,
        fraction: float | None,
        on_failure: OnFailure,
    ) -> None:
        self.cache = cache
        self.everything = everything
        # The caller's threshold, or one fixed as a fraction of the good endpoint.
        self.caller = caller
        self.fraction = fraction
        self.on_failure = on_failure
        self.value: float | None = caller

    def judge(self) -> Judge:
        judge = self.judge_if_set()
        assert judge is not None, "judged before the endpoints set a threshold"
        return judge

    def judge_if_set(self) -> Judge | None:
        """The judge, or None while there is no threshold yet: no caller's, and endpoints
        that give none (the good state failed before its first sample)."""
        noise = self.cache.noise()
        se = 0.0
        if self.caller is None:
            good, bad = self.cache[State.of(())], self.cache[State.of(self.everything)]
            if good.samples and bad.samples and not bad.failure:
                self.value, se = default_threshold(*self.levels(good, bad, noise), noise)
        if self.value is None:
            return None
        return Judge(self.value, noise, threshold_se=se)

    def levels(self, good: Record, bad: Record, noise: Noise) -> tuple[list[float], list[float]]:
        """Samples at the good and at the bad speed: the endpoints', and every state's since
        judged good or bad. Pooling them refines the default threshold as the search goes:
        three unlucky samples of an endpoint would otherwise skew every later verdict."""
        fast, slow = list(good.samples), list(bad.samples)
        for rec in self.cache:
            if rec is good or rec is bad or rec.failure or rec.verdict is Verdict.UNRESOLVED:
                continue
            level = good if rec.verdict is Verdict.GOOD else bad
            # Only states at the endpoint's own speed: with several causes of different
            # size, in-between speeds exist and must not drag the threshold along.
            gap = abs(math.log(median(rec.samples)) - math.log(median(level.samples)))
            se = math.hypot(noise.median_se(len(rec.samples)), noise.median_se(len(level.samples)))
            if gap <= max(0.02, 2.5 * se):
                (fast if level is good else slow).extend(rec.samples)
        return fast, slow

    def failed(self) -> Verdict:
        """The verdict on a state that could not be measured."""
        return Verdict.BAD if self.on_failure is OnFailure.BAD else Verdict.UNRESOLVED

    def decide(self, rec: Record) -> Verdict:
        if rec.untestable:
            return Verdict.UNRESOLVED
        if rec.failure:
            return self.failed()
        judge = self.judge_if_set()
        # No threshold (the search ends at its endpoints): a speculative state is no verdict.
        return Verdict.UNRESOLVED if judge is None else judge.verdict(rec.samples)

    def set_from_endpoints(self, good: Record, bad: Record) -> None:
        if self.fraction is not None and good.samples:
            # "70% of the good state": fixed as soon as the good state is measured, then
            # judged like a threshold the caller gave.
            self.caller = self.value = self.fraction * median(good.samples)
            return
        if self.caller is not None:
            return
        if bad.failure or not bad.samples:
            # The regression is a failure, not a slowdown: a state that runs at all counts
            # as slow only at under half the good speed.
            self.value = median(good.samples) / 2
        else:
            self.value = default_threshold(good.samples, bad.samples, self.cache.noise())[0]

    def loose(self, good: Record, bad: Record) -> bool:
        """Whether the default threshold is still too uncertain next to the endpoints' gap."""
        if bad.failure or not bad.samples:
            return False
        judge = self.judge()
        gap = math.log(median(good.samples)) - math.log(max(median(bad.samples), 1e-9))
        return (
            judge.verdict(good.samples) is Verdict.UNRESOLVED
            or judge.verdict(bad.samples) is Verdict.UNRESOLVED
            or (gap > 0 and judge.z * judge.threshold_se > gap / 6)
        )
