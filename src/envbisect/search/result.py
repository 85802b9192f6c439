"""What a search established: its trials, evidence, culprits and outcome, and the progress
events it reports on the way. Pure data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from envbisect.model.failure import Failure
from envbisect.search.crashrate import CrashRate
from envbisect.search.state import State
from envbisect.search.verdict import Verdict, ratio
from envbisect.search.wording import Reason


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
    # A cause the bad state hides (``search.masked``): bad alone, while everything but the
    # culprits found before it (these units, measured good) holds it and runs good.
    hidden_by: frozenset[str] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "units": list(self.units),
            "alone": self.alone.as_dict(),
            "without": self.without.as_dict() if self.without else None,
            "narrowed": [n.as_dict() for n in self.narrowed],
            "hidden_by": sorted(self.hidden_by) if self.hidden_by is not None else None,
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
    # The outcome's reason code and its data (``message`` is its wording).
    reason: Reason | None = None

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
    """A progress report. ``trials_left`` is an estimate (None before the endpoints);
    ``message`` is the wording of ``reason``."""

    kind: EventKind
    message: str
    trial: Trial | None = None
    state: State | None = None
    trials_left: int | None = None
    reason: Reason | None = None
