"""Causes the bad state hides (``find_all``): a change that is bad on its own, but that
another change of the same drift masks.

The field's drift is the case: an empty compile cache makes the threaded command crash (10
of 10 processes on the H200), and the field's ``is_fx_symbolic_tracing = lambda: False``
patch, part of the same drift, stops that crash. Isolation follows what the bad state shows
(its slowness: the grown data), and everything but the data runs good, patch included. So,
once the culprits are found and everything but them ran good, each remaining group of units
is run alone on top of good: a section (the caches, the environment, the data, the
packages), and a repo with the files inside it as one group (a repo's uncommitted edit shows
as both). A group that is bad alone is isolated inside like any culprit, its crash rate
told, and named as a cause the bad state hides."""

from __future__ import annotations

from envbisect.search.confirm import Confirmation
from envbisect.search.crashes import CrashWatch
from envbisect.search.isolate import Ambiguous, Isolator
from envbisect.search.result import EventKind, Isolation
from envbisect.search.samples import SampleCache
from envbisect.search.scheduler import Scheduler
from envbisect.search.state import Purpose, State, Units
from envbisect.search.verdict import Verdict
from envbisect.search.wording import Say, say


def groups(units: Units, rest: frozenset[str]) -> list[frozenset[str]]:
    """``rest`` in the groups it is screened in, in the units' order: one per section, a
    repo's ``git:`` unit with the ``files:`` inside that repo."""
    repos = sorted(
        (u.partition(":")[2].rstrip("/") for u in rest if u.startswith("git:")),
        key=len,
        reverse=True,  # the innermost repo of nested ones
    )
    keyed: dict[str, set[str]] = {}
    for unit in units.sorted(rest):
        section, sep, key = unit.partition(":")
        group = section if sep else ""  # ids without a section: one group
        if section == "git":
            group = unit
        elif section == "files":
            repo = next((r for r in repos if key.startswith(r + "/")), None)
            group = f"git:{repo}" if repo is not None else section
        keyed.setdefault(group, set()).add(unit)
    return [frozenset(g) for g in keyed.values()]


class MaskedScreen:
    """The screen of one search, after its culprits."""

    def __init__(
        self,
        cache: SampleCache,
        scheduler: Scheduler,
        isolator: Isolator,
        crashes: CrashWatch,
        confirmation: Confirmation,
        units: Units,
    ) -> None:
        self.cache = cache
        self.scheduler = scheduler
        self.isolator = isolator
        self.crashes = crashes
        self.confirmation = confirmation
        self.units = units

    def screen(self, rest: frozenset[str]) -> list[Isolation]:
        """Each group of ``rest`` (everything but the culprits, measured good) alone on top
        of good; the causes among them, each marked ``hidden``."""
        restored = State.of(rest)
        found: list[Isolation] = []
        todo = groups(self.units, rest)
        if not todo:
            return found
        self.cache.emit(EventKind.PHASE, say(Say.SCREENING, groups=len(todo)))
        for group in todo:
            if self.scheduler.measure(State.of(group), Purpose.SCREEN) is not Verdict.BAD:
                continue
            core = group
            if len(group) > 1:
                try:
                    core = self.isolator.find_core(group)
                except Ambiguous:
                    core = group  # named as the group: which of it is not told apart
            self.crashes.culprit_rate(self.cache[State.of(core)])
            alone = self.confirmation.alone(core)
            units = tuple(self.units.sorted(core))
            found.append(Isolation(units, alone, hidden_by=restored.applied))
            self.cache.emit(
                EventKind.PHASE, say(Say.HIDDEN_CAUSE, units=units, index=self._index(restored))
            )
        return found

    def _index(self, state: State) -> int | None:
        rec = self.cache.get(state)
        return rec.index if rec is not None else None
