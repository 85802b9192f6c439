"""What a bisection found, as the commands and the report read it: ``RunResult``, its
``Culprit``s and the trial table's ``TrialRow``s, with the run's outcomes as enums.

``outlier`` says why a state's speed is itself a finding; ``trial_number`` numbers the
engine's trials as the session numbers them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbisect.model.events import TrialRecord
from envbisect.model.history import HunkCulprit
from envbisect.model.kernels import KernelDiff
from envbisect.model.session import state_key
from envbisect.run.launch import SmokeCommand
from envbisect.run.shown import show_value
from envbisect.search import Trial
from envbisect.search.verdict import Noise, median

if TYPE_CHECKING:
    from envbisect.diff import DiffResult, Unit
    from envbisect.search.pkgrun import PackageFinding


class TrialVerdict(str, Enum):
    """A trial as the trial table judges it: the engine's verdict (``search.verdict``), or
    ``-`` for a logged trial whose verdict was not logged yet."""

    GOOD = "good"
    BAD = "bad"
    UNRESOLVED = "unresolved"
    UNJUDGED = "-"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, text: object) -> TrialVerdict:
        """A logged or reported verdict (``None``, empty or unknown: not judged)."""
        try:
            return cls(str(text or "-"))
        except ValueError:
            return cls.UNJUDGED


@dataclass(frozen=True)
class TrialRow:
    """One trial as the run presents it: a row of the trial table, numbered as the session
    numbers trials (the engine's is ``search.Trial``, the logged one ``TrialRecord``)."""

    index: int
    applied: tuple[str, ...]
    samples: tuple[float, ...]
    median: float | None
    verdict: TrialVerdict
    failure: str | None = None
    outlier: str | None = None  # faster than good / slower than bad beyond the noise
    purpose: str = ""  # why the engine measured it: "endpoint: good", "confirm: alone", ...
    round: int = 0
    worker: str | None = None
    facts: Mapping[str, Any] | None = None  # its last run's (probe or drafter), if any
    runs: int = 0  # processes run; a crash ends one
    crashes: int = 0
    contended: int = 0  # samples taken while other processes loaded the machine
    loaded: tuple[bool, ...] = ()  # per sample: taken while other processes loaded it
    set_aside: tuple[float, ...] = ()  # samples under load, set aside when measured again
    # Where its time went (realize, start-up, compile, steps), the samples used, the shared
    # compile cache: envbisect.model.steps.trial_timing of its trial.json.
    timing: Mapping[str, Any] | None = None

    @property
    def crash_rate(self) -> str | None:
        """``crashed 2 of 6`` when a run of this state crashed."""
        return f"crashed {self.crashes} of {self.runs}" if self.crashes else None

    @classmethod
    def of(cls, trial: Trial, index: int, outlier: str | None) -> TrialRow:
        """The engine's trial, as trial ``index`` of the session."""
        return cls(
            index=index,
            applied=applied_names(trial.state.applied, trial.state.positions),
            samples=tuple(trial.samples),
            median=trial.median,
            verdict=TrialVerdict(trial.verdict.value),
            failure=trial.failure,
            outlier=outlier,
            purpose=trial.purpose,
            round=trial.round,
            worker=trial.worker,
            runs=trial.runs,
            crashes=trial.crashes,
            contended=sum(trial.contended),
            loaded=tuple(bool(x) for x in trial.contended),
            set_aside=tuple(trial.set_aside),
        )

    @classmethod
    def from_record(cls, rec: TrialRecord, verdict: Mapping[str, Any]) -> TrialRow:
        """A logged trial, judged as its logged ``verdict`` event says (``{}``: not yet)."""
        return cls(
            index=rec.index,
            applied=applied_names(rec.applied, rec.positions),
            samples=rec.samples,
            median=median(rec.samples) if rec.samples else None,
            verdict=TrialVerdict.of(verdict.get("verdict")),
            failure=rec.failure,
            outlier=verdict.get("outlier"),
            round=rec.round or 0,
            worker=rec.worker,
            runs=rec.runs,
            crashes=rec.crashes,
            contended=sum(rec.contended),
            loaded=tuple(bool(x) for x in rec.contended),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "purpose": self.purpose,
            "applied": list(self.applied),
            "samples": [round(s, 3) for s in self.samples],
            "median": None if self.median is None else round(self.median, 3),
            "verdict": self.verdict,
            "failure": self.failure,
            "outlier": self.outlier,
            "round": self.round,
            "worker": self.worker,
            "runs": self.runs,
            "crashes": self.crashes,
            "crash_rate": self.crash_rate,
            "contended_samples": self.contended,
            "set_aside_samples": [round(s, 3) for s in self.set_aside],
            "facts": self.facts,
            "timing": self.timing,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrialRow:
        return cls(
            index=int(d["index"]),
            applied=tuple(d.get("applied") or ()),
            samples=tuple(float(x) for x in d.get("samples") or ()),
            median=d.get("median"),
            verdict=TrialVerdict.of(d.get("verdict")),
            failure=d.get("failure"),
            outlier=d.get("outlier"),
            purpose=str(d.get("purpose") or ""),
            round=int(d.get("round") or 0),
            worker=d.get("worker"),
            runs=int(d.get("runs") or 0),
            crashes=int(d.get("crashes") or 0),
            contended=int(d.get("contended_samples") or 0),
            set_aside=tuple(float(x) for x in d.get("set_aside_samples") or ()),
            facts=d.get("facts"),
            timing=d.get("timing"),
        )


def applied_names(applied: Iterable[str], positions: Iterable[tuple[str, int]]) -> tuple[str, ...]:
    """``git:/r@3`` for an ordered unit applied at a position, else the unit id; sorted."""
    at = dict(positions)
    return tuple(f"{u}@{at[u]}" if u in at else u for u in sorted(applied))


@dataclass(frozen=True)
class Culprit:
    """A unit (and, for a repo, the first bad commit) found guilty, as the run presents it
    (one per unit of the engine's ``search.Isolation``)."""

    unit: Unit
    commit: str | None = None
    good_median: float | None = None  # the evidence: good state without it ...
    bad_median: float | None = None  # ... and with it (alone on top of good)
    together_with: tuple[str, ...] = ()  # other units of an interaction
    details: tuple[str, ...] = ()  # what it changed: content diff, commits, versions
    good_trial: int | None = None  # the trial numbers of the evidence
    bad_trial: int | None = None
    hunk: HunkCulprit | None = None  # a file in a repo: its first bad version and hunk
    # A package unit: the torch stack's guilty component, the first bad release.
    within: PackageFinding | None = None
    why: tuple[str, ...] = ()  # the facts that differ, good vs bad (envbisect.model.facts)
    # The culprit's own state crashed: ``crashed 5 of 5: RuntimeError: ...`` (its rate and
    # the error), with the good state's own rate when that crashed too.
    crash: str | None = None
    # A cause the bad state hides: bad alone on top of good, while the bad state's other
    # changes mask it (``search.masked``; the field's empty cache under the field's patch).
    hidden: bool = False
    # Its own state has no figure (every run alone crashed): the confirmation's, everything
    # but it (good) → everything (bad), shows what it costs where it ran.
    with_rest: tuple[float, float] | None = None

    def changes(self) -> list[dict[str, Any]]:
        out = []
        for c in self.unit.changes:
            old, new = c.old, c.new
            if c.section == "git" and self.commit:
                new = self.commit
            out.append({"key": c.key, "old": show_value(old), "new": show_value(new)})
        return out


class RunOutcome(str, Enum):
    """How a run ended, as users read it: ``--json``'s ``outcome``, the report, the session's
    ``end`` event. The engine's outcomes, and two only a run can tell: ``unconfirmed`` (a
    culprit whose confirmation gave no number) and ``unfaithful`` (also: the good state could
    not be realized)."""

    FOUND = "found"
    AMBIGUOUS = "ambiguous"
    NOT_REPRODUCED = "not-reproduced"
    UNFAITHFUL = "unfaithful"
    ABORTED = "aborted"
    UNCONFIRMED = "unconfirmed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class RunResult:
    """What a bisection found."""

    outcome: RunOutcome
    threshold: float | None
    culprits: tuple[Culprit, ...]
    trials: tuple[TrialRow, ...]
    diff: DiffResult
    blocked: Mapping[str, str]
    notes: tuple[str, ...]
    session: Path
    message: str
    good_path: Path
    bad_path: Path
    smoke: SmokeCommand
    good_median: float | None = None
    bad_median: float | None = None
    target_args: tuple[str, ...] = ()  # --config/--python/--via words that reproduce the run
    # What the search says beside its culprits: others remain, a state measured again.
    findings: tuple[str, ...] = ()
    threshold_source: str = "default"
    threshold_fraction: float | None = None
    noise: float | None = None  # per-sample spread (log scale) the verdicts used
    machine: Mapping[str, Any] = field(default_factory=dict)  # the report's header
    # How the report's Next reproduces a state: the target interpreter, the command's cwd,
    # the uv that built the venvs and the package sources' uv options.
    python: str | None = None
    cwd: str | None = None
    uv: str = "uv"
    uv_args: tuple[str, ...] = ()
    # run --profile: the culprit's evidence, good vs bad, kernel by kernel (model.kernels),
    # or why there is none
    kernels: KernelDiff | None = None
    kernels_note: str | None = None

    @property
    def exit_code(self) -> int:
        return 0 if self.outcome == RunOutcome.FOUND and self.culprits else 1

    def not_causes(self) -> NotCauses:
        """The other units, once culprits are found (see ``NotCauses``)."""
        if not self.culprits:
            return NotCauses()
        guilty = {u for c in self.culprits for u in (c.unit.id, *c.together_with)}
        units = {t.index: {unit_of(a) for a in t.applied} for t in self.trials}
        seen = dict.fromkeys(unit_of(a) for t in self.trials for a in t.applied)
        apart = [t for t in self.trials if units[t.index] and not guilty & units[t.index]]
        good: dict[int, list[str]] = {}
        other: dict[int, list[str]] = {}
        untried = []
        for unit in seen:
            if unit in guilty or unit in self.blocked:
                continue
            held = [t for t in apart if unit in units[t.index]]
            cleared = [t for t in held if t.verdict == TrialVerdict.GOOD]
            if held:
                best = min(cleared or held, key=lambda t: (len(t.applied), t.index))
                (good if cleared else other).setdefault(best.index, []).append(unit)
            else:
                untried.append(unit)
        rows = {t.index: t for t in self.trials}
        return NotCauses(
            tuple((rows[i], tuple(sorted(good[i]))) for i in sorted(good)),
            tuple((rows[i], tuple(sorted(other[i]))) for i in sorted(other)),
            tuple(sorted(untried)),
        )


@dataclass(frozen=True)
class NotCauses:
    """The units beside the culprits. ``cleared``: those a good trial held without any
    culprit, grouped by the smallest such trial, in trial order. ``unsettled``: those held
    without a culprit only by trials not judged good (unresolved, say), grouped the same
    way. ``untried``: those no trial held without a culprit (judged only beside one)."""

    cleared: tuple[tuple[TrialRow, tuple[str, ...]], ...] = ()
    unsettled: tuple[tuple[TrialRow, tuple[str, ...]], ...] = ()
    untried: tuple[str, ...] = ()


def unit_of(applied: str) -> str:
    """The unit of a trial's applied name: ``git:/r@3`` → ``git:/r`` (the position of an
    ordered unit is not part of its id), ``torch-stack[triton]`` → ``torch-stack`` (a
    package unit in a state of the package step, pkgrun)."""
    head, sep, tail = applied.rpartition("@")
    if sep and tail.isdigit():
        return head
    head, sep, tail = applied.partition("[")
    return head if sep and tail.endswith("]") and ":" not in tail else applied


def outlier(
    samples: Sequence[float],
    good: Sequence[float],
    bad: Sequence[float],
    sigma: float,
    contended: Sequence[bool] = (),
    runs: tuple[int, int, int] = (0, 0, 0),
) -> str | None:
    """Why a state's speed is itself a finding, or None: faster than the good endpoint or
    slower than the bad one by more than the noise (z = 3 on the medians' difference, at
    least 5%). Nothing in between the endpoints explains such a state: look at its log.

    ``runs``: the processes that gave the state's, the good and the bad samples (0: not
    known). Samples from one process (a probe's timed steps) share that process's luck, so
    a median counts as many samples as processes gave it (seen as a user: the good state's
    own code, one process of 26 steps each, "1.62× faster than the good state").
    A state whose samples were mostly taken while other processes loaded the machine
    (``contended``, per sample) is not flagged: load that comes and goes moves a whole
    trial's median past the noise within trials (seen as a user, one core kept busy: the
    bad state's own code "1.57× slower than the bad state")."""
    if not samples or not good or 2 * sum(contended) >= len(samples):
        return None
    noise = Noise(sigma=sigma, dof=1)
    m = median(samples)

    def beyond(ref: Sequence[float], ref_runs: int) -> float:
        here, there = _independent(len(samples), runs[0]), _independent(len(ref), ref_runs)
        se = math.hypot(noise.median_se(here), noise.median_se(there))
        return max(0.05, 3 * se)

    g = median(good)
    if math.log(m) - math.log(g) > beyond(good, runs[1]):
        return f"{m / g:.2f}× faster than the good state"
    if bad:
        b = median(bad)
        if b > 0 and math.log(b) - math.log(m) > beyond(bad, runs[2]):
            return f"{b / m:.2f}× slower than the bad state"
    return None


def trial_outlier(trial: Trial, good: Trial, bad: Trial | None, sigma: float) -> str | None:
    """``outlier`` of an engine trial against the endpoint trials (``bad``: None when it
    is not measured or not to be compared), with its contention flags and processes."""
    return outlier(
        trial.samples,
        good.samples,
        bad.samples if bad is not None else (),
        sigma,
        trial.contended,
        (trial.runs, good.runs, bad.runs if bad is not None else 0),
    )


def _independent(samples: int, runs: int) -> int:
    """How many independent samples ``samples`` from ``runs`` processes count as."""
    return min(samples, runs) if runs > 0 else samples


def trial_number(trial: Trial, numbers: Mapping[str, int]) -> int:
    """The session's number of the engine's trial (its own index when not logged)."""
    return numbers.get(state_key(trial.state.applied, trial.state.positions), trial.index)
