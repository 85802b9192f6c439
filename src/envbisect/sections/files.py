"""``files``: script and model files by path, ``{sha256, size, blob}``; ``blob`` names the
stored content (``blobs/<sha256>``). A change is a content change (sha256); a file is
bisectable when it was added or either side stored its content. A file inside a recorded
repo whose commit changed moves with that repo (``git``). Realized by writing the content
into the state's worktree or swapping it in place, journaled (``bisect.realizers``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from envbisect.changes import METADATA_NOTE, ChangeKind, Found, Unit, entry_pairs, error_of
from envbisect.sections import DiffContext, Section, register

NO_CONTENT_REASON = (
    "neither manifest stored the file's content (snapshot with keep_blobs: true in envbisect.yaml)"
)


@dataclass(frozen=True)
class FileEntry:
    """One file as a manifest records it."""

    sha256: str | None = None
    size: int | None = None
    blob: str | None = None
    error: str | None = None

    @classmethod
    def from_raw(cls, raw: Any) -> FileEntry | None:
        """None for a side without the file (or a value that is no entry)."""
        if not isinstance(raw, Mapping):
            return None
        return cls(raw.get("sha256"), raw.get("size"), raw.get("blob"), raw.get("error"))


def _shown(raw: dict[str, Any]) -> Any:
    return error_of(raw) or raw.get("sha256")


@register
class Files(Section):
    name = "files"
    word = "file"
    rank = 2
    bisectable = True

    def compare(
        self, src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
    ) -> Iterator[Found]:
        for pair in entry_pairs(self.name, src, g, b, _shown):
            old, new = FileEntry.from_raw(pair.old), FileEntry.from_raw(pair.new)
            if old is None or new is None:
                yield Found(pair.change(self.name))
            elif pair.shown_old == pair.shown_new and old.size == new.size:
                # Only an mtime or the stored blob differs: the file itself did not change.
                yield Found(pair.change(self.name, METADATA_NOTE), volatile=True)
            elif old.size != new.size:
                yield Found(pair.change(self.name, f"size {old.size} → {new.size} bytes"))
            else:
                yield Found(pair.change(self.name))

    def refine(self, unit: Unit, ctx: DiffContext) -> Unit:
        change = unit.changes[0]
        if change.kind is ChangeKind.ADDED:
            return unit
        sides = (ctx.entries(s, self.name).get(change.key) for s in ("good", "bad"))
        if any(e is not None and e.blob for e in map(FileEntry.from_raw, sides)):
            return unit
        return replace(unit, bisectable=False, reason=NO_CONTENT_REASON)
