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
   speed, the message says so).
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
  ``message``, ``interrupted``; ``as_dict()`` for JSON/YAML renderers.
- ``Event`` / ``EventKind``: progress (trial started, more samples, trial finished, phase),
  each with an estimate of the trials left.
- ``Verdict`` (re-exported from ``verdict``).

Argument mistakes (empty or duplicate units, a non-positive threshold, ...) raise
``ValueError``: they are programming errors of the caller, which validates user input first.
A ``KeyboardInterrupt`` raised by the test function ends the search with ``ABORTED`` and
``interrupted=True``, carrying everything known so far.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from envbisect.model.failure import Failure, FailureKind
from envbisect.model.metric import format_ktok
from envbisect.search.crashrate import CrashRate, clear_confidence, runs_to_clear
from envbisect.search.verdict import Judge, Noise, Verdict, default_threshold, median, ratio

__all__ = [
    "BatchTestFn",
    "Event",
    "EventKind",
    "Evidence",
    "Isolation",
    "Narrowed",
    "Outcome",
    "SearchOutcome",
    "SearchResult",
    "SearchSettings",
    "State",
    "TestFn",
    "Trial",
    "Verdict",
    "search",
]


@dataclass(frozen=True)
class State:
    """Units applied on top of the good state.

    ``positions`` holds, for ordered units only, the index into that unit's ordered list
    (commits) it is applied at; an applied unit without a position is applied in full (at
    its last, bad item). Build states with ``State.of`` to get the canonical form that the
    cache relies on.
    """

    applied: frozenset[str]
    positions: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, applied: Iterable[str], positions: Mapping[str, int] | None = None) -> State:
        applied_set = frozenset(applied)
        pos = tuple(sorted((u, int(i)) for u, i in (positions or {}).items()))
        for unit, _ in pos:
            if unit not in applied_set:
                raise ValueError(f"position given for unit {unit!r}, which is not applied")
        return cls(applied_set, pos)

    def position(self, unit: str) -> int | None:
        return dict(self.positions).get(unit)

    def as_dict(self) -> dict[str, Any]:
        return {"applied": sorted(self.applied), "positions": dict(self.positions)}

    def describe(self) -> str:
        if not self.applied:
            return "good state (nothing applied)"
        pos = dict(self.positions)
        parts = [f"{u}@{pos[u]}" if u in pos else u for u in sorted(self.applied)]
        if len(parts) > 4:
            parts = [*parts[:3], f"… {len(parts) - 3} more"]
        return f"{len(self.applied)} applied: " + ", ".join(parts)


@dataclass(frozen=True)
class Outcome:
    """What one call of the test function measured: new samples (tok/s), or a failure.

    ``worker`` names the worker that measured it, when the caller runs several.
    """

    samples: tuple[float, ...] = ()
    failure: str | None = None  # read as a ``Failure`` (a plain string is given its kind)
    # The state could not be realized as asked (e.g. "state not faithful: ..."): whatever
    # ``on_failure`` says, it is unresolved, never counted as good or bad.
    untestable: bool = False
    worker: str | None = None
    # Processes run for these samples (0: one) and how many of them crashed (0 with a
    # crash failure: one); per sample, whether other processes loaded the machine meanwhile.
    runs: int = 0
    crashes: int = 0
    contended: tuple[bool, ...] = ()


TestFn = Callable[[State, int], Outcome]
# Several states at once, one worker each: (state, n) pairs in, outcomes in the same order.
BatchTestFn = Callable[[Sequence[tuple[State, int]]], Sequence[Outcome]]


class SearchOutcome(str, Enum):
    FOUND = "found"
    AMBIGUOUS = "ambiguous"
    NOT_REPRODUCED = "not-reproduced"
    UNFAITHFUL = "unfaithful"  # an endpoint could not be realized as recorded
    ABORTED = "aborted"


@dataclass(frozen=True)
class Trial:
    """One measured state. ``index`` is 1-based, in the order states were first measured.

    ``round`` is 1-based too: the states of one round were measured at the same time (with
    one worker, every trial is its own round); ``worker`` is the worker that measured it.
    """

    index: int
    state: State
    samples: tuple[float, ...]
    median: float | None
    verdict: Verdict
    failure: Failure | None = None
    purpose: str = ""
    round: int = 0
    worker: str | None = None
    runs: int = 0  # processes run (a crash ends one)
    crashes: int = 0
    contended: tuple[bool, ...] = ()  # per sample: taken while other processes loaded the box
    # Samples taken under load and set aside when the state was measured again (``samples``
    # holds the ones judged): shown, never judged.
    set_aside: tuple[float, ...] = ()

    @property
    def crash_rate(self) -> CrashRate:
        return CrashRate(self.crashes, self.runs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "state": self.state.as_dict(),
            "samples": list(self.samples),
            "median": self.median,
            "verdict": self.verdict.value,
            "failure": self.failure,
            "purpose": self.purpose,
            "round": self.round,
            "worker": self.worker,
            "runs": self.runs,
            "crashes": self.crashes,
            "contended": sum(self.contended),
        }


@dataclass(frozen=True)
class Evidence:
    """Two measured states that differ only by the culprit: ``good`` without, ``bad`` with.

    ``ratio`` is how many times slower the bad state ran (None if it failed to run).
    """

    good: Trial
    bad: Trial
    ratio: float | None

    @classmethod
    def of(cls, good: Trial, bad: Trial) -> Evidence:
        return cls(good, bad, ratio(good.samples, bad.samples) if not bad.failure else None)

    def as_dict(self) -> dict[str, Any]:
        return {"good": self.good.index, "bad": self.bad.index, "ratio": self.ratio}


@dataclass(frozen=True)
class Narrowed:
    """An ordered unit bisected over its items (commits).

    ``candidates`` are the positions that can still be the first bad one: one when found,
    several when unmeasurable (skipped) items hide the boundary.
    """

    unit: str
    candidates: tuple[int, ...]
    items: tuple[str, ...]
    evidence: Evidence | None

    @property
    def first_bad(self) -> int | None:
        return self.candidates[0] if len(self.candidates) == 1 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "first_bad": self.first_bad,
            "candidates": [
                {"position": p, "item": i} for p, i in zip(self.candidates, self.items, strict=True)
            ],
            "evidence": self.evidence.as_dict() if self.evidence else None,
        }


