"""A unit's states between and beyond its two endpoints, and the positions that stand for them.

The engine moves a unit through positions; the actuator turns a position into the values of
the unit's changes. The ranges come from the target and the repos (:func:`commit_ranges`: a
git unit's commits; :func:`file_versions`: a file's versions in its repo); the states a run
adds on the way are registered in :class:`Variants` (the hunk step: a file's content with
some hunks, a worktree with some files replaced; the package step: a component of the torch
stack, a release between the endpoints).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbisect.model.files import FileEntry
from envbisect.model.gitcli import Exec
from envbisect.model.history import FileVersion, file_history
from envbisect.model.manifest import Manifest
from envbisect.sections.git import GitEntry, repo_of

Revlists = Mapping[tuple[str, ...], list[str] | None]  # (repo, old, new) → commits (``Facts``)


def realized_changes(unit: Any) -> list[Any]:
    """The changes an actuator makes real for ``unit``: a git unit's committed files come
    with its worktree (see ``diff.COMMITTED_NOTE``) and are not written on their own."""
    if unit.section == "git":
        return [c for c in unit.changes if c.section == "git"]
    return list(unit.changes)


@dataclass
class Variants:
    """The states a run registers beyond its units' endpoints (an actuator's copies for
    other workers share it: a state registered once is one position everywhere)."""

    # A file unit inside a repo: its contents a position stands for (``history``): the
    # versions the engine bisects over, then the hunk subsets the run registers.
    files: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    versions: dict[str, tuple[FileVersion, ...]] = field(default_factory=dict)
    # A git unit's states beyond its commits (the hunk step): its worktree at a position
    # (-1: the good commit) with some files' contents replaced ({file key: files value}).
    commits: dict[str, list[tuple[int, dict[str, dict[str, Any]]]]] = field(default_factory=dict)
    # A package unit's states beyond all-or-nothing (the package step: a component of the
    # torch stack, a release between the endpoints): {package key: its value}; the unit's
    # other changes keep the good state's values.
    packages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add_file(self, unit_id: str, value: dict[str, Any]) -> int:
        """Register a ``files:`` value of file unit ``unit_id``: its position."""
        variants = self.files.setdefault(unit_id, [])
        if value not in variants:
            variants.append(value)
        return variants.index(value)

    def file(self, unit_id: str, pos: int, value: Any) -> Any:
        """The file value at ``pos`` (``value`` when no variant stands there)."""
        variants = self.files.get(unit_id)
        if variants and 0 <= pos < len(variants):
            return variants[pos]
        return value

    def add_commit(
        self, unit_id: str, base: int, files: dict[str, dict[str, Any]], commits: int
    ) -> int:
        """Register git unit ``unit_id``'s worktree at ``base`` with ``files`` written into
        it: its position (past the unit's ``commits`` commits)."""
        variants = self.commits.setdefault(unit_id, [])
        if (base, files) not in variants:
            variants.append((base, files))
        return commits + variants.index((base, files))

    def commit(
        self, unit_id: str, pos: int, commits: Callable[[], int]
    ) -> tuple[int, dict[str, Any]] | None:
        """The (base, files) state at ``pos`` of git unit ``unit_id`` (None: a commit);
        ``commits``: how many commits the unit has (asked only when it has variants)."""
        variants = self.commits.get(unit_id)
        if not variants:
            return None
        i = pos - commits()
        return variants[i] if 0 <= i < len(variants) else None

    def add_package(self, unit_id: str, values: Mapping[str, Any]) -> int:
        """Register package values of unit ``unit_id``: its position."""
        variants = self.packages.setdefault(unit_id, [])
        wanted = dict(sorted(values.items()))
        if wanted not in variants:
            variants.append(wanted)
        return variants.index(wanted)

    def package(
        self, unit_id: str, pos: int, key: str, good: Manifest, bad: Manifest
    ) -> tuple[Manifest, Any]:
        """(source, value) of change ``key`` of package unit ``unit_id`` at ``pos``."""
        variant = self.packages[unit_id][pos]
        if key in variant:
            return bad, variant[key]
        return good, good.section("packages").get(key)


def commit_ranges(
    good: Manifest, bad: Manifest, units: Sequence[Any], revlists: Callable[[], Revlists]
) -> dict[str, list[str]]:
    """git unit id → commits after good's head up to bad's head (oldest first), for each unit
    that is one repo's commit change with more than one commit (``revlists``: the target's
    answers, asked only when such a unit exists)."""
    out: dict[str, list[str]] = {}
    for unit in units:
        gits = [c for c in unit.changes if c.section == "git"]
        if len(gits) != 1 or len(realized_changes(unit)) != 1:
            continue
        key = str(gits[0].key)
        old = GitEntry.of(good.section("git").get(key)).head
        new = GitEntry.of(bad.section("git").get(key)).head
        if not old or not new:
            continue
        commits = list(revlists().get((key, old, new)) or [])
        if len(commits) > 1:
            out[unit.id] = commits
    return out


def file_versions(
    good: Manifest, bad: Manifest, units: Sequence[Any], blobs: Path, via: Exec | None = None
) -> dict[str, tuple[FileVersion, ...]]:
    """file unit id → its versions after the good commit (``history.file_history``, their
    contents stored under ``blobs``), for a file inside a recorded repo whose commit changed
    (the repo is read here, or through ``via`` on a remote target)."""
    out: dict[str, tuple[FileVersion, ...]] = {}
    repos = bad.section("git")
    for unit in units:
        if unit.section != "files" or len(unit.changes) != 1:
            continue
        key = str(unit.changes[0].key)
        repo = repo_of(key, [str(r) for r in repos])
        if repo is None:
            continue
        heads = (
            GitEntry.of(good.section("git").get(repo)).head,
            GitEntry.of(repos.get(repo)).head,
        )
        entries = [FileEntry.of(m.section("files").get(key)) for m in (good, bad)]
        if not heads[0] or not heads[1] or heads[0] == heads[1] or None in entries:
            continue
        shas = (entries[0].sha256, entries[1].sha256)  # type: ignore[union-attr]
        versions = file_history(repo, key, (heads[0], heads[1]), shas, blobs, via)
        if versions:
            out[unit.id] = versions
    return out
