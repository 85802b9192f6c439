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
        if not good.failure:
            # A recheck is judged like any measurement: with a failed full set there is no
            # default threshold from both medians, so set the one a failure sets first. A
            # failed good state ends the search below; nothing is worth measuring again.
            if bad.failure or not bad.samples:
                self.threshold.set_from_endpoints(good, bad)
            self.load.endpoints(good, bad)
        self.crashes.regime(good, bad)
        if good.failure:
            return self._failed_good(good, bad)
        good.verdict, bad.verdict = self._settle(good, bad)
        if self._good_crashed_late(good, bad):
            if good.failure:
                return self._failed_good(good, bad)
            good.verdict, bad.verdict = self._settle(good, bad)
        if self.crashes.rate is None and self.crashes.on_failure is OnFailure.BAD:
            if self.crashes.crash_runs and bad.verdict is not Verdict.BAD:
                self.crashes.look(bad)
            if self.crashes.crashed(bad):  # in the runs above, or in the endpoints' more samples
                self.crashes.regime(good, bad)
                if good.failure:
                    return self._failed_good(good, bad)
                good.verdict, bad.verdict = self._settle(good, bad)
        self.scheduler.report(good)
        self.scheduler.report(bad)
        return self._not_reproduced(good, bad)

    def _good_crashed_late(self, good: Record, bad: Record) -> bool:
        """The good state crashed in one of its later samples (the field's race strikes a
        warm cache too, 2 of 10 on the H200): it ran clean before, so its crash rate becomes
        the baseline rather than its verdict. True when the crash regime took it (or the
        crash stands: ``good.failure`` then says so)."""
        if not self.crashes.crashed(good) or self.crashes.base is not None:
            return False
        self.crashes.regime(good, bad)
        return True

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
            limit = self.scheduler.max_samples
            growable = [r for r in growable if not r.failure and len(r.samples) < limit]
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
