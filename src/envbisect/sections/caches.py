"""``caches``: compile caches by name (``inductor``, ``triton``), ``{path, source, exists,
files, bytes, digest, subdirs}``. A change is a cache that was emptied, filled, moved or
whose subdirectories changed; a digest that moved with only mtimes is volatile. Realized as
a fresh (cold) or copied (warm) cache dir per trial, pointed to by the cache's environment
variable (``bisect.realizers``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from envbisect.changes import Found, entry_pairs, error_of, human_bytes
from envbisect.sections import Section, register


@dataclass(frozen=True)
class CacheEntry:
    """One compile cache as a manifest records it."""

    path: Any = None
    exists: Any = None
    files: Any = None
    bytes: Any = None
    subdirs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> CacheEntry:
        return cls(
            raw.get("path"),
            raw.get("exists"),
            raw.get("files"),
            raw.get("bytes"),
            raw.get("subdirs") or {},
        )

    def describe(self) -> str:
        """``N files, SIZE`` / ``empty`` / ``missing``."""
        if self.exists is False:
            return "missing"
        if self.files == 0:
            return "empty"
        if isinstance(self.files, int):
            return f"{self.files:,} files, {human_bytes(self.bytes)}"
        return human_bytes(self.bytes)

    def facts(self) -> tuple[Any, Any, Any]:
        return (self.exists, self.files, self.bytes)


def _shown(raw: dict[str, Any]) -> str:
    return error_of(raw) or CacheEntry.from_raw(raw).describe()


def _subdir_counts(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(added, removed, changed in size/count, changed by digest only) subdirectories."""
    added = sum(1 for k in new if k not in old)
    removed = sum(1 for k in old if k not in new)
    changed = digest_only = 0
    for k, ov in old.items():
        nv = new.get(k)
        if nv is None or nv == ov:
            continue
        both = isinstance(ov, dict) and isinstance(nv, dict)
        if both and (ov.get("files"), ov.get("bytes")) == (nv.get("files"), nv.get("bytes")):
            digest_only += 1
            continue
        changed += 1
    return added, removed, changed, digest_only


def _notes(old: CacheEntry, new: CacheEntry, shown: tuple[Any, Any]) -> tuple[list[str], int]:
    """What changed beyond the digest, and how many subdirectories changed by digest only."""
    notes = []
    if old.path != new.path:
        notes.append(f"path {old.path} → {new.path}")
    added, removed, changed, digest_only = _subdir_counts(old.subdirs, new.subdirs)
    if added or removed or changed:
        notes.append(f"subdirs +{added} -{removed} ~{changed}")
    if shown[1] == "empty" and shown[0] not in ("empty", "missing"):
        notes.insert(0, "emptied (cold cache)")
    return notes, digest_only


@register
class Caches(Section):
    name = "caches"
    word = "cache"
    rank = 6
    bisectable = True

    def compare(
        self, src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
    ) -> Iterator[Found]:
        for pair in entry_pairs(self.name, src, g, b, _shown):
            if pair.old is None or pair.new is None:
                yield Found(pair.change(self.name))
                continue
            old, new = CacheEntry.from_raw(pair.old), CacheEntry.from_raw(pair.new)
            notes, digest_only = _notes(old, new, (pair.shown_old, pair.shown_new))
            if not notes and old.facts() == new.facts() and pair.shown_old == pair.shown_new:
                # Same files, sizes and subdirectories: only mtimes moved the digest.
                note = "digest only (mtimes)"
                if digest_only:
                    note += f", {digest_only} subdirs"
                yield Found(pair.change(self.name, note), volatile=True)
            else:
                yield Found(pair.change(self.name, "; ".join(notes) or None))
