"""``probes``: monkey-patch probes by dotted name, ``{status: original|patched|missing,
module_file, code_sha256}``. Never bisected on their own: a probe shows the *effect* of code
changed elsewhere (a file, a package, a repo); bisection moves that cause and re-observes
the probe in each trial. When the probe's module file is itself a changed file, the reason
names that unit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from envbisect.model.changes import (
    METADATA_NOTE,
    EntryPair,
    Found,
    Unit,
    read_fields,
    strip_volatile,
)
from envbisect.sections import DiffContext, KeyedSection, register


@dataclass(frozen=True)
class ProbeEntry:
    """One probe as a manifest records it."""

    status: Any = None
    module_file: Any = None
    code_sha256: Any = None


def _note(old: ProbeEntry, new: ProbeEntry) -> str | None:
    notes = []
    if old.code_sha256 != new.code_sha256:
        notes.append("code changed")
    if old.module_file != new.module_file:
        notes.append("defined in another file")
    return "; ".join(notes) or None


@register
class Probes(KeyedSection):
    name = "probes"
    word = "probe"
    derived = True
    reason = (
        "a probe shows the effect of code changed elsewhere (a file, a package, a repo); "
        "bisection moves that cause and re-checks the probe in each trial"
    )

    def describe(self, raw: dict[str, Any]) -> Any:
        return raw.get("status")

    def judge_both(self, pair: EntryPair, old: dict[str, Any], new: dict[str, Any]) -> Found:
        if strip_volatile(old) == strip_volatile(new):
            return Found(pair.change(self.name, METADATA_NOTE), volatile=True)
        return Found(
            pair.change(
                self.name, _note(read_fields(ProbeEntry, old), read_fields(ProbeEntry, new))
            )
        )

    def refine(self, unit: Unit, ctx: DiffContext) -> Unit:
        key = unit.changes[0].key
        raw = ctx.entries("bad", self.name).get(key) or ctx.entries("good", self.name).get(key)
        entry = read_fields(ProbeEntry, raw) if isinstance(raw, Mapping) else None
        module_file = entry.module_file if entry is not None else None
        if isinstance(module_file, str) and module_file in ctx.changed_keys("files"):
            reason = (
                f"follows files:{module_file}: bisection moves that file, "
                "and the probe is re-checked in each trial"
            )
            return replace(unit, reason=reason)
        return unit
