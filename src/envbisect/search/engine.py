"""The bisection engine: which of the changed units made training slow? Pure, no I/O.

A *state* is a set of units applied on top of the good state (``State``). The caller supplies
a test function ``test(state, n) -> Outcome`` that measures ``n`` more throughput samples of
that state (or reports why it could not: a ``failure.Failure``, ``"build: ..."``, ``"crash: ..."``,
``"timeout"``),
and the engine decides which states to measure:

1. **Endpoints.** ∅ and the full set, each with at least 3 samples (this also estimates the
   noise; more samples while either sits inside the noise band, or while the default
   threshold is loose next to the gap). If the full set is good,
   or ∅ is bad, or the two cannot be told apart, the outcome is ``NOT_REPRODUCED``.
2. **Threshold.** The caller's, or the geometric mean of the endpoint medians — refined as
   the search goes by pooling with each endpoint the states since judged at its speed (three
   unlucky endpoint samples would otherwise skew every later verdict; in-between speeds,
   from several causes of different size, are left out). When the full set fails rather
   than runs slow, a state that runs counts as slow below half the good speed. Verdicts:
   see ``envbisect.search.verdict``.
3. **Isolation** with Zeller's dd (the isolating variant, "+/-" — tests ``pass ∪ Δi`` and
   ``fail \\ Δi``). With conclusive verdicts it is binary splitting: a good half moves the
   good side up (the cause lies in the other half, relative to a state proven good), a bad
   half becomes the new bad side. Unresolved states (noise, or a failure with
   ``on_failure="skip"``) make it try the complement, then split finer, like ``git bisect
   skip``. Every step rests on two measured states, never on an assumption. Finer splits do
   not beat noise, so once a handful of states sit inside the noise band the search stops
   and says the drop is too small for the noise (``AMBIGUOUS``).
4. **Confirmation.** The isolated unit alone on top of good must be bad. If it is good, the
   cause is an interaction: the search isolates again with that unit applied, inside the
   last good state, until the collected units are bad together (each of them is needed:
   the set minus any one lies inside a state measured good). Then everything *but* the
   culprit must be good; if it is still slow another cause remains, which ``find_all=True``
   goes on to isolate the same way (if it is fast enough but clearly short of the good
   speed, the message says so). Once everything but the culprits runs good, ``find_all``
   runs each remaining group of units alone on top of good (``masked``): a change bad on
   its own that another change of the drift hides (the field's empty cache, whose crash
   the field's patch stops) is named too, as hidden.
5. **Ambiguity** is reported with the smallest state proven slow (``candidates``): when the
   culprit alone cannot be built or judged, the search narrows the units it was slow with.
6. **Ordered units** (a git repo with the commits between good and bad) found guilty are
   bisected over their commit list with the rest of the culprit applied, skipping
   unmeasurable commits the way ``git bisect skip`` does.

Every state is measured once; its samples and verdict are cached (more samples are added to
the same trial while its median is inside the noise band, up to ``max_samples``).

Public API:

- ``State(applied, positions)``, ``Outcome(samples, failure)``, ``TestFn``.
- ``search(units, test, settings, *, progress, replay, test_many, **settings_fields)
  -> SearchResult``; ``SearchSettings``: threshold, repeats, max_samples, max_trials,
  find_all, ordered, on_failure, threshold_fraction, workers.
- ``SearchResult``: ``outcome`` (``SearchOutcome``: found / ambiguous / not-reproduced /
  aborted), ``culprits`` (``Isolation``: units, evidence, narrowed commits), ``candidates``,
  ``restored`` (everything but the culprits, measured good), ``threshold``, ``noise``,
  ``trials`` (``Trial``: index, state, samples, median, verdict, failure, purpose),
  ``message``, ``interrupted``, ``reason`` (the message's code and data); ``as_dict()`` for
  JSON/YAML renderers.
- ``Event`` / ``EventKind``: progress (trial started, more samples, trial finished, phase),
  each with an estimate of the trials left and its ``reason``.
- ``Verdict`` (re-exported from ``verdict``).

Where each part lives (this module only wires them and runs the loop): the data types in
``state`` (``State``, ``Outcome``, ``SearchSettings``, ``Purpose``, ``OnFailure``) and
``result`` (``Trial``, ``Evidence``, ``Isolation``, ``SearchResult``, ``Event``); the sample
cache and the test-function calls in ``samples``; the trial budget in ``budget``; the
threshold and verdicts in ``threshold``; intermittent crashes in ``crashes``; one-at-a-time
and k-worker rounds in ``scheduler``; rechecks under load in ``recheck``; the phases in
``endpoints`` (1), ``isolate`` (3, 5), ``confirm`` (4) and ``ordered`` (6). No phase writes
a sentence: each returns or emits a reason code with its data, worded in ``wording``.

Argument mistakes (empty or duplicate units, a non-positive threshold, ...) raise
``ValueError``: they are programming errors of the caller, which validates user input first.
A ``KeyboardInterrupt`` raised by the test function ends the search with ``ABORTED`` and
``interrupted=True``, carrying everything known so far.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from envbisect.search.budget import Budget, Spent
from envbisect.search.confirm import Confirmation
from envbisect.search.crashes import CrashWatch
from envbisect.search.endpoints import Endpoints
from envbisect.search.isolate import Ambiguous, Isolator
from envbisect.search.masked import MaskedScreen
from envbisect.search.ordered import CommitNarrower
from envbisect.search.recheck import LoadCheck
from envbisect.search.result import (
    Event,
    EventKind,
    Evidence,
    Isolation,
    SearchOutcome,
    SearchResult,
)
from envbisect.search.samples import SampleCache
from envbisect.search.scheduler import ParallelScheduler, Scheduler
from envbisect.search.state import (
    BatchTestFn,
    OnFailure,
    Outcome,
    RateTestFn,
    SearchSettings,
    State,
    TestFn,
    Units,
)
from envbisect.search.threshold import Threshold
from envbisect.search.verdict import Verdict
from envbisect.search.wording import Reason, Say, say

__all__ = ["search"]


class _Engine:
    """One search: its phases wired to one sample cache, and the loop that runs them."""

    def __init__(
        self,
        units: Sequence[str],
        test: TestFn,
        settings: SearchSettings,
        *,
        progress: Callable[[Event], None] | None,
        replay: Mapping[State, Outcome],
        test_many: BatchTestFn | None = None,
        test_rate: RateTestFn | None = None,
        rate_width: Callable[[], int] | None = None,
    ) -> None:
        self.units = Units(units)
        everything = self.units.everything
        on_failure = OnFailure(settings.on_failure)
        self.find_all = settings.find_all
        self.budget = Budget(settings.max_trials)
        self.cache = SampleCache(
            test,
            self.budget,
            progress=progress,
            replay=replay,
            test_many=test_many,
            test_rate=test_rate,
        )
        self.threshold = Threshold(
            self.cache,
            everything,
            caller=settings.threshold,
            fraction=settings.threshold_fraction,
            on_failure=on_failure,
        )
        self.crashes = crashes = CrashWatch(
            self.cache,
            len(self.units),
            on_failure=on_failure,
            crash_runs=settings.crash_runs,
            rate_runs=settings.crash_rate_runs,
            rate_together=settings.rate_together,
            rate_width=rate_width,
        )
        sampling = {"repeats": settings.repeats, "max_samples": settings.max_samples}
        self.scheduler: Scheduler = (
            ParallelScheduler(
                self.cache,
                self.threshold,
                crashes,
                self.budget,
                **sampling,
                workers=settings.workers,
            )
            if settings.workers > 1
            else Scheduler(self.cache, self.threshold, crashes, self.budget, **sampling)
        )
        self.load = LoadCheck(
            self.cache, self.scheduler, everything, enabled=settings.recheck_loaded
        )
        self.endpoints = Endpoints(
            self.cache, self.scheduler, self.threshold, crashes, self.load, everything
        )
        ordered = {u: tuple(items) for u, items in (settings.ordered or {}).items()}
        self.isolator = Isolator(
            self.cache,
            self.scheduler,
            self.budget,
            self.units,
            ordered_sizes=tuple(len(items) for items in ordered.values()),
        )
        self.confirmation = Confirmation(
            self.cache, self.scheduler, self.load, everything, find_all=settings.find_all
        )
        self.narrower = CommitNarrower(self.cache, self.scheduler, self.budget, self.units, ordered)
        self.masked = MaskedScreen(
            self.cache, self.scheduler, self.isolator, crashes, self.confirmation, self.units
        )
        self.culprits: list[Isolation] = []  # found so far, for an aborted search

    def run(self) -> SearchResult:
        why = self.endpoints.measure(self.isolator.first_split())
        self.scheduler.settle_speculated(why is None)
        if why is not None:
            unfaithful = why.code is Say.UNFAITHFUL
            outcome = SearchOutcome.UNFAITHFUL if unfaithful else SearchOutcome.NOT_REPRODUCED
            return self._result(outcome, why, candidates=())
        bad = self.units.everything
        restored: Evidence | None = None
        notes: list[Reason] = []
        while True:
            self.cache.emit(EventKind.PHASE, say(Say.ISOLATING, units=len(bad)))
            try:
                core = self.isolator.find_core(bad)
            except Ambiguous as amb:
                count = len(amb.candidates)
                if self.culprits:
                    notes.append(say(Say.ANOTHER_CAUSE, units=count, why=amb.why))
                    return self._result(
                        SearchOutcome.FOUND, self._found(notes), amb.candidates, notes
                    )
                ambiguous = say(Say.AMBIGUOUS, units=count, why=amb.why)
                return self._result(SearchOutcome.AMBIGUOUS, ambiguous, amb.candidates)
            if self.load.recheck(State.of(core)):
                continue  # its slowness was the machine's load: search again
            self.crashes.culprit_rate(self.cache[State.of(core)])
            alone = self.confirmation.alone(core)
            without = self.confirmation.without(core, bad)
            if without.restored is not None:
                restored = without.restored
            units = tuple(self.units.sorted(core))
            # Recorded before narrowing, so that a budget spent there still reports it.
            self.culprits.append(Isolation(units, alone, without.without))
            narrowed = self.narrower.narrow(core)
            self.culprits[-1] = Isolation(units, alone, without.without, narrowed)
            notes.extend(self.confirmation.notes(core, bad, without.verdict))
            if without.verdict is not Verdict.BAD or not self.find_all:
                break
            bad = bad - core
        if self.find_all and without.verdict is Verdict.GOOD:
            # Everything but the culprits runs good: a cause another change hides is left.
            self.culprits.extend(self.masked.screen(bad - core))
        return self._result(SearchOutcome.FOUND, self._found(notes), (), notes, restored=restored)

    def _found(self, notes: Sequence[Reason]) -> Reason:
        return say(
            Say.FOUND,
            culprits=[c.units for c in self.culprits],
            notes=[*notes, *self.load.notes],
        )

    def _result(
        self,
        outcome: SearchOutcome,
        reason: Reason,
        candidates: Iterable[str],
        found_notes: Sequence[Reason] = (),
        *,
        restored: Evidence | None = None,
        interrupted: bool = False,
    ) -> SearchResult:
        noise = self.cache.noise().sigma if len(self.cache) else None
        return SearchResult(
            outcome=outcome,
            message=reason.text(),
            threshold=self.threshold.value,
            noise=noise,
            trials=self.cache.trials(),
            culprits=tuple(self.culprits),
            candidates=tuple(self.units.sorted(candidates)),
            restored=restored,
            interrupted=interrupted,
            notes=tuple(n.text() for n in (*found_notes, *self.load.notes)),
            reason=reason,
        )

    def aborted(self, why: Reason, *, interrupted: bool) -> SearchResult:
        found = self._found([]) if self.culprits else None
        candidates = self.isolator.candidates
        reason = say(Say.ABORTED, why=why, found=found, candidates=len(candidates))
        return self._result(SearchOutcome.ABORTED, reason, candidates, interrupted=interrupted)


def search(
    units: Sequence[str],
    test: TestFn,
    settings: SearchSettings | None = None,
    *,
    progress: Callable[[Event], None] | None = None,
    replay: Mapping[State, Outcome] | None = None,
    test_many: BatchTestFn | None = None,
    test_rate: RateTestFn | None = None,
    rate_width: Callable[[], int] | None = None,
    **options: Any,
) -> SearchResult:
    """Find the unit(s) whose application turns the good state slow.

    ``units``: unit ids, in the order splits should follow (related units next to each
    other split together). ``test(state, n)``: measure ``n`` more samples of ``state``.
    ``settings`` (or its fields as keywords, ``threshold=...``): see ``SearchSettings``.
    ``replay``: outcomes of states measured in an earlier, interrupted session; used instead
    of calling ``test``. With ``workers`` k > 1 the search proposes up to k states per round
    — both endpoints together, k-ary splits, both confirmations together, k commits at a
    time — and ``test_many([(state, n), ...])`` measures them (default: ``test`` on each in
    turn). With k = 1 the search is exactly the sequential one. ``test_rate(state, n)``:
    ``n`` processes of ``state`` at once for a culprit's crash rate (``rate_together``, or
    ``rate_width()`` asked each time when the caller sizes them as it goes).
    """
    settings = replace(settings or SearchSettings(), **options)
    settings.validate(units)
    engine = _Engine(
        units,
        test,
        settings,
        progress=progress,
        replay=replay or {},
        test_many=test_many,
        test_rate=test_rate,
        rate_width=rate_width,
    )
    try:
        return engine.run()
    except Spent:
        why = say(Say.BUDGET_SPENT, trials=settings.max_trials)
        return engine.aborted(why, interrupted=False)
    except KeyboardInterrupt:
        return engine.aborted(say(Say.INTERRUPTED), interrupted=True)
