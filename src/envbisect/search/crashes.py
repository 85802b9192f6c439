"""Intermittent crashes: once the bad endpoint has crashed, its crash rate, and every state
that runs clean run until such a rate would have shown (see ``crashrate``)."""

from __future__ import annotations

from envbisect.search.crashrate import CrashRate, clear_confidence, runs_to_clear
from envbisect.search.result import EventKind
from envbisect.search.samples import Record, SampleCache
from envbisect.search.state import OnFailure
from envbisect.search.wording import Say, say


class CrashWatch:
    """The crash regime of one search: ``rate`` is the bad endpoint's, once it crashed."""

    def __init__(
        self,
        cache: SampleCache,
        units: int,
        *,
        on_failure: OnFailure,
        crash_runs: int,
        rate_runs: int = 5,
    ) -> None:
        self.cache = cache
        self.units = units
        self.on_failure = on_failure
        self.crash_runs = crash_runs
        self.rate_runs = rate_runs
        self.rate: CrashRate | None = None
        self.clear_runs = 1

    def crashed(self, rec: Record) -> bool:
        return rec.crashes > 0 and not rec.untestable and self.on_failure is OnFailure.BAD

    def shown(self, rec: Record) -> CrashRate | None:
        """The crash rate a finished trial's line shows (None: none to show)."""
        return CrashRate(rec.crashes, rec.runs) if rec.crashes or self.rate else None

    def estimate(self, bad: Record) -> None:
        """The bad endpoint crashed: run it until its crash rate is estimated; from then on
        every state that runs clean is run until it would have shown such a rate."""
        while not CrashRate(bad.crashes, bad.runs).estimated():
            self.cache.emit(
                EventKind.MORE_SAMPLES,
                say(Say.CRASH_ESTIMATE, index=bad.index, rate=CrashRate(bad.crashes, bad.runs)),
                bad,
            )
            self.cache.call(bad, 1)
        self.rate = CrashRate(bad.crashes, bad.runs)
        confidence = clear_confidence(self.units)
        self.clear_runs = runs_to_clear(self.rate, confidence)
        self.cache.emit(
            EventKind.PHASE,
            say(Say.CRASH_REGIME, rate=self.rate, runs=self.clear_runs, confidence=confidence),
        )

    def regime(self, good: Record, bad: Record) -> None:
        """Once the bad endpoint has crashed: its rate, and the good endpoint cleared."""
        if self.rate is None and self.crashed(bad):
            self.estimate(bad)
            self.clear(good)

    def look(self, bad: Record) -> None:
        """A bad endpoint that is not slow: up to ``crash_runs`` runs looking for a crash."""
        while not bad.crashes and not bad.untestable and bad.runs < self.crash_runs:
            self.cache.emit(
                EventKind.MORE_SAMPLES,
                say(Say.LOOK_FOR_CRASH, index=bad.index, run=bad.runs + 1, of=self.crash_runs),
                bad,
            )
            self.cache.call(bad, 1)

    def clear(self, rec: Record) -> None:
        """Run a state that did not crash until a crash rate like the bad endpoint's would
        have shown (one run per call: a crash is per process)."""
        if self.rate is None or rec.untestable or rec.failure:
            return
        while not rec.failure and not rec.crashes and rec.runs < self.clear_runs:
            self.cache.emit(
                EventKind.MORE_SAMPLES,
                say(
                    Say.CLEAN_RUN,
                    index=rec.index,
                    runs=rec.runs,
                    of=self.clear_runs,
                    rate=self.rate,
                ),
                rec,
            )
            self.cache.call(rec, 1)

    def culprit_rate(self, rec: Record) -> None:
        """A culprit's own state crashed: run it until ``rate_runs`` runs, so that its line
        says a rate ("crashed 5 of 5"), not one crash."""
        while rec.crashes and not rec.untestable and rec.runs < self.rate_runs:
            self.cache.emit(
                EventKind.MORE_SAMPLES,
                say(
                    Say.CULPRIT_RATE,
                    index=rec.index,
                    rate=CrashRate(rec.crashes, rec.runs),
                    of=self.rate_runs,
                ),
                rec,
            )
            self.cache.call(rec, 1)
