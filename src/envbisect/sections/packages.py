"""``packages``: every installed distribution, ``{name: {version, installer, editable,
direct_url}}``. A change is a version change (compared with ``packaging.version``; a changed
local label such as ``+cu128`` → ``+cu130`` is named in the note) or, at one version, a
changed install (editable, direct URL). Each package is a unit of its own, except the torch
stack's wheels (``torch_stack``). Realized by an overlay venv (``bisect.realizers``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from envbisect.changes import (
    VOLATILE_KEYS,
    ChangeKind,
    Found,
    compare_versions,
    entry,
    entry_pairs,
)
from envbisect.sections import Section, register


@dataclass(frozen=True)
class PackageEntry:
    """One distribution as a manifest records it."""

    version: Any = None
    editable: bool = False
    direct_url: Any = None

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> PackageEntry:
        return cls(raw.get("version"), bool(raw.get("editable")), raw.get("direct_url"))


def read_package(source: str, name: str, value: Any) -> dict[str, Any] | None:
    """A packages entry as a mapping; a bare version string is tolerated."""
    if isinstance(value, str):
        return {"version": value}
    return entry(source, "packages", name, value)


def _version_of(raw: dict[str, Any]) -> Any:
    return raw.get("version")  # hot: every package of a 20,000-entry manifest


def _field_note(field_name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    if field_name == "editable":
        return "editable install" if new.get(field_name) else "no longer editable"
    return f"{field_name} {old.get(field_name)!r} → {new.get(field_name)!r}"


@register
class Packages(Section):
    name = "packages"
    word = "package"
    rank = 1
    bisectable = True
    fails_whole = True

    def compare(
        self, src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
    ) -> Iterator[Found]:
        for pair in entry_pairs(self.name, src, g, b, _version_of, read=read_package):
            if pair.old is None or pair.new is None:
                yield Found(pair.change(self.name))
                continue
            if pair.shown_old != pair.shown_new:
                kind, note = compare_versions(pair.shown_old, pair.shown_new)
                yield Found(pair.change(self.name, note, kind))
                continue
            old, new = pair.old, pair.new
            fields = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            real = [f for f in fields if f != "installer" and f not in VOLATILE_KEYS]
            if real:
                note = "; ".join(_field_note(f, old, new) for f in real)
                yield Found(pair.change(self.name, note, ChangeKind.CHANGED))
            else:
                note = f"only {', '.join(fields)} differs"
                yield Found(pair.change(self.name, note, ChangeKind.CHANGED), volatile=True)
