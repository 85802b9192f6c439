"""The diff's vocabulary: a :class:`Change` of one fact, a :class:`Unit` bisection moves, and
the comparison helpers every section module shares (``envbisect.sections``).

``diff`` re-exports these names; they live here so that section modules can use them
without importing ``diff`` (which imports the sections).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from packaging.version import InvalidVersion, Version

from envbisect.model.errors import ManifestError, yaml_kind


class ChangeKind(str, Enum):
    """How one fact differs from the good side to the bad side."""

    ADDED = "added"
    REMOVED = "removed"
    UPGRADED = "upgraded"
    DOWNGRADED = "downgraded"
    CHANGED = "changed"


@dataclass(frozen=True)
class Change:
    """One fact that differs between the good and the bad manifest."""

    section: str
    key: str
    old: Any
    new: Any
    kind: ChangeKind
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Every field in order, the kind by its value."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["kind"] = self.kind.value
        return out


@dataclass(frozen=True)
class Unit:
    """Changes that bisection applies or reverts together."""

    id: str
    section: str
    title: str
    changes: tuple[Change, ...]
    bisectable: bool
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "section": self.section,
            "title": self.title,
            "bisectable": self.bisectable,
            "reason": self.reason,
            "changes": [c.as_dict() for c in self.changes],
        }


class Found(NamedTuple):
    """A change as a section module found it, before units are formed.

    A NamedTuple like :class:`EntryPair`, not a frozen dataclass: one is made per differing
    entry, and frozen dataclasses' ``__init__`` made a 20,000-entry diff 1.3x slower.

    ``volatile``: left out unless ``--all`` asks for it; ``uncollected``: why the fact is
    missing on one side (its collection failed there), which makes its unit not bisectable.
    """

    change: Change
    volatile: bool = False
    uncollected: str | None = None


# --------------------------------------------------------------------------- versions

_VARIANT_PREFIXES = ("cu", "rocm", "cpu", "xpu", "hip")


def compare_versions(old: Any, new: Any) -> tuple[ChangeKind, str | None]:
    """Kind of a version change; the note names a changed local label (build variant)."""
    try:
        vo, vn = Version(str(old)), Version(str(new))
    except InvalidVersion:
        return ChangeKind.CHANGED, None
    note = _variant_note(vo.local, vn.local)
    po, pn = Version(vo.public), Version(vn.public)
    if pn > po:
        return ChangeKind.UPGRADED, note
    if pn < po:
        return ChangeKind.DOWNGRADED, note
    return ChangeKind.CHANGED, note


def _variant_note(old: str | None, new: str | None) -> str | None:
    if old == new:
        return None
    if old and new and old.startswith("cu") and new.startswith("cu"):
        return f"CUDA variant {old} → {new}"
    labels = [x for x in (old, new) if x]
    if any(x.startswith(_VARIANT_PREFIXES) for x in labels):
        return f"build variant {old or '(none)'} → {new or '(none)'}"
    return f"local label {old or '(none)'} → {new or '(none)'}"


# --------------------------------------------------------------------------- comparing

VOLATILE_KEYS = frozenset(
    {"created", "elapsed_s", "host", "hostname", "uptime_s", "boot_time", "mtime", "mtime_ns"}
    | {"ctime", "atime", "ctime_ns", "atime_ns"}
)
_VERSIONED_KEYS = frozenset(
    {"version", "cuda", "hip", "cudnn", "nccl", "triton", "driver", "cuda_driver"}
)

# "volatile: ..." is what a unit of a volatile change says (diff --all shows those units).
VOLATILE_REASON = "volatile: differs between snapshots without changing what runs (--all)"
METADATA_NOTE = "only metadata differs"


def entry(source: str, section: str, key: str, value: Any) -> dict[str, Any] | None:
    """A mapping-valued entry as is, None where the side lacks it; ManifestError otherwise."""
    if value is None or isinstance(value, dict):
        return value
    raise ManifestError(
        f"{source}: field '{section}.{key}' must be a mapping, got {yaml_kind(value)}"
    )


def human_bytes(n: Any) -> str:
    """``1.5 MB``-style size (powers of 1000), ``? bytes`` for a non-number."""
    if not isinstance(n, int | float):
        return "? bytes"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"  # pragma: no cover - the loop always returns


def error_of(entry: Mapping[str, Any] | None) -> str | None:
    """``error: <why>`` for an entry whose collection failed, else None."""
    if entry and entry.get("error"):
        return f"error: {entry['error']}"
    return None


def strip_volatile(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The entry without its volatile fields (mtimes ...)."""
    if entry is None:
        return None
    return {k: v for k, v in entry.items() if k not in VOLATILE_KEYS}


