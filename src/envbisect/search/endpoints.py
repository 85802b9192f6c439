"""The endpoints: ∅ and the full set, each with at least 3 samples (which also estimates the
noise), sampled until their verdicts and a default threshold hold. Says why the regression
is not reproduced, when it is not."""

from __future__ import annotations

from collections.abc import Sequence

from envbisect.search.crashes import CrashWatch
from envbisect.search.recheck import LoadCheck
from envbisect.search.result import EventKind
from envbisect.search.samples import Record, SampleCache
from envbisect.search.scheduler import Scheduler
from envbisect.search.state import OnFailure, Purpose, State
from envbisect.search.threshold import Threshold
from envbisect.search.verdict import Verdict, median
from envbisect.search.wording import Reason, Say, say

# Every state costs one process, the endpoints too. Windows of one process vary less than
# processes do (H200: 0.2% against a few percent), so while the endpoints are closer than
# this factor the good state gets a second process: the between-process spread then enters
# the noise model every later verdict uses. Endpoints this far apart leave no verdict that a
# few percent could move (issue 32: endpoints measured once unless noise calls for more).
FAR_APART = 2.0


class Endpoints:
    """The endpoint phase of one search."""

    def __init__(
        self,
        cache: SampleCache,
        scheduler: Scheduler,
        threshold: Threshold,
        crashes: CrashWatch,
        load: LoadCheck,
        everything: frozenset[str],
    ) -> None:
        self.cache = cache
        self.scheduler = scheduler
        self.threshold = threshold
        self.crashes = crashes
        self.load = load
        self.everything = everything

    def measure(self, speculative: Sequence[tuple[State, str]] = ()) -> Reason | None:
        """Measure ∅ and the full set (with ``speculative`` states, when workers are free);
        return why the regression is not reproduced (``Say.UNFAITHFUL``: an endpoint could
        not be realized as recorded), or None."""
        self.cache.emit(EventKind.PHASE, say(Say.MEASURING_ENDPOINTS))
        good, bad = self.scheduler.start_round(
            [
                (State.of(()), Purpose.ENDPOINT_GOOD),
                (State.of(self.everything), Purpose.ENDPOINT_BAD),
            ],
            max(3, self.scheduler.repeats),
            speculative=speculative,
        )
        if good.untestable or bad.untestable:
            return self._unfaithful(good, bad)
        self.crashes.retry_good(good)
        self._second_process(good, bad)
        if not good.failure:
            # A recheck is judged like any measurement: with a failed full set there is no
            # default threshold from both medians, so set the one a failure sets first. A
            # failed good state ends the search below; nothing is worth measuring again.
            if bad.failure or not bad.samples:
                self.threshold.set_from_endpoints(good, bad)
            self.load.endpoints(good, bad)
        if (why := self._regime_and_settle(good, bad)) is not None:
            return why
        # The good state crashed in a later sample (the field's race strikes a warm cache
        # too, 2 runs in 10 on the H200): it ran clean before, so its rate is the baseline.
        late = self.crashes.crashed(good) and self.crashes.base is None
        if late and (why := self._regime_and_settle(good, bad)) is not None:
            return why
        if self.crashes.rate is None and self.crashes.on_failure is OnFailure.BAD:
            if self.crashes.crash_runs and bad.verdict is not Verdict.BAD:
                self.crashes.look(bad)
            # A crash in the runs above, or in the endpoints' more samples:
            if (
                self.crashes.crashed(bad)
                and (why := self._regime_and_settle(good, bad)) is not None
            ):
                return why
        self.scheduler.report(good)
        self.scheduler.report(bad)
        return self._not_reproduced(good, bad)

    def _second_process(self, good: Record, bad: Record) -> None:
        """A second process of the good state when both endpoints ran and the full set is
        slower, by less than ``FAR_APART`` (a failed one is judged by its failure)."""
        if good.failure or bad.failure or not good.samples or not bad.samples:
            return
        if len(good.samples) >= self.scheduler.cap(good):
            return
        g, b = median(good.samples), median(bad.samples)
        if b < g < FAR_APART * b:  # a full set no slower is not reproduced, whatever the noise
            self.scheduler.more(good)

    def _regime_and_settle(self, good: Record, bad: Record) -> Reason | None:
        """The crash regime over what the endpoints showed so far, then: a good state whose
        crash stands ends the search (its reason), else both endpoints are settled."""
        self.crashes.regime(good, bad)
        if good.failure:
            return self._failed_good(good, bad)
        good.verdict, bad.verdict = self._settle(good, bad)
        return None

    def _unfaithful(self, good: Record, bad: Record) -> Reason:
        for r in (good, bad):
            r.verdict = (
                self.threshold.decide(r) if r.failure or r.untestable else Verdict.UNRESOLVED
            )
            self.scheduler.report(r)
        failures = [(name, r.failure) for name, r in (("good", good), ("bad", bad)) if r.untestable]
        return say(Say.UNFAITHFUL, failures=failures)

    def _failed_good(self, good: Record, bad: Record) -> Reason:
        good.verdict = self.threshold.failed()
        self.scheduler.report(good)
        bad.verdict = self.threshold.failed() if bad.failure else Verdict.UNRESOLVED
        self.scheduler.report(bad)
        return say(Say.GOOD_FAILS, failure=good.failure)

    def _settle(self, good: Record, bad: Record) -> tuple[Verdict, Verdict]:
        """More samples of the endpoints until their verdicts (and a default threshold) hold."""
        while True:
            self.threshold.set_from_endpoints(good, bad)
            gv, bv = self.threshold.decide(good), self.threshold.decide(bad)
            if self.threshold.caller is None:
                # The default threshold moves with both medians: sample both until they are
                # settled and the threshold's own uncertainty is small next to the gap, since
                # every later verdict is measured against it.
                growable = [good, bad] if self.threshold.loose(good, bad) else []
            else:
                growable = [r for r, v in ((good, gv), (bad, bv)) if v is Verdict.UNRESOLVED]
            growable = [
                r for r in growable if not r.failure and len(r.samples) < self.scheduler.cap(r)
            ]
            if not growable:
                return gv, bv
            self.scheduler.more_many(growable)

    def _not_reproduced(self, good: Record, bad: Record) -> Reason | None:
        """Why the judged endpoints do not show the regression, or None when they do."""
        gv, bv = good.verdict, bad.verdict
        if bad.failure and bv is Verdict.UNRESOLVED:
            return say(Say.BAD_UNMEASURABLE, failure=bad.failure)
        if bv is Verdict.GOOD:
            return say(Say.BAD_FAST)
        if gv is Verdict.BAD:
            return say(Say.GOOD_SLOW)
        if gv is Verdict.UNRESOLVED or bv is Verdict.UNRESOLVED:
            return say(
                Say.UNCLEAR,
                good=median(good.samples),
                bad=median(bad.samples) if bad.samples else None,
                threshold=self.threshold.value,
                sigma=self.cache.noise().sigma,
                n=len(good.samples),
            )
        return None
