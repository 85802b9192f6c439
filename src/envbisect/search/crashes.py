"""Intermittent crashes: once the bad endpoint has crashed, its crash rate, and every state
that runs clean run until such a rate would have shown (see ``crashrate``).

When the good state itself crashes in some runs and runs clean in others (the field's race
with a warm cache: 2 of 10 processes on the H200), one crash proves nothing: its rate is the
baseline, and a state counts as crashing only when it crashes more often than that (a
one-sided Fisher test at the per-state confidence); otherwise its clean runs judge it."""

from __future__ import annotations

from collections.abc import Callable

from envbisect.model.failure import CRASH_KINDS
from envbisect.search.crashrate import (
    ESTIMATE_RUNS,
    CrashRate,
    clear_confidence,
    more_often,
    runs_to_clear,
)
from envbisect.search.result import EventKind
from envbisect.search.samples import Record, SampleCache
from envbisect.search.state import OnFailure
from envbisect.search.wording import RATE_RULES, Reason, Say, say


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
        rate_together: int = 1,
        rate_width: Callable[[], int] | None = None,
    ) -> None:
        self.cache = cache
        self.units = units
        self.on_failure = on_failure
        self.crash_runs = crash_runs
        self.rate_runs = rate_runs
        # How many crash-counting runs go at once: ``rate_width()`` when the caller sizes
        # them as it goes (``--rate-runs-at-once auto``: the first runs' memory), else fixed.
        self.width = rate_width or (lambda: rate_together)
        self.rate: CrashRate | None = None
        self.clear_runs = 1
        self.base: Record | None = None  # the good state, when it crashes now and then
        self.alpha = 1 - clear_confidence(units)  # a rate above the base's, at this level

    def crashed(self, rec: Record) -> bool:
        return rec.crashes > 0 and not rec.untestable and self.on_failure is OnFailure.BAD

    def shown(self, rec: Record) -> CrashRate | None:
        """The crash rate a finished trial's line shows (None: none to show)."""
        return CrashRate(rec.crashes, rec.runs) if rec.crashes or self.rate else None

    def estimate(self, bad: Record) -> None:
        """The bad endpoint crashed: run it until its crash rate is estimated; from then on
        every state that runs clean is run until it would have shown such a rate."""
        while not (rate := CrashRate(bad.crashes, bad.runs)).estimated():
            said = say(Say.CRASH_ESTIMATE, index=bad.index, rate=rate)
            self._more(bad, rate.runs_to_estimate(), said, bound=ESTIMATE_RUNS)
        self.rate = CrashRate(bad.crashes, bad.runs)
        confidence = clear_confidence(self.units)
        self.clear_runs = runs_to_clear(self.rate, confidence)
        self.cache.emit(
            EventKind.PHASE,
            say(Say.CRASH_REGIME, rate=self.rate, runs=self.clear_runs, confidence=confidence),
        )

    def regime(self, good: Record, bad: Record) -> None:
        """Once the bad endpoint has crashed: its rate, and the good endpoint cleared; a good
        endpoint that crashed but also ran clean becomes the baseline (``tolerate``)."""
        if self.rate is None and self.crashed(bad):
            self.estimate(bad)
            self.clear(good)
        self.tolerate(good, bad)

    def look(self, bad: Record) -> None:
        """A bad endpoint that is not slow: up to ``crash_runs`` runs looking for a crash."""
        while not bad.crashes and not bad.untestable and bad.runs < self.crash_runs:
            said = say(Say.LOOK_FOR_CRASH, index=bad.index, run=bad.runs + 1, of=self.crash_runs)
            self._more(bad, self.crash_runs, said)

    def clear(self, rec: Record, *, slow: bool = False) -> None:
        """Run a state that did not crash until a crash rate like the bad endpoint's would
        have shown (one run per call: a crash is per process). ``slow``: its samples judge
        it bad already, and clean runs would not change that (the own script's drift on the
        H200: 24 more processes of a state at 249 Ktok/s against a threshold of 441); where
        the good state crashes too, its crashes are still told from the good state's."""
        if slow and not rec.crashes and self.base is None:
            return
        if self.base is not None:
            self.against_base(rec)
            return
        if self.rate is None or rec.untestable or rec.failure:
            return
        while not rec.failure and not rec.crashes and rec.runs < self.clear_runs:
            said = say(
                Say.CLEAN_RUN, index=rec.index, runs=rec.runs, of=self.clear_runs, rate=self.rate
            )
            self._more(rec, self.clear_runs, said)

    def culprit_rate(self, rec: Record) -> None:
        """A culprit's own state crashed, or ran slow where the bad state crashes: run it
        until ``rate_runs`` runs, so that its line says a rate ("crashed 5 of 5"), not one
        crash; at once (``_more``) after two runs alone that crashed: the culprit line shows
        a clean run's figure where one comes."""
        # A slow culprit was not cleared (``clear``): where the bad state crashed, its own
        # runs go to ``rate_runs`` too, to say whether it crashes as well ("crashed 3 of 5").
        slow = self.rate is not None and self.base is None and rec.samples and not rec.failure
        wanted = rec.crashes or slow
        while wanted and not rec.untestable and rec.runs < self.rate_runs:
            self._once_more(rec, Say.CULPRIT_RATE, self.rate_runs, alone=2)

    def retry_good(self, good: Record) -> None:
        """The good state crashed in every run so far (the field's warm cache crashes 2 runs
        in 10): up to ``GOOD_TRIES`` runs, until one runs clean. Then its rate becomes the
        baseline (``tolerate``); a state that crashes every time stays failed."""
        if not self.crashed(good) or good.samples or self.base is not None:
            return
        while not good.samples and good.runs < GOOD_TRIES:
            self._once_more(good, Say.GOOD_RETRY, GOOD_TRIES)

    def _more(
        self, rec: Record, of: int, said: Reason, *, alone: int = 1, bound: int | None = None
    ) -> None:
        """One more run of ``rec`` toward ``of`` runs, said with ``said``; with ``width()``
        > 1 (``--rate-runs-at-once``) and a reason in ``AT_ONCE_WHY``, the runs left instead,
        up to ``width()`` processes at once (only whether each crashed counts: their figures
        are not kept), once the state has a figure of its own or ``alone`` runs one after
        the other (a clean run alone gives the figure its line shows). Each line says the
        phase's cost: the runs it may still take (up to ``bound``, default ``of``), and the
        rule that ends it (``RATE_RULES``)."""
        left = of - rec.runs
        width = self.width()
        why = AT_ONCE_WHY.get(said.code)
        at_once = bool(why) and width > 1 and left > 1 and bool(rec.samples or rec.runs >= alone)
        step = said
        if at_once:
            rate = CrashRate(rec.crashes, rec.runs)
            step = say(Say.RUNS_AT_ONCE, index=rec.index, rate=rate, runs=min(left, width), why=why)
        rule = RATE_RULES.get(said.code)
        if rule is not None:
            most = max(bound or of, of)
            step = say(
                Say.RATE_COST,
                step=step,
                left=most - rec.runs,
                width=width if at_once else 1,
                rule=rule(most),
            )
        self.cache.emit(EventKind.MORE_SAMPLES, step, rec)
        if at_once:
            self.cache.call_rate(rec, min(left, width))
        else:
            self.cache.call(rec, 1)

    def _once_more(self, rec: Record, why: Say, of: int, *, alone: int = 1) -> None:
        """One more run of ``rec`` (``_more``), said with its crash rate so far and the runs
        it goes to."""
        rate = CrashRate(rec.crashes, rec.runs)
        self._more(rec, of, say(why, index=rec.index, rate=rate, of=of), alone=alone)

    def tolerate(self, good: Record, bad: Record) -> None:
        """The good state crashed, but also ran clean: run it to ``BASE_RUNS`` for its rate,
        which becomes the baseline; the bad state is then judged against it like any other."""
        if self.base is not None or self.on_failure is not OnFailure.BAD:
            return
        if not good.crashes or not good.samples or good.untestable:
            return
        while good.runs < max(BASE_RUNS, self.rate_runs):
            said = say(Say.BASE_RATE, index=good.index, rate=CrashRate(good.crashes, good.runs))
            self._more(good, max(BASE_RUNS, self.rate_runs), said)
        self.base = good
        _forgive(good)
        self.cache.emit(
            EventKind.PHASE,
            say(Say.CRASH_BASELINE, rate=CrashRate(good.crashes, good.runs), alpha=self.alpha),
        )
        self.against_base(bad)

    def against_base(self, rec: Record) -> None:
        """Judge ``rec``'s crashes against the good state's: it crashes more often (bad, its
        crash the failure) or not (forgiven: its clean runs judge it). A state that has not
        crashed is run like in the plain regime, until the bad state's rate would show."""
        base = self.base
        if base is None or rec is base or rec.untestable:
            return
        base_rate = CrashRate(base.crashes, base.runs)
        while True:
            rate = CrashRate(rec.crashes, rec.runs)
            if not rec.crashes:
                if self.rate is None or rec.runs >= self.clear_runs or rec.failure:
                    return
            elif more_often(rate, base_rate) < self.alpha:
                return  # crashes more often than the good state: its crash is the failure
            elif rec.runs >= MAX_BASE_RUNS or (
                rec.runs >= self.rate_runs and rate.rate <= base_rate.rate
            ):
                _forgive(rec)
                return
            said = say(Say.AGAINST_BASE, index=rec.index, rate=rate, base=base_rate)
            self._more(rec, MAX_BASE_RUNS, said)


# Runs of a good state that crashes now and then, for its rate; a state's runs at most while
# its rate is told from that one.
BASE_RUNS = 8
# Runs of a good state that crashed every time so far before it counts as failing: a race
# that strikes 1 run in 5 crashes 4 in a row once in 625 tries.
GOOD_TRIES = 4
MAX_BASE_RUNS = 12


# What runs at once are for, by the reason the same run alone would be said with (a run
# said otherwise, a good state's retry for a figure, always goes alone).
AT_ONCE_WHY = {
    Say.CRASH_ESTIMATE: "to estimate its crash rate",
    Say.LOOK_FOR_CRASH: "looking for an intermittent crash",
    Say.CLEAN_RUN: "to clear it of the bad state's crash",
    Say.CULPRIT_RATE: "for the culprit's crash rate",
    Say.BASE_RATE: "for the good state's own crash rate",
    Say.AGAINST_BASE: "to tell its crash rate from the good state's",
}


def _forgive(rec: Record) -> None:
    """A state that crashed no more often than the good state: its clean runs judge it."""
    if rec.failure is not None and rec.failure.kind in CRASH_KINDS and rec.samples:
        rec.failure = None
