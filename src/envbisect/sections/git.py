"""``git``: recorded repos by path, ``{head, branch, dirty, diff_sha256, untracked}``.
A change is a new commit (shown as ``head (branch)``), uncommitted changes (by hash) or a
different set of untracked files. A repo is bisectable unless the good side was dirty (its
uncommitted changes are known by hash only); a git unit found guilty is narrowed over the
commits between the two heads. A changed file that the repo tracks moves with it (see
:meth:`Git.regroup`). Realized as a worktree at the state's commit (its realizer, below).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envbisect.model.changes import (
    METADATA_NOTE,
    Change,
    ChangeKind,
    EntryPair,
    Found,
    Unit,
    count,
)
from envbisect.model.plan import Context, FactQuery, Plan, Sandbox, Values
from envbisect.sections import DiffContext, KeyedSection, register
from envbisect.sections.files import NO_CONTENT_REASON

COMMITTED_NOTE = "committed in this repo: moves with its commits"
DIRTY_REASON = (
    "the good side had uncommitted changes, which a manifest records by hash only; "
    "commit them to make this repo bisectable"
)


@dataclass(frozen=True)
class GitEntry:
    """A ``git:`` entry: the commit checked out, the branch, whether the tree was dirty."""

    head: str | None = None
    branch: str | None = None
    dirty: bool = False
    diff_sha256: str | None = None
    untracked: Any = None

    @classmethod
    def of(cls, value: Any) -> GitEntry:
        """The entry of ``value``; an absent or malformed one has no head."""
        if not isinstance(value, Mapping):
            return cls()
        head, branch = value.get("head"), value.get("branch")
        return cls(
            head=str(head) if head else None,
            branch=str(branch) if branch else None,
            dirty=bool(value.get("dirty")),
            diff_sha256=value.get("diff_sha256"),
            untracked=value.get("untracked"),
        )

    def describe(self) -> str:
        """``head (branch)`` plus ``+uncommitted <hash>`` when dirty."""
        head = str(self.head or "?")[:12]
        text = f"{head} ({self.branch})" if self.branch else head
        if self.dirty:
            text += f" +uncommitted {str(self.diff_sha256 or '?')[:8]}"
        return text


def repo_of(path: str, repos: Iterable[str]) -> str | None:
    """The recorded repo that holds ``path`` (the innermost one), or None."""
    inside = [r for r in repos if path.startswith(r.rstrip("/") + "/")]
    return max(inside, key=len) if inside else None


# ---- realizing-------------------------------------------------------------------------


class GitRealizer:
    """A detached worktree at the state's commit; the command's cwd moves into it when it was
    inside the repo, and argv paths into the repo name the worktree's copy."""

    section = "git"

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None:
        heads = [GitEntry.of(v).head for v in (old, new)]
        query.commits.update((key, h) for h in heads if h)
        if heads[0] and heads[1]:
            query.revlists.add((key, heads[0], heads[1]))

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None:
        unsafe = ctx.facts().unsafe.get(key)
        if unsafe is not None:
            return (
                f"git {key}: git refuses the repo as unsafe (owned by another user; see git's "
                f"safe.directory): {unsafe}"
            )
        for value in (old, new):
            head = GitEntry.of(value).head
            if not head or not ctx.facts().commits.get((key, head)):
                return f"git {key}: commit {str(head)[:12]} is not in that repo"
        return None

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan:
        worktrees: list[tuple[str, str, str]] = []
        for key, (_src, value) in sorted(values.items()):
            head = GitEntry.of(value).head
            if not head:
                return plan.failed(f"git {key}: the state has no commit")
            worktrees.append((key, head, f"{sandbox.root}/worktrees/{worktree_name(key, head)}"))
        if not worktrees:
            return plan
        plan = replace(
            plan,
            worktrees=plan.worktrees + tuple(worktrees),
            path_map=plan.path_map + tuple((repo, path) for repo, _h, path in worktrees),
        )
        mapped = None
        for repo, _head, path in worktrees:
            with contextlib.suppress(ValueError):
                mapped = Path(path) / sandbox.origin.relative_to(repo)
        # Run from outside every repo, the command runs where it was typed (its paths into
        # the repo are mapped, see envbisect.model.argvmap). A remote target has no such place:
        # there a single repo's worktree is where it runs.
        if mapped is None and len(worktrees) == 1 and not sandbox.local:
            mapped = Path(worktrees[0][2])
        if mapped is None:
            return plan
        return replace(plan, cwd=mapped).with_env({"PWD": str(mapped)})


def worktree_name(repo: str, head: str) -> str:
    """The directory name of ``repo``'s worktree at ``head`` (unique per repo path)."""
    tag = hashlib.sha256(str(repo).encode()).hexdigest()[:8]
    return f"{Path(repo).name}-{tag}-{head[:12]}"


@register
class Git(KeyedSection):
    name = "git"
    word = "git repo"
    bisectable = True
    realizer = GitRealizer()

    def describe(self, raw: dict[str, Any]) -> str:
        return GitEntry.of(raw).describe()

    def judge_both(self, pair: EntryPair, old: dict[str, Any], new: dict[str, Any]) -> Found:
        was, now = GitEntry.of(old).untracked, GitEntry.of(new).untracked
        note = f"untracked {count(was)} → {count(now)}" if was != now else None
        if pair.shown_old == pair.shown_new and note is None:
            return Found(pair.change(self.name, METADATA_NOTE), volatile=True)
        return Found(pair.change(self.name, note))

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
        return GitEntry.of(ctx.entries(side, self.name).get(repo))
