"""What torch ran in a few profiled steps, and how two runs differ: kernels and ops.

A profiled run's ``profile`` fact (``agent/kernel_profile.py`` writes it) is a table reduced from
``torch.profiler``'s ``key_averages`` over ``steps`` training steps::

    steps 3, step_us 41250.0, device "cuda", trace "/…/probe.trace.json"
    rows  [{name, kind: op|kernel|annotation, count, self_cpu_us, cpu_us,
            self_device_us, device_us}, …]

A row's *time* is its self time where it runs: device time for a kernel, CPU time for an
operator or runtime call. ``diff`` compares a good run's table with a bad one's per step (the
two may have profiled different numbers of steps) and names what appeared, what vanished,
what got slower or faster, and what is called more or less often, each with its change as a
share of the step time (the slower run's: the bad one's, in a regression). Pure functions:
nothing prints.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MIN_SHARE = 0.005  # a change under 0.5 % of the step is noise, unless its calls changed
RATIO = 1.10  # slower / faster: at least 10 % either way
CALLS_RATIO = 1.5  # more / fewer calls: at least 1.5x either way


@dataclass(frozen=True)
class ProfileRequest:
    """A profile asked for: ``steps`` training steps after ``skip`` warm-up steps."""

    steps: int = 3
    skip: int = 3

    def config(self, trace: str | None) -> dict[str, Any]:
        """The probe config's ``profile`` part (``agent/kernel_profile.py``)."""
        return {"steps": self.steps, "skip": self.skip, "trace": trace}


@dataclass(frozen=True)
class OpRow:
    """One name's totals over the profiled steps (microseconds)."""

    name: str
    kind: str
    count: int
    self_cpu_us: float
    cpu_us: float
    self_device_us: float
    device_us: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpRow:
        return cls(
            name=str(data["name"]),
            kind=str(data.get("kind") or "op"),
            count=int(data.get("count") or 0),
            self_cpu_us=float(data.get("self_cpu_us") or 0.0),
            cpu_us=float(data.get("cpu_us") or 0.0),
            self_device_us=float(data.get("self_device_us") or 0.0),
            device_us=float(data.get("device_us") or 0.0),
        )

    @property
    def time_us(self) -> float:
        """Self time where it runs: the device's for a kernel, the CPU's otherwise."""
        return self.self_device_us if self.kind == "kernel" else self.self_cpu_us


@dataclass(frozen=True)
class ProfileTable:
    """One run's profiled steps: how many, their wall time, the device, the trace, the rows."""

    steps: int
    step_us: float
    device: str
    trace: str | None
    rows: tuple[OpRow, ...]
    stopped: str | None = None

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any] | None) -> ProfileTable:
        """The table in a run's facts (the whole facts, or their ``profile`` part); a
        ``ValueError`` saying why when there is none."""
        if not isinstance(facts, Mapping):
            raise ValueError("no facts")
        profile = facts.get("profile", facts) if "rows" not in facts else facts
        if not isinstance(profile, Mapping):
            raise ValueError("no profile in the facts (was the run profiled?)")
        if profile.get("error"):
            raise ValueError(f"the profiler failed: {profile['error']}")
        if not profile.get("steps") or "rows" not in profile:
            raise ValueError(str(profile.get("note") or "no profile in the facts"))
        try:
            rows = tuple(OpRow.from_dict(r) for r in profile["rows"])
            return cls(
                steps=int(profile["steps"]),
                step_us=float(profile.get("step_us") or 0.0),
                device=str(profile.get("device") or "cpu"),
                trace=profile.get("trace"),
                rows=rows,
                stopped=profile.get("stopped"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed profile table: {exc}") from None

    def top(self, n: int) -> tuple[OpRow, ...]:
        """The ``n`` rows with the most self time (annotations, which only wrap, left out)."""
        rows = [r for r in self.rows if r.kind != "annotation"]
        return tuple(sorted(rows, key=lambda r: (-r.time_us, r.name))[:n])

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "step_us": self.step_us,
            "device": self.device,
            "trace": self.trace,
            "stopped": self.stopped,
            "rows": [vars(r) | {"time_us": r.time_us} for r in self.rows],
        }


class Change(enum.Enum):
    """How one kernel or op differs from the good run to the bad one."""

    APPEARED = "appeared"
    VANISHED = "vanished"
    SLOWER = "slower"
    FASTER = "faster"
    MORE_CALLS = "more calls"
    FEWER_CALLS = "fewer calls"
    SAME = "same"


@dataclass(frozen=True)
class KernelChange:
    """One name's change, per step: time (µs) and calls on each side, and the time's change
    as a share of the step time (the slower run's)."""

    name: str
    kind: str
    change: Change
    good_us: float
    bad_us: float
    good_calls: float
    bad_calls: float
    share: float

    @property
    def delta_us(self) -> float:
        return self.bad_us - self.good_us

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "change": self.change.value,
            "good_us_per_step": round(self.good_us, 3),
            "bad_us_per_step": round(self.bad_us, 3),
            "delta_us_per_step": round(self.delta_us, 3),
            "good_calls_per_step": round(self.good_calls, 3),
            "bad_calls_per_step": round(self.bad_calls, 3),
            "share_of_step": round(self.share, 5),
        }


