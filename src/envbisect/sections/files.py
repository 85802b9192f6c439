"""``files``: script and model files by path, ``{sha256, size, blob}``; ``blob`` names the
stored content (``blobs/<sha256>``). A change is a content change (sha256); a file is
bisectable when it was added or either side stored its content. A file inside a recorded
repo whose commit changed moves with that repo (``git``). Realized by writing the content
into the state's worktree or swapping it in place, journaled (its realizer, below).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from envbisect.model.changes import METADATA_NOTE, ChangeKind, EntryPair, Found, Unit
from envbisect.model.files import FileEntry
from envbisect.model.plan import Context, FactQuery, Plan, Sandbox, Swap, Values
from envbisect.sections import DiffContext, KeyedSection, register

NO_CONTENT_REASON = (
    "neither manifest stored the file's content (snapshot with keep_blobs: true in envbisect.yaml)"
)


# ---- realizing-------------------------------------------------------------------------


class FilesRealizer:
    """Content from the blob store, written into the state's worktree when the file is in a
    repo that has one, else swapped in place after journaling the original."""

    section = "files"

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None:
        query.sha256.add(key)

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None:
        for manifest, value in ((ctx.good, old), (ctx.bad, new)):
            entry = FileEntry.of(value)
            if entry is None or ctx.facts().sha256.get(key) == entry.sha256:
                continue
            if ctx.blob(manifest, entry) is None:
                return (
                    f"files {key}: no stored content for sha256 "
                    f"{str(entry.sha256)[:12]} of "
                    f"{manifest.path or 'the manifest'} (looked in "
                    f"{ctx.blob_places(manifest) or 'no blob folder'}; snapshot with "
                    "keep_blobs: true)"
                )
        return None

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan:
        swaps: list[Swap] = []
        for key, (source, value) in sorted(values.items()):
            target = key
            for repo, _head, path in plan.worktrees:
                with contextlib.suppress(ValueError):
                    target = str(Path(path) / Path(key).relative_to(repo))
                    break
            entry = FileEntry.of(value)
            want = entry.sha256 if entry is not None else None
            blob = ctx.blob(source, entry) if entry is not None and want is not None else None
            swaps.append(Swap(path=target, sha256=want, key=key, blob=blob))
        return replace(plan, swaps=plan.swaps + tuple(swaps))


@register
class Files(KeyedSection):
    name = "files"
    word = "file"
    bisectable = True
    realizer = FilesRealizer()

    def describe(self, raw: dict[str, Any]) -> Any:
        return raw.get("sha256")

    def judge_both(self, pair: EntryPair, old: dict[str, Any], new: dict[str, Any]) -> Found:
        size_old, size_new = FileEntry.read(old).size, FileEntry.read(new).size
        if pair.shown_old == pair.shown_new and size_old == size_new:
            # Only an mtime or the stored blob differs: the file itself did not change.
            return Found(pair.change(self.name, METADATA_NOTE), volatile=True)
        if size_old != size_new:
            return Found(pair.change(self.name, f"size {size_old} → {size_new} bytes"))
        return Found(pair.change(self.name))

    def refine(self, unit: Unit, ctx: DiffContext) -> Unit:
        change = unit.changes[0]
        if change.kind is ChangeKind.ADDED:
            return unit
        sides = (ctx.entries(s, self.name).get(change.key) for s in ("good", "bad"))
        if any(e is not None and e.blob for e in map(FileEntry.of, sides)):
            return unit
        return replace(unit, bisectable=False, reason=NO_CONTENT_REASON)
