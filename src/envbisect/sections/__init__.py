"""One module per manifest section: what the section *is*.

Each module defines a :class:`Section` subclass and registers it with :func:`register`:
how its entries are read (a small frozen entry type), compared and described (``compare``),
how its changes become units (``unit``, ``refine``, and for sections whose rules span
several changes ``claim`` and ``regroup``) and why one is not bisectable (``reason``).
A bisectable section's module also holds its realizer (``realizer``): how a state's value
of the section is realized in a trial, as a part of a plan (``envbisect.model.plan``, no I/O),
which the actuator's executor carries out locally or on a remote target. ``diff``, the
blocker and the plan builder walk this registry instead of ``if section == ...`` chains.
The collectors stay in the stdlib-only agent (``envbisect.agent.collector``), one
``collect_<section>`` each.

Adding a section: a new module here with its Section subclass (and its test file); the
package imports every module in this folder, so nothing else needs to change.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from envbisect.model.changes import (
    Change,
    EntryPair,
    Found,
    Unit,
    differing,
    entry,
    entry_pairs,
    error_of,
    scalar_change,
)
from envbisect.model.escape import printable
from envbisect.model.manifest import Manifest

if TYPE_CHECKING:
    from envbisect.model.plan import Realizer


@dataclass(frozen=True)
class DiffContext:
    """What unit rules may consult beyond the change itself."""

    good: Manifest
    bad: Manifest
    changes: tuple[Change, ...]
    data_map: Mapping[str, str] = field(default_factory=dict)

    def changed_keys(self, section: str) -> set[str]:
        """Keys of ``section`` that changed."""
        return {c.key for c in self.changes if c.section == section}

    def entries(self, side: str, section: str) -> Mapping[str, Any]:
        """The raw entries of ``section`` on the ``good`` or ``bad`` side."""
        return (self.good if side == "good" else self.bad).section(section)


class Section:
    """A manifest section for ``diff``: compare entries, form units, say why not bisectable.

    The defaults describe a section of plain values, one unit per key, not bisectable
    (``reason``): a fact envbisect can only report.
    """

    name: ClassVar[str] = ""
    word: ClassVar[str] = ""  # a unit's title is "<word> <key>"
    rank: ClassVar[int] = 100  # where its units sort (torch stack first)
    unit_section: ClassVar[str | None] = None  # the units' section, when not ``name``
    bisectable: ClassVar[bool] = False
    reason: ClassVar[str | None] = None
    # Collection fails for the whole section at once (nvidia-smi, torch/version.py ...):
    # a section-wide error in meta.errors explains any entry missing on that side.
    fails_whole: ClassVar[bool] = False
    # How a state's value of this section is realized (None: nothing to realize; reported).
    realizer: ClassVar[Realizer | None] = None
    # Facts that follow from other sections (torch from packages, probes from files): a
    # unit made only of them has nothing to realize, and needs no realizer to be moved.
    derived: ClassVar[bool] = False

    def diff(self, src: tuple[str, str], g: Any, b: Any) -> Iterator[Found]:
        """What differs between the two sides' raw section values."""
        gs = g if isinstance(g, dict) else {}
        bs = b if isinstance(b, dict) else {}
        return self.compare(src, gs, bs)

    def compare(
        self, src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
    ) -> Iterator[Found]:
        for key, old, new in differing(g, b):
            yield Found(scalar_change(self.name, key, old, new), self.is_volatile(key))

    def is_volatile(self, key: str) -> bool:
        """Whether a change of ``key`` never changes what runs."""
        return False

    def reason_for(self, change: Change) -> str | None:
        """Why a unit of ``change`` is not bisectable, or a note on its bisectability."""
        return self.reason

    def unit(self, change: Change) -> Unit:
        """The unit of one change of this section."""
        section = self.unit_section or self.name
        word = self.word or self.name
        key = printable(change.key)  # a name holding a newline or an escape is shown escaped
        return Unit(
            f"{section}:{key}",
            section,
            f"{word} {key}",
            (change,),
            self.bisectable,
            self.reason_for(change),
        )

    def refine(self, unit: Unit, ctx: DiffContext) -> Unit:
        """Bisectability that needs the full entries, not just the change."""
        return unit

    def claim(self, found: list[Found]) -> tuple[list[Unit], list[Found]]:
        """Units formed from several changes at once, and the changes left to the others."""
        return [], found

    def regroup(self, units: list[Unit], ctx: DiffContext) -> list[Unit]:
        """A pass over all units once formed (fold, annotate); default: as they are."""
        return units