@dataclass(frozen=True)
class KernelDiff:
    """A good run's table against a bad one's: every name's change, biggest first."""

    good: ProfileTable
    bad: ProfileTable
    changes: tuple[KernelChange, ...]

    @property
    def notable(self) -> tuple[KernelChange, ...]:
        """The changes worth a line (not ``SAME``), biggest share of the step first."""
        return tuple(c for c in self.changes if c.change is not Change.SAME)

    @property
    def step_ratio(self) -> float | None:
        if not self.good.step_us or not self.bad.step_us:
            return None
        return self.bad.step_us / self.good.step_us

    def as_dict(self) -> dict[str, Any]:
        return {
            "good": {k: v for k, v in self.good.as_dict().items() if k != "rows"},
            "bad": {k: v for k, v in self.bad.as_dict().items() if k != "rows"},
            "step_ratio": None if self.step_ratio is None else round(self.step_ratio, 4),
            "changes": [c.as_dict() for c in self.changes],
        }


def diff(good: ProfileTable, bad: ProfileTable) -> KernelDiff:
    """Every name in either table, per step, classified (see ``Change``) and ordered by the
    size of its time change (then its calls change)."""
    a = {r.name: r for r in good.rows if r.kind != "annotation"}
    b = {r.name: r for r in bad.rows if r.kind != "annotation"}
    step = max(bad.step_us, good.step_us) or 1.0
    out = []
    for name in sorted(set(a) | set(b)):
        old, new = a.get(name), b.get(name)
        good_us = old.time_us / good.steps if old else 0.0
        bad_us = new.time_us / bad.steps if new else 0.0
        good_calls = old.count / good.steps if old else 0.0
        bad_calls = new.count / bad.steps if new else 0.0
        share = (bad_us - good_us) / step
        kind = (new or old).kind  # type: ignore[union-attr]  # one of them is there
        change = _classify(old is not None, new is not None, good_us, bad_us, share)
        if change is Change.SAME:
            change = _calls(good_calls, bad_calls)
        out.append(KernelChange(name, kind, change, good_us, bad_us, good_calls, bad_calls, share))
    out.sort(key=lambda c: (-abs(c.share), -abs(c.bad_calls - c.good_calls), c.name))
    return KernelDiff(good, bad, tuple(out))


def _classify(had: bool, has: bool, good_us: float, bad_us: float, share: float) -> Change:
    if abs(share) < MIN_SHARE:
        return Change.SAME
    if not had:
        return Change.APPEARED
    if not has:
        return Change.VANISHED
    if bad_us > good_us * RATIO:
        return Change.SLOWER
    if good_us > bad_us * RATIO:
        return Change.FASTER
    return Change.SAME


def _calls(good_calls: float, bad_calls: float) -> Change:
    if bad_calls >= 1 and bad_calls >= good_calls * CALLS_RATIO:
        return Change.APPEARED if good_calls == 0 else Change.MORE_CALLS
    if good_calls >= 1 and good_calls >= bad_calls * CALLS_RATIO:
        return Change.VANISHED if bad_calls == 0 else Change.FEWER_CALLS
    return Change.SAME
