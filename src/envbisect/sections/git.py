"""``git``: recorded repos by path, ``{head, branch, dirty, diff_sha256, untracked}``.
A change is a new commit (shown as ``head (branch)``), uncommitted changes (by hash) or a
different set of untracked files. A repo is bisectable unless the good side was dirty (its
uncommitted changes are known by hash only); a git unit found guilty is narrowed over the
commits between the two heads. A changed file that the repo tracks moves with it (see
:meth:`Git.regroup`). Realized as a worktree at the state's commit (``bisect.realizers``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from envbisect.changes import (
    METADATA_NOTE,
    Change,
    ChangeKind,
    Found,
    Unit,
    count,
    entry_pairs,
    error_of,
)
from envbisect.sections import DiffContext, Section, register
from envbisect.sections.files import NO_CONTENT_REASON

COMMITTED_NOTE = "committed in this repo: moves with its commits"
DIRTY_REASON = (
    "the good side had uncommitted changes, which a manifest records by hash only; "
    "commit them to make this repo bisectable"
)


@dataclass(frozen=True)
class GitEntry:
    """One repo as a manifest records it."""

    head: str | None = None
    branch: str | None = None
    dirty: bool = False
    diff_sha256: str | None = None
    untracked: Any = None
    error: str | None = None

    @classmethod
    def from_raw(cls, raw: Any) -> GitEntry:
        """An entry; a side without the repo reads as an empty one."""
        if not isinstance(raw, Mapping):
            return cls()
        return cls(
            raw.get("head"),
            raw.get("branch"),
            bool(raw.get("dirty")),
            raw.get("diff_sha256"),
            raw.get("untracked"),
            raw.get("error"),
        )

    def describe(self) -> str:
        """``head (branch)`` plus ``+uncommitted <hash>`` when dirty."""
        head = str(self.head or "?")[:12]
        text = f"{head} ({self.branch})" if self.branch else head
        if self.dirty:
            text += f" +uncommitted {str(self.diff_sha256 or '?')[:8]}"
        return text


def _shown(raw: dict[str, Any]) -> str:
    return error_of(raw) or GitEntry.from_raw(raw).describe()


def repo_of(path: str, repos: Iterable[str]) -> str | None:
    """The recorded repo that holds ``path`` (the innermost one), or None."""
    inside = [r for r in repos if path.startswith(r.rstrip("/") + "/")]
    return max(inside, key=len) if inside else None


@register
class Git(Section):
    name = "git"
    word = "git repo"
    rank = 3
    bisectable = True

    def compare(
        self, src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
    ) -> Iterator[Found]:
        for pair in entry_pairs(self.name, src, g, b, _shown):
            if not pair.both:
                yield Found(pair.change(self.name))
                continue
            old, new = GitEntry.from_raw(pair.old), GitEntry.from_raw(pair.new)
            note = None
            if old.untracked != new.untracked:
                note = f"untracked {count(old.untracked)} → {count(new.untracked)}"
            if pair.shown_old == pair.shown_new and note is None:
                yield Found(pair.change(self.name, METADATA_NOTE), volatile=True)
            else:
                yield Found(pair.change(self.name, note))

    def refine(self, unit: Unit, ctx: DiffContext) -> Unit:
        change = unit.changes[0]
        if change.kind is not ChangeKind.ADDED and self._entry(ctx, "good", change.key).dirty:
            return replace(unit, bisectable=False, reason=DIRTY_REASON)
        return unit

    def regroup(self, units: list[Unit], ctx: DiffContext) -> list[Unit]:
        """A file tracked by a recorded repo whose commit changed is part of that repo's
        unit: with both sides clean its content is the commits' content, and counting it
        again as a ``files:`` unit would bisect the same change twice. With either side
        dirty or holding untracked files the file's change may be uncommitted, so it stays
        a unit of its own."""
        clean = self._clean_repos(units, ctx)
        if not clean:
            return units
        folded: dict[str, list[Change]] = {}
        kept: list[Unit] = []
        for unit in units:
            repo = repo_of(str(unit.changes[0].key), clean) if unit.section == "files" else None
            # Without stored content it is still realized: the worktree has it.
            if repo is not None and (unit.bisectable or unit.reason == NO_CONTENT_REASON):
                notes = (replace(c, note=COMMITTED_NOTE) for c in unit.changes)
                folded.setdefault(repo, []).extend(notes)
            else:
                kept.append(unit)
        return [self._with_files(u, folded) for u in kept]

    @staticmethod
    def _with_files(unit: Unit, folded: Mapping[str, list[Change]]) -> Unit:
        if unit.section != "git" or unit.changes[0].key not in folded:
            return unit
        return replace(unit, changes=unit.changes + tuple(folded[unit.changes[0].key]))

    def _clean_repos(self, units: list[Unit], ctx: DiffContext) -> set[str]:
        # Clean means nothing uncommitted *and* nothing untracked: a manifest does not say
        # whether a listed file is tracked, and an untracked one (a local config, a knob
        # file) is not in a worktree at any commit, so it must stay a unit that writes it.
        repos = {u.changes[0].key for u in units if u.section == "git" and len(u.changes) == 1}
        return {
            repo
            for repo in repos
            if not any(
                self._entry(ctx, side, repo).dirty or self._entry(ctx, side, repo).untracked
                for side in ("good", "bad")
            )
        }

    def _entry(self, ctx: DiffContext, side: str, repo: str) -> GitEntry:
        return GitEntry.from_raw(ctx.entries(side, self.name).get(repo))