@dataclass(frozen=True)
class Isolation:
    """What isolation found: units that, applied alone on top of good, make it slow (the
    engine's result; ``runner.Culprit`` is a unit of it as a run presents it).

    One unit normally; several when they are slow only together (an interaction), each of
    them needed. ``alone``: ∅ (good) vs these units alone (bad). ``without``: everything but
    them (good) vs everything (bad) — for a later culprit of ``find_all``, everything but the
    culprits found before it — None when reverting them does not restore speed.
    """

    units: tuple[str, ...]
    alone: Evidence
    without: Evidence | None = None
    narrowed: tuple[Narrowed, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "units": list(self.units),
            "alone": self.alone.as_dict(),
            "without": self.without.as_dict() if self.without else None,
            "narrowed": [n.as_dict() for n in self.narrowed],
        }


@dataclass(frozen=True)
class SearchResult:
    """Everything the search established, in the order it was established."""

    outcome: SearchOutcome
    message: str
    threshold: float | None
    noise: float | None
    trials: tuple[Trial, ...]
    culprits: tuple[Isolation, ...] = ()
    candidates: tuple[str, ...] = ()
    restored: Evidence | None = None
    interrupted: bool = False
    # What a found culprit leaves open (others remain, reverting it falls short) and the
    # states measured again after samples under load: said under the culprit lines.
    notes: tuple[str, ...] = ()

    @property
    def samples(self) -> int:
        return sum(len(t.samples) for t in self.trials)

    @property
    def rounds(self) -> int:
        """How many rounds of simultaneous trials the search took."""
        return max((t.round for t in self.trials), default=0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "rounds": self.rounds,
            "message": self.message,
            "threshold": self.threshold,
            "noise_cv": self.noise,
            "culprits": [c.as_dict() for c in self.culprits],
            "candidates": list(self.candidates),
            "restored": self.restored.as_dict() if self.restored else None,
            "interrupted": self.interrupted,
            "trials": [t.as_dict() for t in self.trials],
        }


class EventKind(str, Enum):
    PHASE = "phase"
    TRIAL_STARTED = "trial-started"
    MORE_SAMPLES = "more-samples"
    TRIAL_FINISHED = "trial-finished"


@dataclass(frozen=True)
class Event:
    """A progress report. ``trials_left`` is an estimate (None before the endpoints)."""

    kind: EventKind
    message: str
    trial: Trial | None = None
    state: State | None = None
    trials_left: int | None = None


@dataclass(frozen=True)
class SearchSettings:
    """How a search measures and judges.

    ``threshold``: tok/s below which a state is slow (default: geometric mean of the
    endpoint medians); ``threshold_fraction`` (instead): slow means below this fraction of
    the good endpoint's median. ``repeats``: samples per state to start with (endpoints get
    at least 3); more are taken, two at a time, up to ``max_samples`` while the median is
    inside the noise band. ``max_trials``: budget of distinct states (endpoints included);
    when spent, the outcome is ``ABORTED``. ``find_all``: keep isolating while everything
    but the found culprits is still slow. ``ordered``: for units whose items (commits,
    oldest first, the last one being the bad state's) are known, the item list to bisect
    once guilty. ``on_failure``: a state that cannot be measured counts as ``"bad"`` (a
    crash is the regression) or is skipped (``"skip"``: unresolved, split around).
    ``workers``: how many states may be measured at the same time (k).
    """

    threshold: float | None = None
    repeats: int = 3
    max_samples: int = 9
    max_trials: int | None = None
    find_all: bool = False
    ordered: Mapping[str, Sequence[str]] | None = None
    on_failure: str = "bad"
    threshold_fraction: float | None = None
    workers: int = 1
    # Runs of a bad endpoint that is not slow spent looking for an intermittent crash
    # before the regression is called not reproduced (0: none).
    crash_runs: int = 0
    # Measure a state again when its bad verdict rests on samples taken under passing load
    # (``_recheck``); off by default: it adds processes where load varies.
    recheck_loaded: bool = False

    def validate(self, units: Sequence[str]) -> None:
        """ValueError for a mistake of the caller (which validates user input first)."""
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        if not units:
            raise ValueError("no units to bisect")
        if len(set(units)) != len(units):
            raise ValueError("unit ids must be unique")
        self._validate_numbers()
        for unit, items in (self.ordered or {}).items():
            if unit not in units:
                raise ValueError(f"ordered unit {unit!r} is not among the units")
            if not items:
                raise ValueError(f"ordered unit {unit!r} has no items")

    def _validate_numbers(self) -> None:
        threshold = self.threshold
        if threshold is not None and not (threshold > 0 and math.isfinite(threshold)):
            raise ValueError(f"threshold must be a positive number, got {threshold!r}")
        if self.repeats < 1:
            raise ValueError("repeats must be at least 1")
        if self.max_samples < max(3, self.repeats):
            raise ValueError("max_samples must be at least max(3, repeats)")
        if self.max_trials is not None and self.max_trials < 2:
            raise ValueError("max_trials must leave room for the two endpoints")
        if self.on_failure not in ("bad", "skip"):
            raise ValueError(f"on_failure must be 'bad' or 'skip', got {self.on_failure!r}")
        fraction = self.threshold_fraction
        if fraction is not None and (threshold is not None or not 0 < fraction < 1):
            raise ValueError("threshold_fraction is a fraction in (0, 1), instead of a threshold")


# -- engine ----------------------------------------------------------------------------------


class _Stop(Exception):
    """Internal: the trial budget is spent."""


@dataclass
class _Record:
    index: int
    state: State
    purpose: str
    samples: list[float] = field(default_factory=list)
    failure: Failure | None = None
    verdict: Verdict = Verdict.UNRESOLVED
    untestable: bool = False
    round: int = 0
    worker: str | None = None
    runs: int = 0
    crashes: int = 0
    contended: list[bool] = field(default_factory=list)
    set_aside: list[float] = field(default_factory=list)

    def freeze(self) -> Trial:
        return Trial(
            index=self.index,
            state=self.state,
            samples=tuple(self.samples),
            median=median(self.samples) if self.samples else None,
            verdict=self.verdict,
            failure=self.failure,
            purpose=self.purpose,
            round=self.round,
            worker=self.worker,
            runs=self.runs,
            crashes=self.crashes,
            contended=tuple(self.contended),
            set_aside=tuple(self.set_aside),
        )


class _Ambiguous(Exception):
    """Internal: the cause is somewhere in ``candidates`` but the search cannot say where."""

    def __init__(self, candidates: frozenset[str], why: str) -> None:
        super().__init__(why)
        self.candidates = candidates
        self.why = why


def _k(tok_per_s: float | None) -> str:
    """Throughputs in messages, written as in every table: ``12.6 Ktok/s``."""
    return f"{format_ktok(tok_per_s)} Ktok/s"