class KeyedSection(Section):
    """A section of mapping-valued entries keyed by path or name (files, git, data, ...):
    each key whose entries differ is judged on its own (:meth:`judge`)."""

    def compare(
        self, src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
    ) -> Iterator[Found]:
        for pair in entry_pairs(self.name, src, g, b, self.shown, read=self.read):
            yield self.judge(pair)

    def read(self, source: str, key: str, value: Any) -> dict[str, Any] | None:
        """A raw value as an entry (ManifestError, naming file and field, for a non-mapping)."""
        return entry(source, self.name, key, value)

    def shown(self, raw: dict[str, Any]) -> Any:
        """The value a Change shows for a present entry: its collection error, if any."""
        return error_of(raw) or self.describe(raw)

    def describe(self, raw: dict[str, Any]) -> Any:
        """The entry in a word or a few (a hash, ``head (branch)``, ``N files, SIZE``)."""
        return raw

    def judge(self, pair: EntryPair) -> Found:
        """The change of one key whose entries differ: added, removed, or as
        :meth:`judge_both` says when both sides have it."""
        if pair.old is None or pair.new is None:
            return Found(pair.change(self.name))
        return self.judge_both(pair, pair.old, pair.new)

    def judge_both(self, pair: EntryPair, old: dict[str, Any], new: dict[str, Any]) -> Found:
        """The change of a key present on both sides (default: the shown values differ)."""
        return Found(pair.change(self.name))


@dataclass(frozen=True)
class _Generic(Section):
    """A section no module knows: its changes are reported, never bisected."""

    section_name: str = ""

    def diff(self, src: tuple[str, str], g: Any, b: Any) -> Iterator[Found]:
        if isinstance(g, dict) and isinstance(b, dict):
            for key, old, new in differing(g, b):
                yield Found(scalar_change(self.section_name, str(key), old, new))
        elif g != b:
            yield Found(scalar_change(self.section_name, self.section_name, g, b))

    def unit(self, change: Change) -> Unit:
        s = self.section_name
        reason = f"envbisect has no way to re-create facts of section '{s}'"
        key = printable(change.key)
        return Unit(f"{s}:{key}", s, f"{s} {key}", (change,), False, reason)


_REGISTRY: dict[str, Section] = {}


# The one order table. UNIT_ORDER: how units sort, most regression-relevant first (the diff,
# the report and the search walk them so); a section not listed sorts after these (its class's
# own ``rank``), and LAST after everything. PLAN_ORDER: the order a state's plan is built in —
# the venv first, git's worktrees before the files written into them, env after packages (it
# overrides what the venv set), then caches and data.
UNIT_ORDER = (
    "torch", "packages", "files", "git", "env", "data", "caches", "probes",
    "python", "system", "gpu",
)  # fmt: skip
LAST = ("meta",)
PLAN_ORDER = ("packages", "git", "files", "env", "caches", "data")


def register(cls: type[Section]) -> type[Section]:
    """Class decorator: make ``cls`` the section named ``cls.name``, ranked by the table."""
    if cls.name in UNIT_ORDER:
        cls.rank = UNIT_ORDER.index(cls.name)
    elif cls.name in LAST:
        cls.rank = 200 + LAST.index(cls.name)
    _REGISTRY[cls.name] = cls()
    return cls


def plan_position(section: str) -> int:
    """Where ``section``'s realizer puts its part in a plan (PLAN_ORDER; unknown ones last)."""
    return PLAN_ORDER.index(section) if section in PLAN_ORDER else len(PLAN_ORDER)


def get(name: str) -> Section:
    """The section named ``name`` (a reporting-only one for a name no module knows)."""
    found = _REGISTRY.get(name)
    return found if found is not None else _Generic(section_name=name)


def known() -> list[Section]:
    """Every registered section, by rank."""
    return sorted(_REGISTRY.values(), key=lambda s: (s.rank, s.name))


def unit_sections() -> tuple[str, ...]:
    """Unit sections, most regression-relevant first (``diff.SECTION_ORDER``)."""
    out = [s.unit_section or s.name for s in known() if s.rank < Section.rank]
    return tuple(dict.fromkeys(out))


@functools.cache
def _ranks() -> dict[str, int]:
    return {s.unit_section or s.name: s.rank for s in known()}


def rank_of(unit_section: str) -> int:
    """Sort position of a unit section: known ones by rank, unknown ones after, meta last."""
    return _ranks().get(unit_section, Section.rank)


def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_load_all()
