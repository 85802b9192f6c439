"""A bisection session on disk: append-only log, file journal, sandboxes, lock.

Layout of a session directory (default ``.envbisect/session/``)::

    log.jsonl        append-only events: start, trial, worktree, venv, end, interrupted, reset
    journal.jsonl    every in-place file swap, written *before* the file is touched
    backups/N        the original bytes of swap N
    trials/NNN/      full stdout/stderr (and result files) of every run of trial NNN
    venvs/<hash>/    one uv venv per distinct package set
    bytecode/...     .pyc files of target packages installed without them, shared by the
                     venvs (a mirror of the real source directories' paths)
    worktrees/...    git worktrees at the commits the trials needed
    caches/...       copies of warm compile caches
    lock             pid of the envbisect process using the session

Every event line is one JSON object; a torn last line (``kill -9`` mid-write) is ignored.
``--resume`` reads the trial events back so no finished trial is repeated, and
``reset`` restores every journaled file, removes the worktrees and the venvs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbisect.agent import journal
from envbisect.agent.procfs import read_stat
from envbisect.agent.redact import redact_tree
from envbisect.model import gitcli
from envbisect.model.errors import SessionError
from envbisect.model.events import (
    ResetEvent,
    ResumedEvent,
    SessionEvent,
    StartEvent,
    TrialRecord,
    WorktreeEvent,
)

LOG_NAME = "log.jsonl"
JOURNAL_NAME = "journal.jsonl"
LOCK_NAME = "lock"


_append_line = journal.append_line


def _read_lines(path: Path | str) -> list[dict[str, Any]]:
    """``journal.read_lines``, its JournalError (a line that is not UTF-8) a SessionError."""
    try:
        return list(journal.read_lines(str(path)))
    except journal.JournalError as exc:
        raise SessionError(str(exc)) from None


def state_key(applied: Iterable[str], positions: Iterable[tuple[str, int]] = ()) -> str:
    """A stable key for a state: sorted unit ids plus ordered-unit positions."""
    body = json.dumps({"a": sorted(applied), "p": sorted(list(p) for p in positions)})
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class KeptEdit:
    """A journaled file the user changed after envbisect swapped it: kept as the user left
    it; the original (when there was one) was written to ``original``."""

    path: Path
    original: Path | None

    def describe(self) -> str:
        if self.original is None:
            return (
                f"kept {self.path}: it changed after envbisect created it, so your version "
                "stays (it did not exist before)"
            )
        return (
            f"kept {self.path}: it changed after envbisect swapped it, so your version "
            f"stays; the original is in {self.original}"
        )


@dataclass
class FileJournal:
    """In-place file swaps that can always be undone, even after ``kill -9``.

    The rules live in ``envbisect.agent.journal`` (shared with remote targets): the original
    is journaled before the file is touched; a file is locked machine-wide (by its real
    path) before its first swap, so a second session cannot journal our swapped-in content as
    its "original"; ``restore`` puts back only files that still hold what envbisect wrote —
    an edit made since is kept, the original written beside it (see ``kept``); hard-linked
    files are written through their inode. Restoring is idempotent.
    """

    path: Path
    backups: Path
    session: str | None = None  # who holds the file locks (default: the journal's directory)
    kept: list[KeptEdit] = field(default_factory=list)
    _open: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.session is None:
            self.session = str(Path(self.path).absolute().parent)
        for entry in self.open_swaps():
            self._open[entry["path"]] = int(entry["id"])

    def open_swaps(self) -> list[dict[str, Any]]:
        """Swap entries with no ``restored`` entry yet, in order."""
        try:
            return list(journal.open_swaps(str(self.path)))
        except journal.JournalError as exc:
            raise SessionError(str(exc)) from None

    def claim(self, target: Path) -> None:
        """Lock ``target`` for this session until :meth:`release` (SessionError naming the
        holder's pid and session when another run has it)."""
        owner = {"session": self.session, "journal": str(Path(self.path).absolute())}
        try:
            journal.claim(str(target), dict(owner, pid=os.getpid()), hold=True)
        except journal.JournalError as exc:
            raise SessionError(str(exc)) from None

    def release(self) -> None:
        """Give up every file lock this session holds."""
        journal.release(self.session)

    def swap(self, target: Path, content: bytes | None) -> None:
        """Replace ``target`` by ``content`` (None: remove it), journaling the original."""
        target = Path(target)
        key = str(target)
        self.claim(target)
        try:
            self._open[key] = journal.swap(
                str(self.path), str(self.backups), key, content, self._open.get(key)
            )
        except journal.JournalError as exc:
            raise SessionError(str(exc)) from None
        except OSError as exc:  # a full disk: the file itself is written by rename or not at all
            raise SessionError(
                f"{key}: cannot swap it: {exc.strerror or exc}; if it is not as it was, put it "
                f"back with 'envbisect reset --session {self.session}'"
            ) from None

    def restore(self) -> list[Path]:
        """Put every open swap back; returns the paths that hold their original again.

        A file changed since envbisect wrote it is not overwritten: it lands in ``kept``.
        """
        try:
            outcomes = journal.restore(str(self.path), str(self.backups))
        except journal.JournalError as exc:
            raise SessionError(
                f"{self.path}: {exc}; put it back with 'envbisect reset --session {self.session}'"
            ) from None
        self._open.clear()
        done: list[Path] = []
        for item in outcomes:
            if item["outcome"] == "kept":
                original = Path(item["original"]) if item["original"] else None
                self.kept.append(KeptEdit(Path(item["path"]), original))
            else:
                done.append(Path(item["path"]))
        return done


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed, not yet reaped by its parent) answers kill(0) but holds nothing.
    proc = read_stat(pid)
    return proc is None or proc.state != "Z"