def scalar_change(section: str, key: str, old: Any, new: Any) -> Change:
    """A Change of a plain value: versions compared as versions, anything else changed."""
    if old is None:
        return Change(section, key, None, new, ChangeKind.ADDED)
    if new is None:
        return Change(section, key, old, None, ChangeKind.REMOVED)
    if key in _VERSIONED_KEYS and isinstance(old, str | int) and isinstance(new, str | int):
        kind, note = compare_versions(old, new)
        return Change(section, key, old, new, kind, note)
    return Change(section, key, old, new, ChangeKind.CHANGED)


def presence(old: Any, new: Any) -> ChangeKind:
    """ADDED / REMOVED when one side lacks the fact, else CHANGED."""
    if old is None:
        return ChangeKind.ADDED
    if new is None:
        return ChangeKind.REMOVED
    return ChangeKind.CHANGED


def keys(g: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Good's order first, then what only bad has: stable and close to the files' order."""
    return list(g) + [k for k in b if k not in g]


def differing(g: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[tuple[str, Any, Any]]:
    """``(key, old, new)`` for every key whose raw values differ, in ``keys`` order."""
    for key in keys(g, b):
        old, new = g.get(key), b.get(key)
        if old == new:
            continue
        yield key, old, new


# (source, key, raw value) -> the entry as a mapping, or None where the side lacks it.
ReadEntry = Callable[[str, str, Any], dict[str, Any] | None]


class EntryPair(NamedTuple):
    """One key of a mapping-valued section whose entries differ, read on both sides.

    ``shown_old``/``shown_new``: the compared value a Change shows (None for a missing side).
    """

    key: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None
    kind: ChangeKind
    shown_old: Any
    shown_new: Any

    @property
    def both(self) -> bool:
        """Both sides have the entry."""
        return self.old is not None and self.new is not None

    def change(
        self, section: str, note: str | None = None, kind: ChangeKind | None = None
    ) -> Change:
        """The Change of this pair, as shown values."""
        return Change(section, self.key, self.shown_old, self.shown_new, kind or self.kind, note)


def entry_pairs(
    section: str,
    src: tuple[str, str],
    g: Mapping[str, Any],
    b: Mapping[str, Any],
    shown: Callable[[dict[str, Any]], Any],
    read: ReadEntry | None = None,
) -> Iterator[EntryPair]:
    """The entries of a mapping-valued section that differ, read on both sides.

    ``read`` turns a raw value into an entry (default: :func:`entry`, which raises
    ManifestError for a non-mapping); ``shown`` gives the value a Change shows.
    """
    for key, old_raw, new_raw in differing(g, b):
        if read is None:
            old = entry(src[0], section, key, old_raw)
            new = entry(src[1], section, key, new_raw)
        else:
            old, new = read(src[0], key, old_raw), read(src[1], key, new_raw)
        yield EntryPair(
            key,
            old,
            new,
            presence(old, new),
            None if old is None else shown(old),
            None if new is None else shown(new),
        )


_T = TypeVar("_T")


def read_fields(entry_type: type[_T], raw: Mapping[str, Any]) -> _T:
    """An entry dataclass whose fields are the recorded mapping's keys, read by name
    (missing ones are None)."""
    names = [f.name for f in dataclasses.fields(entry_type)]  # type: ignore[arg-type]
    return entry_type(**{name: raw.get(name) for name in names})


def count(value: Any) -> Any:
    """How many items a list/tuple/dict holds; anything else as is."""
    return len(value) if isinstance(value, list | tuple | dict) else value