def _log2ceil(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


class _Engine:
    def __init__(
        self,
        units: Sequence[str],
        test: TestFn,
        settings: SearchSettings,
        *,
        progress: Callable[[Event], None] | None,
        replay: Mapping[State, Outcome],
        test_many: BatchTestFn | None = None,
    ) -> None:
        self.units = tuple(units)
        self.rank = {u: i for i, u in enumerate(self.units)}
        self.all = frozenset(self.units)
        self.test = test
        self.caller_threshold = settings.threshold
        self.fraction = settings.threshold_fraction
        self.repeats = settings.repeats
        self.max_samples = settings.max_samples
        self.max_trials = settings.max_trials
        self.find_all = settings.find_all
        self.ordered = {u: tuple(items) for u, items in (settings.ordered or {}).items()}
        self.on_failure = settings.on_failure
        self.progress = progress
        self.replay = dict(replay)
        self.workers = settings.workers
        self.test_many = test_many
        self.round = 0
        self._speculated: list[_Record] = []  # measured ahead, judged once the endpoints are
        self.records: dict[State, _Record] = {}
        self.order: list[_Record] = []
        self.threshold: float | None = settings.threshold
        self.left: int | None = None
        self.too_noisy = 0
        # States whose bad verdict, taken under other processes' load, was measured again
        # (once each), and what that said (notes of the result).
        self._rechecked: set[State] = set()
        self.recheck_notes: list[str] = []
        self.found_notes: list[str] = []  # of the culprits found (``_found_message``)
        self.core: frozenset[str] = frozenset()
        # What is known so far, for an aborted search.
        self.candidates: frozenset[str] = self.all
        self.culprits: list[Isolation] = []
        self.unfaithful = False  # an endpoint could not be realized as recorded
        self.crash_runs = settings.crash_runs
        self.recheck_loaded = settings.recheck_loaded
        # The bad endpoint's crash rate, once it crashed (on_failure "bad"): every state
        # that runs clean is run ``clear_runs`` times (see ``crashrate``).
        self.crash: CrashRate | None = None
        self.clear_runs = 1

    # -- measuring -------------------------------------------------------------------------

    def _emit(self, kind: EventKind, message: str, rec: _Record | None = None) -> None:
        if self.progress is not None:
            self.progress(
                Event(
                    kind=kind,
                    message=message,
                    trial=rec.freeze() if rec else None,
                    state=rec.state if rec else None,
                    trials_left=self.left,
                )
            )

    def _call(self, rec: _Record, n: int) -> None:
        replayed = self.replay.pop(rec.state, None)
        if replayed is None and self.test_many is not None:
            self._call_many([(rec, n)])
            return
        self._take(rec, replayed if replayed is not None else self.test(rec.state, n))

    def _call_many(self, calls: Sequence[tuple[_Record, int]]) -> None:
        """Measure several states at once (one batch of the caller's workers)."""
        pending: list[tuple[_Record, int]] = []
        for rec, n in calls:
            replayed = self.replay.pop(rec.state, None)
            if replayed is not None:
                self._take(rec, replayed)
            else:
                pending.append((rec, n))
        if not pending:
            return
        if self.test_many is None:
            outs: Sequence[Outcome] = [self.test(rec.state, n) for rec, n in pending]
        else:
            outs = self.test_many([(rec.state, n) for rec, n in pending])
        if len(outs) != len(pending):
            raise TypeError(f"batch test function returned {len(outs)} outcomes for {len(pending)}")
        for (rec, _), out in zip(pending, outs, strict=True):
            self._take(rec, out)

    def _take(self, rec: _Record, out: Outcome) -> None:
        if not isinstance(out, Outcome):
            raise TypeError(f"test function returned {type(out).__name__}, not Outcome")
        if rec.worker is None:
            rec.worker = out.worker
        flags = (list(out.contended) + [False] * len(out.samples))[: len(out.samples)]
        pairs = zip(out.samples, flags, strict=True)
        kept = [(float(x), f) for x, f in pairs if math.isfinite(float(x))]
        good = [x for x, _ in kept]
        rec.samples.extend(good)
        rec.contended.extend(f for _, f in kept)
        rec.runs += max(1, out.runs)
        failure = Failure.of(out.failure) if out.failure else None
        crashed = failure is not None and failure.kind in (FailureKind.CRASH, FailureKind.TIMEOUT)
        rec.crashes += out.crashes or (1 if crashed else 0)
        if out.untestable:
            rec.untestable = True
        if failure:
            rec.failure = failure
        elif not good:
            rec.failure = Failure("no samples")

    def _noise(self) -> Noise:
        return Noise.from_groups(r.samples for r in self.order if not r.failure)

    def _judge(self) -> Judge:
        noise = self._noise()
        se = 0.0
        if self.caller_threshold is None:
            good, bad = self.records[State.of(())], self.records[State.of(self.all)]
            if good.samples and bad.samples and not bad.failure:
                self.threshold, se = default_threshold(*self._levels(good, bad, noise), noise)
        assert self.threshold is not None
        return Judge(self.threshold, noise, threshold_se=se)

    def _levels(self, good: _Record, bad: _Record, noise: Noise) -> tuple[list[float], list[float]]:
        """Samples at the good and at the bad speed: the endpoints', and every state's since
        judged good or bad. Pooling them refines the default threshold as the search goes:
        three unlucky samples of an endpoint would otherwise skew every later verdict."""
        fast, slow = list(good.samples), list(bad.samples)
        for rec in self.order:
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

    def _decide(self, rec: _Record) -> Verdict:
        if rec.untestable:
            return Verdict.UNRESOLVED
        if rec.failure:
            return Verdict.BAD if self.on_failure == "bad" else Verdict.UNRESOLVED
        return self._judge().verdict(rec.samples)

    def _new(self, state: State, purpose: str) -> _Record:
        if self.max_trials is not None and len(self.order) >= self.max_trials:
            raise _Stop
        rec = _Record(index=len(self.order) + 1, state=state, purpose=purpose, round=self.round)
        self.records[state] = rec
        self.order.append(rec)
        self._emit(
            EventKind.TRIAL_STARTED, f"trial {rec.index}: {state.describe()} ({purpose})", rec
        )
        return rec

    def _start(self, state: State, purpose: str, n: int) -> _Record:
        self.round += 1
        rec = self._new(state, purpose)
        self._call(rec, n)
        return rec

    def _start_round(
        self,
        requests: Sequence[tuple[State, str]],
        n: int,
        speculative: Sequence[tuple[State, str]] = (),
    ) -> list[_Record]:
        """Start distinct, unmeasured states together as one round: as many of the first
        of them as there are workers (a state replayed from an earlier session takes none)
        and trials left in the budget, then the ``speculative`` ones (``repeats`` samples
        each; a worker that is done takes the next). With one worker, exactly ``_start``
        one after the other, and no speculation."""
        if self.workers == 1:
            return [self._start(state, purpose, n) for state, purpose in requests]
        left = None if self.max_trials is None else self.max_trials - len(self.order)
        if left is not None and left <= 0:
            raise _Stop
        room, take = self.workers, 0
        for state, _ in requests:
            if take == len(requests) or (left is not None and take >= left) or room == 0:
                break
            take += 1
            if state not in self.replay:
                room -= 1
        extra = [(s, p) for s, p in speculative if s not in self.records]
        if left is not None:
            extra = extra[: max(0, left - take)]
        self.round += 1
        batch = [self._new(state, purpose) for state, purpose in requests[:take]]
        spec = [self._new(state, purpose) for state, purpose in extra]
        self._call_many([(r, n) for r in batch] + [(r, self.repeats) for r in spec])
        self._speculated.extend(spec)
        return batch

    def _more(self, rec: _Record) -> None:
        n = min(2, self.max_samples - len(rec.samples))
        self._emit(EventKind.MORE_SAMPLES, f"trial {rec.index}: {n} more sample(s)", rec)
        self._call(rec, n)

    def _more_many(self, recs: Sequence[_Record]) -> None:
        """More samples of several trials, each on its own worker at the same time."""
        if self.workers == 1:
            for rec in recs:
                self._more(rec)
            return
        calls = []
        for rec in recs:
            n = min(2, self.max_samples - len(rec.samples))
            self._emit(EventKind.MORE_SAMPLES, f"trial {rec.index}: {n} more sample(s)", rec)
            calls.append((rec, n))
        for i in range(0, len(calls), self.workers):
            self._call_many(calls[i : i + self.workers])

    def _finish(self, rec: _Record) -> Verdict:
        rec.verdict = self._decide(rec)
        if self.left:
            self.left -= 1
        self._emit(EventKind.TRIAL_FINISHED, self._finished_text(rec), rec)
        return rec.verdict

    def _finished_text(self, rec: _Record) -> str:
        rate = CrashRate(rec.crashes, rec.runs)
        crashes = f"; {rate.describe()}" if rec.crashes or self.crash else ""
        if rec.failure:
            return f"trial {rec.index}: {rec.verdict.value} ({rec.failure}{crashes})"
        return (
            f"trial {rec.index}: {rec.verdict.value} (median {_k(median(rec.samples))} "
            f"of {len(rec.samples)} samples{crashes})"
        )

    # -- intermittent crashes ----------------------------------------------------------------

    def _crashed(self, rec: _Record) -> bool:
        return rec.crashes > 0 and not rec.untestable and self.on_failure == "bad"

    def _crash_rate(self, bad: _Record) -> None:
        """The bad endpoint crashed: run it until its crash rate is estimated; from then on
        every state that runs clean is run until it would have shown such a rate."""
        while not CrashRate(bad.crashes, bad.runs).estimated():
            self._emit(
                EventKind.MORE_SAMPLES,
                f"trial {bad.index}: {CrashRate(bad.crashes, bad.runs).describe()}; one "
                "more run to estimate its crash rate",
                bad,
            )
            self._call(bad, 1)
        self.crash = CrashRate(bad.crashes, bad.runs)
        self.clear_runs = runs_to_clear(self.crash, clear_confidence(len(self.units)))
        self._emit(
            EventKind.PHASE,
            f"the bad state {self.crash.describe()} runs: a state counts as not crashing "
            f"after {self.clear_runs} clean runs (a rate like that shows in them with "
            f"{clear_confidence(len(self.units)):.0%} probability)",
        )

    def _crash_regime(self, good: _Record, bad: _Record) -> None:
        """Once the bad endpoint has crashed: its rate, and the good endpoint cleared."""
        if self.crash is None and self._crashed(bad):
            self._crash_rate(bad)
            self._clear(good)

    def _look_for_crash(self, bad: _Record) -> None:
        """A bad endpoint that is not slow: up to ``crash_runs`` runs looking for a crash."""
        while not bad.crashes and not bad.untestable and bad.runs < self.crash_runs:
            self._emit(
                EventKind.MORE_SAMPLES,
                f"trial {bad.index}: not slow; run {bad.runs + 1} of {self.crash_runs} "
                "looking for an intermittent crash",
                bad,
            )
            self._call(bad, 1)

    def _clear(self, rec: _Record) -> None:
        """Run a state that did not crash until a crash rate like the bad endpoint's would
        have shown (one run per call: a crash is per process)."""
        if self.crash is None or rec.untestable or rec.failure:
            return
        while not rec.failure and not rec.crashes and rec.runs < self.clear_runs:
            self._emit(
                EventKind.MORE_SAMPLES,
                f"trial {rec.index}: clean run {rec.runs} of {self.clear_runs} needed "
                f"(the bad state {self.crash.describe()})",
                rec,
            )
            self._call(rec, 1)

    def measure(self, state: State, purpose: str) -> Verdict:
        """The verdict on ``state``, measuring it (once) if it is not cached."""
        cached = self.records.get(state)
        if cached is not None:
            if cached.verdict is Verdict.UNRESOLVED and not cached.failure:
                # The noise estimate and the default threshold have been refined since:
                # judge the same samples again.
                cached.verdict = self._decide(cached)
            return cached.verdict
        rec = self._start(state, purpose, self.repeats)
        while not rec.failure and self._judge().needs_more(rec.samples, self.max_samples):
            self._more(rec)
        self._clear(rec)
        return self._finish(rec)

    def measure_many(self, requests: Sequence[tuple[State, str]]) -> list[Verdict]:
        """Verdicts on several states, the unmeasured ones measured together (one round per
        ``workers`` of them, never the same state twice)."""
        fresh: list[tuple[State, str]] = []
        for state, purpose in requests:
            if state not in self.records and all(state != s for s, _ in fresh):
                fresh.append((state, purpose))
        while self.workers > 1 and len(fresh) > 1:
            recs = self._start_round(fresh, self.repeats)
            fresh = fresh[len(recs) :]
            self._settle(recs)
        return [self.measure(state, purpose) for state, purpose in requests]

    def _settle(self, recs: Sequence[_Record], *, sample: bool = True) -> None:
        """Finish a round's trials: while any of them (run, not failed) sits inside the noise
        band, more samples of those together; then their verdicts. ``sample=False``: the
        verdicts on the samples they have."""
        while sample:
            judge = self._judge()
            more = [
                r for r in recs if not r.failure and judge.needs_more(r.samples, self.max_samples)
            ]
            if not more:
                break
            self._more_many(more)
        for rec in recs:
            self._clear(rec)
            self._finish(rec)

    def trial(self, state: State) -> Trial:
        return self.records[state].freeze()

    def _load_varied(self) -> bool:
        """Whether some samples of this run were taken without other processes' load: only
        then is load a passing disturbance rather than the machine's steady state."""
        return any(not f for r in self.order for f in r.contended)

    def _mostly_loaded(self, rec: _Record) -> bool:
        """Most of ``rec``'s samples were taken under other processes' load, while other
        samples of the run were not (load varied: a busy moment, not the machine's state)."""
        return (
            self.recheck_loaded
            and not rec.failure
            and rec.state not in self._rechecked
            and 2 * sum(rec.contended) >= len(rec.samples) > 0
            and self._load_varied()
        )

    def _recheck(self, state: State) -> bool:
        """Measure ``state`` again when its bad verdict rests mostly on samples taken under
        load (``_mostly_loaded``): a busy moment makes any state look slow. Once per state;
        never an endpoint here (``_recheck_endpoints``). True when the verdict changed."""
        rec = self.records.get(state)
        if (
            rec is None
            or state in (State.of(()), State.of(self.all))
            or rec.verdict is not Verdict.BAD
            or not self._mostly_loaded(rec)
        ):
            return False
        before = rec.verdict
        after = self._measure_again(rec, "before relying on it")
        if after is not before:
            self.recheck_notes.append(
                f"trial {rec.index} measured again: {after.value} at "
                f"{_k(median(rec.samples)) if rec.samples else rec.failure}, not "
                f"{before.value} as its samples under load said"
            )
        return after is not before

    def _recheck_endpoints(self, good: _Record, bad: _Record) -> None:
        """An endpoint measured mostly under load while the other was not is measured again
        (the threshold comes from both): samples under load set aside, fresh ones taken."""
        for rec in (good, bad):
            if self._mostly_loaded(rec):
                self._measure_again(rec, "since the threshold rests on it")
                self.recheck_notes.append(
                    f"the {'good' if rec is good else 'bad'} endpoint was measured again: its "
                    f"first samples were taken under load; now {_k(median(rec.samples))}"
                    if rec.samples
                    else f"the endpoint of trial {rec.index} was measured again"
                )

    def _measure_again(self, rec: _Record, why: str) -> Verdict:
        """Set ``rec``'s samples under load aside and measure it until judged again."""
        self._rechecked.add(rec.state)
        loaded = sum(rec.contended)
        self._emit(
            EventKind.PHASE,
            f"trial {rec.index}: {loaded} of {len(rec.samples)} samples were taken while "
            f"other processes loaded the machine: measuring it again {why}",
        )
        rec.set_aside.extend(x for x, f in zip(rec.samples, rec.contended, strict=True) if f)
        rec.samples = [x for x, f in zip(rec.samples, rec.contended, strict=True) if not f]
        rec.contended = [False] * len(rec.samples)
        self._call(rec, max(1, self.repeats - len(rec.samples)))
        while not rec.failure and self._judge().needs_more(rec.samples, self.max_samples):
            self._more(rec)
        self._clear(rec)
        return self._finish(rec)

    # -- endpoints -------------------------------------------------------------------------

    def endpoints(self) -> str | None:
        """Measure ∅ and the full set; return why the regression is not reproduced, or None."""
        self._emit(EventKind.PHASE, "measuring the endpoints")
        good, bad = self._start_round(
            [(State.of(()), "endpoint: good"), (State.of(self.all), "endpoint: bad")],
            max(3, self.repeats),
            speculative=self._first_split(),
        )
        if good.untestable or bad.untestable:
            return self._unfaithful_endpoints(good, bad)
        self._recheck_endpoints(good, bad)
        self._crash_regime(good, bad)
        if good.failure:
            return self._failed_good(good, bad)
        good.verdict, bad.verdict = self._settle_endpoints(good, bad)
        if self.crash is None and self.on_failure == "bad":
            if self.crash_runs and bad.verdict is not Verdict.BAD:
                self._look_for_crash(bad)
            if self._crashed(bad):  # in the runs above, or in the endpoints' more samples
                self._crash_regime(good, bad)
                if good.failure:
                    return self._failed_good(good, bad)
                good.verdict, bad.verdict = self._settle_endpoints(good, bad)
        self._finish_endpoint(good)
        self._finish_endpoint(bad)
        return self._not_reproduced(good, bad)

    def _unfaithful_endpoints(self, good: _Record, bad: _Record) -> str:
        for r in (good, bad):
            r.verdict = self._decide(r) if r.failure or r.untestable else Verdict.UNRESOLVED
            self._finish_endpoint(r)
        self.unfaithful = True
        return "; ".join(
            f"the {name} state could not be realized as recorded ({r.failure})"
            for name, r in (("good", good), ("bad", bad))
            if r.untestable
        )

    def _failed_good(self, good: _Record, bad: _Record) -> str:
        good.verdict = Verdict.BAD if self.on_failure == "bad" else Verdict.UNRESOLVED
        self._finish_endpoint(good)
        bad.verdict = self._decide_bad_endpoint(bad)
        self._finish_endpoint(bad)
        return (
            f"the good state fails here too ({good.failure}): if its trial log shows it "
            "ran as recorded, the cause is outside the recorded software (see the "
            "non-bisectable changes); a failure of the realized state itself is not"
        )

    def _settle_endpoints(self, good: _Record, bad: _Record) -> tuple[Verdict, Verdict]:
        """More samples of the endpoints until their verdicts (and a default threshold) hold."""
        while True:
            self._set_threshold(good, bad)
            gv, bv = self._decide(good), self._decide(bad)
            if self.caller_threshold is None:
                # The default threshold moves with both medians: sample both until they are
                # settled and the threshold's own uncertainty is small next to the gap, since
                # every later verdict is measured against it.
                growable = [good, bad] if self._threshold_loose(good, bad) else []
            else:
                growable = [r for r, v in ((good, gv), (bad, bv)) if v is Verdict.UNRESOLVED]
            growable = [r for r in growable if not r.failure and len(r.samples) < self.max_samples]
            if not growable:
                return gv, bv
            self._more_many(growable)

    def _not_reproduced(self, good: _Record, bad: _Record) -> str | None:
        """Why the judged endpoints do not show the regression, or None when they do."""
        gv, bv = good.verdict, bad.verdict
        if bad.failure and bv is Verdict.UNRESOLVED:
            return (
                f"the full set of changes could not be measured ({bad.failure}); with "
                "on_failure='skip' a failure is not the regression"
            )
        if bv is Verdict.GOOD:
            return "the regression does not reproduce: the full set of changes runs fast here"
        if gv is Verdict.BAD:
            return (
                "the good state is slow here too — the cause is outside the recorded "
                "software: see the non-bisectable changes"
            )
        if gv is Verdict.UNRESOLVED or bv is Verdict.UNRESOLVED:
            g = _k(median(good.samples))
            b = _k(median(bad.samples)) if bad.samples else "no samples"
            return (
                f"the regression does not reproduce clearly: good state {g}, full set "
                f"{b}, threshold {_k(self.threshold)} are within the noise "
                f"(±{self._noise().sigma:.1%} per sample) after {len(good.samples)} samples"
            )
        return None

    def _threshold_loose(self, good: _Record, bad: _Record) -> bool:
        if bad.failure or not bad.samples:
            return False
        judge = self._judge()
        gap = math.log(median(good.samples)) - math.log(max(median(bad.samples), 1e-9))
        return (
            judge.verdict(good.samples) is Verdict.UNRESOLVED
            or judge.verdict(bad.samples) is Verdict.UNRESOLVED
            or (gap > 0 and judge.z * judge.threshold_se > gap / 6)
        )

    def _decide_bad_endpoint(self, bad: _Record) -> Verdict:
        if bad.failure:
            return Verdict.BAD if self.on_failure == "bad" else Verdict.UNRESOLVED
        return Verdict.UNRESOLVED

    def _finish_endpoint(self, rec: _Record) -> None:
        self._emit(EventKind.TRIAL_FINISHED, self._finished_text(rec), rec)

    def _set_threshold(self, good: _Record, bad: _Record) -> None:
        if self.fraction is not None and good.samples:
            # "70% of the good state": fixed as soon as the good state is measured, then
            # judged like a threshold the caller gave.
            self.caller_threshold = self.threshold = self.fraction * median(good.samples)
            return
        if self.caller_threshold is not None:
            return
        if bad.failure or not bad.samples:
            # The regression is a failure, not a slowdown: a state that runs at all counts
            # as slow only at under half the good speed.
            self.threshold = median(good.samples) / 2
        else:
            self.threshold = default_threshold(good.samples, bad.samples, self._noise())[0]

    # -- isolation (Zeller's dd, isolating variant) ----------------------------------------

    def _sorted(self, units: Iterable[str]) -> list[str]:
        return sorted(units, key=self.rank.__getitem__)

    def dd(
        self, passing: frozenset[str], failing: frozenset[str], purpose: str
    ) -> tuple[frozenset[str], frozenset[str]]:
        """Narrow (passing good, failing bad, passing ⊂ failing) to a 1-unit difference.

        Returns the final pair; their difference has more than one unit only when every
        split of it is unresolved.
        """
        n = 2
        # Finer splits help around unbuildable states, not against noise (every state is
        # as noisy): after this many states inside the noise band, stop and say so.
        noisy: set[State] = set()
        self.too_noisy = 0
        while True:
            delta = self._sorted(failing - passing)
            self.candidates = frozenset(delta) | self.core
            if len(delta) <= 1:
                return passing, failing
            if len(noisy) > max(4, _log2ceil(len(self.units))):
                self.too_noisy = len(noisy)
                return passing, failing
            self._estimate(len(delta))
            if self.workers > 1 and n == 2:
                moved = self._split_round(passing, failing, delta, purpose, noisy)
                if moved is not None:
                    passing, failing = moved
                    continue
            n = min(n, len(delta))
            parts = [
                frozenset(delta[i * len(delta) // n : (i + 1) * len(delta) // n]) for i in range(n)
            ]
            if self.workers > 1:
                self._prefetch(passing, failing, parts, purpose)
            passing, failing, step = self._lazy_step(passing, failing, parts, purpose, noisy)
            if step is not None:
                n = 2 if step else max(n - 1, 2)
                continue
            if n >= len(delta):
                return passing, failing
            n = min(2 * n, len(delta))

    def _lazy_step(
        self,
        passing: frozenset[str],
        failing: frozenset[str],
        parts: list[frozenset[str]],
        purpose: str,
        noisy: set[State],
    ) -> tuple[frozenset[str], frozenset[str], bool | None]:
        """Lazy dd: act on the first conclusive test. Testing passing ∪ Δi, then failing \\ Δi
        (the "+/-" of dd) means any conclusive verdict narrows the pair. Returns the pair and
        whether the cause is inside the Δi that moved it (None: every test unresolved)."""
        for part in parts:
            for state, inside in ((passing | part, True), (failing - part, False)):
                v = self.measure(State.of(state), purpose)
                if v is Verdict.UNRESOLVED:
                    if not self.records[State.of(state)].failure:
                        noisy.add(State.of(state))
                    continue
                # passing ∪ Δi bad, or failing \ Δi good: the cause is inside Δi (restart
                # at halves); otherwise only Δi is ruled out (Zeller: n - 1).
                step = (v is Verdict.BAD) == inside
                if v is Verdict.BAD:
                    return passing, state, step
                return state, failing, step
        return passing, failing, None

    def _chain(
        self, passing: frozenset[str], failing: frozenset[str], delta: list[str]
    ) -> list[frozenset[str]]:
        """``passing``, the k nested states of a k-ary split of ``delta``, ``failing``."""
        k = min(self.workers, len(delta) - 1)
        cuts = [(j * len(delta)) // (k + 1) for j in range(1, k + 1)]
        return [passing, *(passing | frozenset(delta[:c]) for c in cuts), failing]

    def _first_split(self) -> list[tuple[State, str]]:
        """The first k-ary split's states, measured speculatively with the endpoints (as
        Pinpoint does): a worker done with the good state takes them while the full set
        runs, and they are needed whenever the endpoints come out as expected."""
        if self.workers == 1 or len(self.units) < 2:
            return []
        chain = self._chain(frozenset(), self.all, self._sorted(self.units))
        return [(State.of(s), "isolate (speculative)") for s in chain[1:-1]]

    def _settle_speculated(self, reproduced: bool) -> None:
        """Judge the states measured with the endpoints (more samples only when the search
        goes on)."""
        recs, self._speculated = self._speculated, []
        self._settle(recs, sample=reproduced)

    def _split_round(
        self,
        passing: frozenset[str],
        failing: frozenset[str],
        delta: list[str],
        purpose: str,
        noisy: set[State],
    ) -> tuple[frozenset[str], frozenset[str]] | None:
        """One round of k-ary splitting with k workers: cut ``delta`` into k + 1 parts and
        measure the k nested states ``passing`` + the first j parts at once. The last good
        one before the first bad one is the new pair (one culprit among N: ⌈log_{k+1} N⌉
        rounds). None when every state of the round was unresolved."""
        chain = self._chain(passing, failing, delta)
        verdicts = self.measure_many([(State.of(s), purpose) for s in chain[1:-1]])
        marks = [Verdict.GOOD, *verdicts, Verdict.BAD]
        for state, v in zip(chain[1:-1], verdicts, strict=True):
            if v is Verdict.UNRESOLVED and not self.records[State.of(state)].failure:
                noisy.add(State.of(state))
        hi = marks.index(Verdict.BAD)
        lo = max(i for i in range(hi) if marks[i] is Verdict.GOOD)
        if (lo, hi) == (0, len(chain) - 1):
            return None
        return chain[lo], chain[hi]

    def _prefetch(
        self,
        passing: frozenset[str],
        failing: frozenset[str],
        parts: list[frozenset[str]],
        purpose: str,
    ) -> None:
        """Measure dd's next states in rounds of ``workers``, in the order the lazy loop
        tests them, until one is conclusive (the loop then reads them from the cache)."""
        states = [State.of(s) for part in parts for s in (passing | part, failing - part)]
        i = 0
        while i < len(states):
            batch: list[State] = []
            while i < len(states) and len(batch) < self.workers:
                if states[i] not in self.records and states[i] not in batch:
                    batch.append(states[i])
                i += 1
            self.measure_many([(st, purpose) for st in batch])
            if any(self.records[st].verdict is not Verdict.UNRESOLVED for st in states[:i]):
                return

    def _estimate(self, delta: int) -> None:
        ordered = max((_log2ceil(len(v) + 1) for v in self.ordered.values()), default=0)
        if self.workers > 1:
            rounds = math.ceil(math.log(delta, self.workers + 1)) if delta > 1 else 0
            self.left = (rounds + 1) * self.workers + ordered
            return
        self.left = _log2ceil(delta) + 2 + ordered

    def find_core(self, bad: frozenset[str]) -> frozenset[str]:
        """A minimal set of units that is bad alone, inside the bad set ``bad``."""
        core = self.core = frozenset()
        pool = bad
        start, end = self._first_pair(bad)
        while True:
            passing, failing = self.dd(
                core | start, core | (end if end is not None else pool), "isolate"
            )
            start = frozenset()
            end = None
            delta = failing - passing
            if len(delta) != 1:
                raise self._not_isolated(core, delta, failing)
            core = self.core = core | delta
            rest = passing - core
            self.candidates = core | rest  # until `core` alone is shown slow
            if not rest:
                return core  # `failing` is exactly the core, measured bad
            if self._bad_alone(core, failing, bad):
                return core
            # Good alone: the rest of the cause is inside the last good state; isolate it
            # with the core applied.
            pool = rest
            self._emit(
                EventKind.PHASE,
                f"{', '.join(self._sorted(core))} alone is fast: looking for what it needs",
            )

    def _first_pair(self, bad: frozenset[str]) -> tuple[frozenset[str], frozenset[str] | None]:
        """Where isolation inside ``bad`` starts: the largest state inside it already measured
        good (after a first culprit, that skips what its search already cleared) and, with
        several workers, the smallest one above that measured bad (None: ``bad`` itself)."""
        start = max(
            (
                r.state.applied
                for r in self.order
                if r.verdict is Verdict.GOOD and not r.state.positions and r.state.applied < bad
            ),
            key=len,
            default=frozenset(),
        )
        if self.workers == 1:
            return start, None
        # States measured speculatively along with the endpoints narrow the first pair.
        end = min(
            (
                r.state.applied
                for r in self.order
                if r.verdict is Verdict.BAD
                and not r.state.positions
                and start < r.state.applied <= bad
            ),
            key=len,
            default=None,
        )
        return start, end

    def _not_isolated(
        self, core: frozenset[str], delta: frozenset[str], failing: frozenset[str]
    ) -> _Ambiguous:
        """Why dd stopped short of one unit, with the smallest state known to hold the cause."""
        if self.too_noisy:
            return _Ambiguous(
                failing,
                f"{self.too_noisy} states stayed within the noise band (±"
                f"{self._noise().sigma:.1%} per sample) after up to {self.max_samples} "
                "samples: the drop is too small for this noise; allow more samples or "
                "quiet the machine",
            )
        # `failing` is proven slow and holds a whole cause; one of `delta` is part of it, the
        # rest of it (an interaction) may be among the others: shrink those.
        return _Ambiguous(
            self._shrink(core | delta, failing),
            f"one of {self._names(delta)} makes it slow, but every state between "
            "them was unresolved",
        )

    def _bad_alone(
        self, core: frozenset[str], failing: frozenset[str], bad: frozenset[str]
    ) -> bool:
        """Confirm ``core`` alone is slow (True) or fast (False: it needs more units);
        ``_Ambiguous`` when that cannot be judged."""
        if self.workers > 1:
            # The two confirmations in one round (the second is wasted if the core turns
            # out to need more units).
            self.measure_many(
                [(State.of(core), "confirm: alone"), (State.of(bad - core), "confirm: without")]
            )
        v = self.measure(State.of(core), "confirm: alone")
        if v is not Verdict.UNRESOLVED:
            return v is Verdict.BAD
        rec = self.records[State.of(core)]
        why = f"failed: {rec.failure}" if rec.failure else "is within the noise"
        found = self._shrink(core, failing)
        return_why = f"{self._names(core)} makes it slow, but {self._names(core)} alone {why}"
        if found != core:
            return_why += f"; it is slow together with {self._names(found - core)}"
        raise _Ambiguous(found, return_why)

    def _names(self, units: Iterable[str]) -> str:
        return ", ".join(self._sorted(units))

    def _shrink(self, keep: frozenset[str], bad: frozenset[str]) -> frozenset[str]:
        """A small measured-bad state between ``keep`` and ``bad`` (which is measured bad).

        Used when ``keep`` alone cannot be judged: dd from (keep, bad) treats ``keep`` as the
        good side without proof, but only ever returns a state measured bad, so the result
        still holds a whole cause; it just names far fewer bystanders than ``bad``.
        """
        if keep == bad:
            return bad
        self._emit(EventKind.PHASE, f"narrowing what {self._names(keep)} is slow with")
        return self.dd(keep, bad, "isolate: context")[1]

    # -- ordered units ---------------------------------------------------------------------

    def narrow(self, core: frozenset[str]) -> tuple[Narrowed, ...]:
        out = []
        for unit in self._sorted(core):
            items = self.ordered.get(unit)
            if not items:
                continue
            out.append(self._narrow_one(core, unit, items))
        return tuple(out)

    def _narrow_one(self, core: frozenset[str], unit: str, items: tuple[str, ...]) -> Narrowed:
        if len(items) > 1:
            self._emit(EventKind.PHASE, f"{unit} is guilty: bisecting its {len(items)} items")
        last = len(items) - 1

        def state_at(p: int) -> State:
            if p < 0:
                return State.of(core - {unit})
            return State.of(core, {unit: p} if p < last else None)

        lo, hi = -1, last  # state_at(lo) good, state_at(hi) bad
        skipped: set[int] = set()
        while hi - lo > 1:
            mid = (lo + hi) / 2
            choices = [p for p in range(lo + 1, hi) if p not in skipped]
            if not choices:
                break
            if self.workers > 1 and len(choices) > 1:
                lo, hi = self._narrow_round(choices, state_at, f"narrow: {unit}", (lo, hi), skipped)
                continue
            self.left = _log2ceil(len(choices) + 1)
            p = min(choices, key=lambda q: (abs(q - mid), q))
            v = self.measure(state_at(p), f"narrow: {unit}")
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
            lo >= 0 or self.measure(state_at(lo), f"narrow: {unit}") is Verdict.GOOD
        ):
            evidence = Evidence.of(self.trial(state_at(lo)), self.trial(state_at(hi)))
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
        self.left = math.ceil(math.log(len(choices) + 1, self.workers + 1))
        m = min(self.workers, len(choices))
        points = [choices[(i + 1) * len(choices) // (m + 1)] for i in range(m)]
        verdicts = self.measure_many([(state_at(p), purpose) for p in points])
        marked = list(zip(points, verdicts, strict=True))
        skipped.update(p for p, v in marked if v is Verdict.UNRESOLVED)
        hi = min([p for p, v in marked if v is Verdict.BAD], default=hi)
        return max([lo, *(p for p, v in marked if v is Verdict.GOOD and p < hi)]), hi

    # -- the whole search ------------------------------------------------------------------

    def run(self) -> SearchResult:
        why = self.endpoints()
        self._settle_speculated(why is None)
        if why is not None:
            outcome = SearchOutcome.UNFAITHFUL if self.unfaithful else SearchOutcome.NOT_REPRODUCED
            return self._result(outcome, why, candidates=())
        bad = self.all
        restored: Evidence | None = None
        notes: list[str] = []
        while True:
            self._emit(EventKind.PHASE, f"isolating among {len(bad)} units")
            try:
                core = self.find_core(bad)
            except _Ambiguous as amb:
                if self.culprits:
                    notes.append(f"another cause among {len(amb.candidates)} units: {amb.why}")
                    return self._result(
                        SearchOutcome.FOUND, self._found_message(notes), candidates=amb.candidates
                    )
                return self._result(
                    SearchOutcome.AMBIGUOUS,
                    f"the cause is among {len(amb.candidates)} units but cannot be isolated: "
                    f"{amb.why}",
                    candidates=amb.candidates,
                )
            if self._recheck(State.of(core)):
                continue  # its slowness was the machine's load: search again
            alone = Evidence.of(self.trial(State.of(())), self.trial(State.of(core)))
            remainder = bad - core
            v = self.measure(State.of(remainder), "confirm: without")
            if v is Verdict.BAD and self._recheck(State.of(remainder)):
                v = self.records[State.of(remainder)].verdict
            without = None
            if v is Verdict.GOOD:
                without = Evidence.of(self.trial(State.of(remainder)), self.trial(State.of(bad)))
                restored = Evidence.of(
                    self.trial(State.of(remainder)), self.trial(State.of(self.all))
                )
            units = tuple(self._sorted(core))
            # Recorded before narrowing, so that a budget spent there still reports it.
            self.culprits.append(Isolation(units, alone, without))
            self.culprits[-1] = Isolation(units, alone, without, self.narrow(core))
            if v is Verdict.GOOD:
                notes.extend(self._shortfall(State.of(remainder)))
                break
            if v is Verdict.UNRESOLVED:
                notes.append("whether reverting the culprits restores speed is unresolved")
                break
            if not self.find_all:
                failure = self.records[State.of(remainder)].failure
                notes.append(
                    f"everything but it fails too ({failure}): --find-all isolates why"
                    if failure
                    else "reverting it alone does not restore speed: other changes slow it "
                    "down too (--find-all isolates them)"
                )
                break
            bad = remainder
        return self._result(
            SearchOutcome.FOUND, self._found_message(notes), candidates=(), restored=restored
        )

    def _shortfall(self, restored: State) -> list[str]:
        """A note when reverting the culprits is fast enough but clearly short of good."""
        got, good = self.records[restored], self.records[State.of(())]
        if not got.samples or got.failure:
            return []
        noise = self._noise()
        gap = math.log(median(good.samples)) - math.log(median(got.samples))
        se = math.hypot(noise.median_se(len(got.samples)), noise.median_se(len(good.samples)))
        if gap <= max(0.05, 2.5 * se):
            return []
        return [
            f"reverting it brings back {_k(median(got.samples))}, not the good state's "
            f"{_k(median(good.samples))}: smaller slowdowns stay above the threshold "
            "(a higher threshold and --find-all would isolate them)"
        ]

    def _found_message(self, notes: list[str]) -> str:
        names = "; ".join(" + ".join(c.units) for c in self.culprits)
        msg = f"culprit: {names}" if len(self.culprits) == 1 else f"culprits: {names}"
        self.found_notes = list(notes)
        return "; ".join([msg, *notes, *self.recheck_notes])

    def _result(
        self,
        outcome: SearchOutcome,
        message: str,
        *,
        candidates: Iterable[str],
        restored: Evidence | None = None,
        interrupted: bool = False,
    ) -> SearchResult:
        noise = self._noise().sigma if self.order else None
        return SearchResult(
            outcome=outcome,
            message=message,
            threshold=self.threshold,
            noise=noise,
            trials=tuple(r.freeze() for r in self.order),
            culprits=tuple(self.culprits),
            candidates=tuple(self._sorted(candidates)),
            restored=restored,
            interrupted=interrupted,
            notes=(*self.found_notes, *self.recheck_notes),
        )

    def aborted(self, why: str, *, interrupted: bool) -> SearchResult:
        known = f"; found so far: {self._found_message([])}" if self.culprits else ""
        return self._result(
            SearchOutcome.ABORTED,
            f"{why}{known}; the cause is among {len(self.candidates)} units",
            candidates=self.candidates,
            interrupted=interrupted,
        )


def search(
    units: Sequence[str],
    test: TestFn,
    settings: SearchSettings | None = None,
    *,
    progress: Callable[[Event], None] | None = None,
    replay: Mapping[State, Outcome] | None = None,
    test_many: BatchTestFn | None = None,
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
    turn). With k = 1 the search is exactly the sequential one.
    """
    settings = replace(settings or SearchSettings(), **options)
    settings.validate(units)
    engine = _Engine(
        units, test, settings, progress=progress, replay=replay or {}, test_many=test_many
    )
    try:
        return engine.run()
    except _Stop:
        why = f"the budget of {settings.max_trials} trials is spent"
        return engine.aborted(why, interrupted=False)
    except KeyboardInterrupt:
        return engine.aborted("interrupted", interrupted=True)
