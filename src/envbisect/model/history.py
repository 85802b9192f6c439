"""A guilty file's history inside its repo: the versions a run can bisect, and its hunks.

A file unit inside a recorded repo changes from the good state's content (the file at the
good commit) to the bad state's (the file at the bad commit, plus any uncommitted edit).
``file_history`` splits that change into the file's content after each commit of
``good..bad`` that touched it, then the uncommitted remainder: the items the engine bisects
the unit over (``SearchSettings.ordered``), each a content stored in the run's blob folder
so the files realizer swaps it in like any stored content.

``HunkCulprit`` is the finest grain a run names: the version (commit or the uncommitted
edit) where the file turned slow, and the hunk of that version that did it, found by
``bisect.narrow.isolate_hunks``. Reading git and writing blobs is this module's only I/O.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbisect.model import gitcli
from envbisect.model.hunks import Hunk

UNCOMMITTED = "uncommitted"  # the item of the edit on top of the bad commit


@dataclass(frozen=True)
class FileVersion:
    """The file's content after one item: a commit (``item`` its sha) or the uncommitted
    edit (``item`` is ``UNCOMMITTED``; its content is the bad state's own entry and blob,
    so ``size`` is -1, not read here)."""

    item: str
    sha256: str
    size: int
    subject: str | None = None
    date: str | None = None  # author date, ISO 8601

    @property
    def committed(self) -> bool:
        return self.item != UNCOMMITTED

    def value(self) -> dict[str, Any]:
        """The ``files:`` entry of this content (its blob is in the run's blob folder)."""
        return {"sha256": self.sha256, "size": self.size, "blob": self.sha256}


def store(blobs: Path, content: bytes) -> str:
    """Write ``content`` as ``blobs/<sha256>`` (once; atomically); its sha256."""
    sha = hashlib.sha256(content).hexdigest()
    path = blobs / sha
    if not path.is_file():
        blobs.mkdir(parents=True, exist_ok=True)
        tmp = blobs / f".{sha}.{os.getpid()}.tmp"
        tmp.write_bytes(content)
        tmp.replace(path)
    return sha


def commit_facts(
    repo: str, commit: str, via: gitcli.Exec | None = None
) -> tuple[str | None, str | None]:
    """(subject, author date) of ``commit``; (None, None) when git cannot say."""
    res = gitcli.commit_facts(repo, commit, via)
    lines = res.stdout.splitlines()
    if not res.ok or len(lines) < 3:
        return None, None
    return lines[2], lines[1]


def file_history(
    repo: str,
    key: str,
    heads: tuple[str, str],
    shas: tuple[str | None, str | None],
    blobs: Path,
    via: gitcli.Exec | None = None,
) -> tuple[FileVersion, ...]:
    """The versions of file ``key`` (absolute, inside ``repo``) after the good commit, oldest
    first: one per commit of ``heads[0]..heads[1]`` that touched it, then the uncommitted
    edit when the bad content (``shas[1]``) is not the bad commit's. Each content is stored
    under ``blobs``. Empty when the history does not lead from the good content to the bad
    one (the good side had the file edited by hand, a commit lacks it, git fails): the unit
    is then bisected as one change, as before. ``via``: the repo is on a target, read there."""
    rel = os.path.relpath(key, repo)
    good, bad = heads
    if not shas[0] or not shas[1] or rel.startswith(".."):
        return ()
    start = gitcli.show_file(repo, good, rel, via=via)
    if start is None or hashlib.sha256(start).hexdigest() != shas[0]:
        return ()
    listed = gitcli.file_commits(repo, good, bad, rel, via)
    if not listed.ok:
        return ()
    out: list[FileVersion] = []
    for commit in listed.stdout.split():
        content = gitcli.show_file(repo, commit, rel, via=via)
        if content is None:
            return ()
        subject, date = commit_facts(repo, commit, via)
        out.append(FileVersion(commit, store(blobs, content), len(content), subject, date))
    last = out[-1].sha256 if out else shas[0]
    if last != shas[1]:
        out.append(FileVersion(UNCOMMITTED, str(shas[1]), -1))
    return tuple(out)


@dataclass(frozen=True)
class HunkCulprit:
    """The version and hunk of a file that made it slow, as a run presents it.

    ``version``: the commit or the uncommitted edit where the file turned slow (the first
    bad item); ``hunks``: that version's change, split; ``culprit``: the guilty hunk (None
    when the search could not get down to one: ``candidates``); ``together``: hunks the
    culprit was slow with (empty when it is slow alone); ``cleared``: the other hunks.
    ``good``/``bad``: medians of the evidence (without / with the hunk), ``trials``: how
    many trials the hunk search took, ``good_trial``/``bad_trial`` their numbers.
    """

    unit: str
    file: str
    shown: str  # the file as the user knows it: repo folder name / path in the repo
    version: FileVersion
    hunks: tuple[Hunk, ...]
    culprit: Hunk | None
    candidates: tuple[Hunk, ...] = ()
    together: tuple[Hunk, ...] = ()
    good: float | None = None
    bad: float | None = None
    trials: int = 0
    good_trial: int | None = None
    bad_trial: int | None = None
    repo: str = ""
    # candidates each tested alone and none judged (crashed, unresolved): slow only together
    apart_unjudged: bool = False

    def where(self, hunk: Hunk) -> str:
        """``repo/model.py`` of one of the hunks."""
        return shown_path(self.repo, hunk.path) if self.repo and hunk.path else self.shown

    @property
    def files(self) -> tuple[str, ...]:
        """The files the change's hunks are in (one for a file unit)."""
        return tuple(sorted({self.where(h) for h in self.hunks}))

    @property
    def cleared(self) -> tuple[Hunk, ...]:
        keep = {h.number for h in (*self.candidates, *self.together)}
        if self.culprit is not None:
            keep.add(self.culprit.number)
        return tuple(h for h in self.hunks if h.number not in keep)

    def as_dict(self) -> dict[str, Any]:
        v = self.version
        return {
            "file": self.file,
            "commit": v.item if v.committed else None,
            "uncommitted": not v.committed,
            "subject": v.subject,
            "author_date": v.date,
            "hunk": self.culprit.header if self.culprit is not None else None,
            "hunk_text": self.culprit.text if self.culprit is not None else None,
            "hunks": len(self.hunks),
            "files": list(self.files),
            "candidates": [h.header for h in self.candidates],
            "together_with": [h.header for h in self.together],
            "cleared": [h.header for h in self.cleared],
            "good_median_tok_per_s": self.good,
            "bad_median_tok_per_s": self.bad,
            "trials": self.trials,
            "evidence": {"good_trial": self.good_trial, "bad_trial": self.bad_trial},
        }


def shown_path(repo: str, key: str) -> str:
    """``repo/model.py``: the repo folder's name and the file's path inside it."""
    return os.path.join(Path(repo).name, os.path.relpath(key, repo))


def hunk_numbers(hunks: Sequence[Hunk]) -> str:
    return ", ".join(str(h.number) for h in hunks)