class Session:
    """One session directory. Create with ``Session.start`` / ``Session.resume``."""

    def __init__(self, root: Path) -> None:
        # ``--session ../s`` or a config one folder up: ``a/../s`` as ``s`` (paths under the
        # root are compared as text with what a state check reports)
        self.root = Path(os.path.abspath(root))
        if self.root.exists() and not self.root.is_dir():
            raise SessionError(f"{self.root}: is not a directory (--session names a directory)")
        self.log_path = self.root / LOG_NAME
        self.journal = FileJournal(
            self.root / JOURNAL_NAME, self.root / "backups", session=str(self.root)
        )
        self._locked = False
        self.replaced: str | None = None  # why the earlier session here was replaced

    def replaceable(self) -> str | None:
        """Why this finished session may be replaced without --fresh: it ended in error and
        no process of it gave a sample or crashed. None when it holds a measurement."""
        end = self.end_event()
        if end is None or end.get("outcome") != "error" or not self.finished():
            return None
        if any(t.samples or t.crashes for t in self.trials()):
            return None
        first = (str(end.get("message") or "").strip().splitlines() or [""])[0]
        if len(first) > 120:
            first = first[:119].rstrip(" ;:,") + "…"
        said = f" ({first})" if first else ""
        what = "the earlier run ended in error before measuring anything"
        return f"{self.root}: {what}{said}; replaced"

    # -- opening -----------------------------------------------------------------------

    @classmethod
    def start(cls, root: Path, header: Mapping[str, Any], *, fresh: bool = False) -> Session:
        """A new session at ``root``. An earlier session there is kept unless ``fresh``
        (its history is the only record of what was measured): continue it with --resume
        or replace it with --fresh. ``fresh`` restores and removes it first. One that ended in
        error before any process gave a sample (a usage mistake: no metric, a wrong path) has
        nothing to lose and is replaced without asking; ``replaced`` then says so."""
        session = cls(root)
        if session.log_path.exists():
            holder = session.lock_holder()
            if holder is not None:
                raise SessionError(f"{session.root}: in use by envbisect process {holder}")
            note = session.replaceable()
            if not fresh and note is None:
                n = len(session.trials())
                end = session.end_event()
                how = (
                    f"ended {end.get('outcome')}"
                    if end is not None and session.finished()
                    else "unfinished"
                )
                raise SessionError(
                    f"{session.root}: holds an earlier run's session ({n} trials, {how}); "
                    "continue it with --resume or replace it with --fresh"
                )
            session.lock()  # a live owner is an error; a dead one's swaps are put back
            session.reset()
            shutil.rmtree(session.root)
            session = cls(root)
            session.replaced = None if fresh else note
        session.root.mkdir(parents=True, exist_ok=True)
        _ignored_by_git(session.root.parent)
        session.lock()
        session.append(StartEvent(time.time(), header))
        return session

    @classmethod
    def resume(cls, root: Path) -> Session:
        """Reopen an existing session to continue it."""
        session = cls(root)
        if session.header() is None:
            raise SessionError(f"{session.root}: no session to resume (no {LOG_NAME})")
        session.lock()
        # A previous process may have died with files swapped in place.
        session.journal.restore()
        session.append(ResumedEvent(time.time()))
        return session

    @classmethod
    def existing(cls, root: Path) -> Session:
        """Open for reading (log, reset); raises when there is no session."""
        session = cls(root)
        if not session.root.is_dir() or not session.log_path.exists():
            raise SessionError(f"{session.root}: no bisection session there")
        return session

    def lock_holder(self) -> int | None:
        """The pid of another live envbisect process using this session, if any."""
        try:
            pid = int((self.root / LOCK_NAME).read_text().strip())
        except (OSError, ValueError):
            return None
        if pid and pid != os.getpid() and _pid_alive(pid):
            return pid
        return None

    def lock(self) -> None:
        """Take the session for this process; a live other owner is an error."""
        pid = self.lock_holder()
        if pid is not None:
            raise SessionError(f"{self.root}: in use by envbisect process {pid}")
        (self.root / LOCK_NAME).write_text(f"{os.getpid()}\n")
        self._locked = True

    def unlock(self) -> None:
        """Give the session and the locks on its swapped files back."""
        self.journal.release()
        if self._locked:
            with contextlib.suppress(FileNotFoundError):
                (self.root / LOCK_NAME).unlink()
            self._locked = False

    # -- events ------------------------------------------------------------------------

    def append(self, event: SessionEvent) -> None:
        """Log ``event``; secret-shaped strings in it (a token in the smoke command, in a
        failure message) are redacted first (``envbisect.agent.redact``)."""
        _append_line(self.log_path, {k: redact_tree(v) for k, v in event.to_dict().items()})

    def events(self) -> list[dict[str, Any]]:
        return _read_lines(self.log_path)

    def header(self) -> dict[str, Any] | None:
        for ev in self.events():
            if ev.get("type") == "start":
                return ev
        return None

    def finished(self) -> bool:
        """True when the last run ended (any outcome) or was reset."""
        last = None
        for ev in self.events():
            if ev.get("type") in ("start", "resumed", "end", "reset"):
                last = ev.get("type")
        return last in ("end", "reset")

    def trials(self) -> list[TrialRecord]:
        """One record per trial number: a state's later sample batches (logged as further
        ``trial`` events with the same index) are merged into it."""
        out: dict[int, TrialRecord] = {}
        for e in self.events():
            if e.get("type") != "trial":
                continue
            rec = TrialRecord.from_event(e)
            out[rec.index] = out[rec.index].merged(rec) if rec.index in out else rec
        return [out[i] for i in sorted(out)]

    def verdicts(self) -> dict[int, dict[str, Any]]:
        """trial number → the last ``verdict`` event the run logged for it (what ``run``
        printed: verdict, median, outlier)."""
        out: dict[int, dict[str, Any]] = {}
        for e in self.events():
            if e.get("type") == "verdict" and "index" in e:
                out[int(e["index"])] = e
        return out

    def end_event(self) -> dict[str, Any] | None:
        ends = [e for e in self.events() if e.get("type") == "end"]
        return ends[-1] if ends else None

    def next_trial_index(self) -> int:
        return 1 + max((t.index for t in self.trials()), default=0)

    def trial_dir(self, index: int) -> Path:
        path = self.root / "trials" / f"{index:03d}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def record_worktree(self, repo: Path, path: Path) -> None:
        self.append(WorktreeEvent(str(repo), str(path)))

    def worktrees(self) -> list[tuple[Path, Path]]:
        seen: dict[str, str] = {}
        for ev in self.events():
            if ev.get("type") == "worktree":
                seen[str(ev["path"])] = str(ev["repo"])
        return [(Path(repo), Path(path)) for path, repo in seen.items()]

    # -- cleanup -----------------------------------------------------------------------

    def remove_worktrees(self) -> list[Path]:
        """``git worktree remove --force`` every worktree of this session, then prune."""
        removed: list[Path] = []
        repos: set[Path] = set()
        for repo, path in self.worktrees():
            repos.add(repo)
            if path.exists():
                gitcli.remove_worktree(repo, path)
                if path.exists():
                    shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        for repo in repos:
            gitcli.prune_worktrees(repo)
        return removed

    def reset(self) -> ResetReport:
        """Restore journaled files, remove worktrees, venvs and cache copies."""
        for entry in self.journal.open_swaps():
            # Take over the dead run's locks (refused while a live run holds one), so they
            # are removed with the restore.
            self.journal.claim(Path(entry["path"]))
        restored = self.journal.restore()
        worktrees = self.remove_worktrees()
        removed_dirs: list[Path] = []
        # Trials' cache dirs too: a run killed mid-trial never removed its copy.
        trial_caches = sorted(self.root.glob("trials/*/caches"))
        for path in [
            *(self.root / n for n in ("venvs", "bytecode", "worktrees", "caches", "sandbox")),
            *trial_caches,
        ]:
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
                removed_dirs.append(path)
        if self.log_path.exists():
            self.append(ResetEvent(time.time()))
        self.unlock()
        return ResetReport(
            tuple(restored), tuple(worktrees), tuple(removed_dirs), tuple(self.journal.kept)
        )


@dataclass(frozen=True)
class ResetReport:
    """What ``reset`` put back and removed, and the files it left as the user changed them."""

    restored: tuple[Path, ...]
    worktrees: tuple[Path, ...]
    removed: tuple[Path, ...]
    kept: tuple[KeptEdit, ...] = ()


def _ignored_by_git(folder: Path) -> None:
    """The default ``.envbisect/`` (run from inside a repo it sits in the user's worktree)
    holds a ``.gitignore`` of ``*``: ``git status`` never lists the sessions."""
    if folder.name != ".envbisect":
        return
    with contextlib.suppress(OSError):
        marker = folder / ".gitignore"
        if not marker.exists():
            marker.write_text("# envbisect's sessions: never part of the repo\n*\n")
