"""What the search measures and how: a state (units applied on top of good), the test
function's outcome, and the settings of a search. Pure data, no I/O."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class OnFailure(str, Enum):
    """What a state that cannot be measured counts as: the regression (``BAD``) or
    unresolved (``SKIP``, split around)."""

    BAD = "bad"
    SKIP = "skip"


class Purpose(str, Enum):
    """Why a state is measured (a trial's ``purpose``); an ordered unit's items are
    measured for ``NARROW`` followed by the unit (``narrow: <unit>``)."""

    ENDPOINT_GOOD = "endpoint: good"
    ENDPOINT_BAD = "endpoint: bad"
    ISOLATE = "isolate"
    SPECULATIVE = "isolate (speculative)"
    CONTEXT = "isolate: context"
    CONFIRM_ALONE = "confirm: alone"
    CONFIRM_WITHOUT = "confirm: without"
    SCREEN = "find-all: alone"  # a group the bad state may hide a cause in (search.masked)
    NARROW = "narrow: "

    @staticmethod
    def text(purpose: str) -> str:
        """``purpose`` as a trial records it (a member's value; other strings as they are)."""
        return purpose.value if isinstance(purpose, Purpose) else purpose


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
    # Runs for a crash rate alone (``RateTestFn``): whether they crashed counts, their
    # figures do not (processes sharing the machine), so no samples is no failure.
    rate_only: bool = False


TestFn = Callable[[State, int], Outcome]
# ``n`` processes of a state at once, for its crash rate: an Outcome with ``rate_only``.
RateTestFn = Callable[[State, int], Outcome]
# Several states at once, one worker each: (state, n) pairs in, outcomes in the same order.
BatchTestFn = Callable[[Sequence[tuple[State, int]]], Sequence[Outcome]]


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
    # (``recheck.LoadCheck``); off by default: it adds processes where load varies.
    recheck_loaded: bool = False
    # Runs of a culprit's own state that crashed, so that its crash rate is said (n of N).
    crash_rate_runs: int = 5
    # Of those runs, how many run at once (``RateTestFn``; 1: one after the other).
    rate_together: int = 1

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
        if self.crash_rate_runs < 1:
            raise ValueError("crash_rate_runs must be at least 1")
        if self.rate_together < 1:
            raise ValueError("rate_together must be at least 1")
        if self.repeats < 1:
            raise ValueError("repeats must be at least 1")
        if self.max_samples < max(3, self.repeats):
            raise ValueError("max_samples must be at least max(3, repeats)")
        if self.max_trials is not None and self.max_trials < 2:
            raise ValueError("max_trials must leave room for the two endpoints")
        if self.on_failure not in tuple(OnFailure):
            raise ValueError(f"on_failure must be 'bad' or 'skip', got {self.on_failure!r}")
        fraction = self.threshold_fraction
        if fraction is not None and (threshold is not None or not 0 < fraction < 1):
            raise ValueError("threshold_fraction is a fraction in (0, 1), instead of a threshold")


class Units:
    """The units of one search, in the order splits follow (``sorted`` keeps it)."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.ids = tuple(ids)
        self.rank = {u: i for i, u in enumerate(self.ids)}
        self.everything = frozenset(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def sorted(self, units: Iterable[str]) -> list[str]:
        return sorted(units, key=self.rank.__getitem__)
