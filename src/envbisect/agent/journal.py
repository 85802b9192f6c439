"""Journaled in-place file swaps, and the machine-wide lock on every swapped file.

Stdlib only, Python 3.8+ syntax: the host's ``bisect.session.FileJournal`` uses it, and it is
shipped with ``agent.actuate_remote`` so a remote target's swaps follow the same rules.

The journal is ``journal.jsonl`` (lines fsynced *before* the file is touched) and
``backups/N`` (the original bytes of swap N)::

    {"op": "swap", "id": N, "path": ..., "existed": ..., "sha256": <original>, "put": <ours>,
     "inplace": <bool>, ...}
    {"op": "put", "id": N, "put": <ours>}        a later content for the same open swap
    {"op": "written", "id": N}                   an in-place write finished (see below)
    {"op": "restored", "id": N, "path": ..., "outcome": "restored" | "kept" | "unchanged"}

Three rules keep a user's file safe:

- **Restore only what is still ours.** A swap is put back only while the file holds exactly
  what envbisect wrote (sha256 ``put``; ``None`` when envbisect removed it). A file that
  changed since (the user edited it during a run or after a ``kill -9``) is left as the user
  made it, and the original is written beside it as ``<name>.envbisect-original``.
- **Hard links stay linked.** A file with more than one link is written *in place* (same
  inode) on swap and on restore, so the other names keep pointing at it. An in-place write
  is not atomic, so it is bracketed: a swap with no ``written`` line after its last ``put``
  was cut off mid-write and is restored whatever the file now holds.
- **One swapper per file, machine-wide.** Before a file is swapped, a lock keyed by its real
  path is taken under ``$ENVBISECT_LOCK_DIR`` (default: this user's 0700 ``lock_dir()``). A process
  that keeps running between swaps (the host) holds it with ``flock`` until it releases it;
  one-shot agent processes (remote targets) leave the lock file as the claim, released by
  their ``cleanup``. A second session is refused with the holder's pid and session; a holder
  that died with the file still swapped is named too, with the reset that puts it back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from typing import Any

from envbisect.agent.durable import (
    JournalError,
    append_line,
    atomic_write,
    file_state,
    read_lines,
    sha256_of,
    sha_bytes,
    write_in_place,
)
from envbisect.agent.procfs import read_stat

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = (
    "envbisect.agent.durable",
    "envbisect.agent.procfs",
)

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: no machine-wide lock, journal only
    fcntl = None  # type: ignore[assignment]

LOCK_DIR_ENV = "ENVBISECT_LOCK_DIR"
# Per user, never a world-writable directory: $XDG_RUNTIME_DIR/envbisect-locks, else
# ~/.cache/envbisect/locks (0700, owned by the user; checked before every use).
LOCK_DIR_NAME = "envbisect-locks"
ORIGINAL_SUFFIX = ".envbisect-original"

# Locks this process holds with flock: real path -> (fd, session).
_HELD: dict[str, tuple[int, Any]] = {}


# ---- the machine-wide lock ------------------------------------------------------------------


def lock_dir():
    """Where this user's per-file locks live: ``$ENVBISECT_LOCK_DIR``, else
    ``$XDG_RUNTIME_DIR/envbisect-locks``, else ``~/.cache/envbisect/locks``."""
    if os.environ.get(LOCK_DIR_ENV):
        return os.environ[LOCK_DIR_ENV]
    runtime = os.environ.get("XDG_RUNTIME_DIR") or ""
    if os.path.isabs(runtime) and os.path.isdir(runtime):
        return os.path.join(runtime, LOCK_DIR_NAME)
    cache = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(cache):
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "envbisect", "locks")


def lock_path(target):
    """The lock file of ``target``, keyed by its real path."""
    real = os.path.realpath(target)
    return os.path.join(lock_dir(), hashlib.sha256(real.encode("utf-8")).hexdigest()[:32] + ".lock")


def _open_swaps_of(journal, real):
    """Open swaps in another session's ``journal`` whose file is ``real``."""
    return [e for e in open_swaps(journal) if os.path.realpath(str(e.get("path"))) == real]


def _holder_text(owner):
    pid = owner.get("pid")
    session = owner.get("session") or "?"
    return f"envbisect process {pid} (session {session})"


def claim(target, owner, hold=True):
    """Lock ``target`` machine-wide for ``owner`` ({"session", "journal", "pid"}).

    ``hold``: keep the lock with flock until :func:`release` (a long-lived process); else
    the lock file itself is the claim (one-shot agents), valid while the owner's session
    directory exists. Raises JournalError naming the holder when another session has it.
    """
    real = os.path.realpath(target)
    if _held_here(real, target, owner) or fcntl is None:
        return
    _make_lock_dir()
    fd = _locked_lock_file(target, lock_path(real))
    try:
        _refuse_previous_owner(target, real, owner, _read_owner(fd))
        record = dict(owner, path=real, mode="flock" if hold else "file")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    if hold:
        _HELD[real] = (fd, owner.get("session"))
    else:
        os.close(fd)


def _held_here(real, target, owner):
    """True when this process already holds ``real`` for ``owner``'s session; raises
    JournalError when it holds it for another session."""
    held = _HELD.get(real)
    if held is None:
        return False
    if held[1] == owner.get("session"):
        return True
    raise JournalError(
        "{}: in use by {}; a second run must not swap the same file".format(
            target, _holder_text({"pid": os.getpid(), "session": held[1]})
        )
    )


def _make_lock_dir():
    """The lock directory, made 0700 when absent; JournalError unless it is a directory of
    this user that nobody else can write (a symlink or another user's directory would let
    them point a lock file at any file this user can write)."""
    directory = lock_dir()
    if not os.path.lexists(directory):
        with contextlib.suppress(FileExistsError):
            os.makedirs(directory, mode=0o700)
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise JournalError(f"lock directory {directory}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise JournalError(f"lock directory {directory}: not a directory (a symlink?); refusing")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise JournalError(
            f"lock directory {directory}: owned by another user or writable by others; "
            f"refusing (set {LOCK_DIR_ENV} to a directory of your own)"
        )


def _locked_lock_file(target, path):
    """An fd on the lock file ``path`` with its flock taken; JournalError naming the holder
    while a live process has it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            raise JournalError(f"{target}: cannot take its lock {path}: {exc.strerror}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise JournalError(f"{target}: its lock {path} is not this user's file; refusing")
        if not _flock_soon(fd):
            other = _read_owner(fd)
            os.close(fd)
            raise JournalError(
                f"{target}: in use by {_holder_text(other)}; a second run must not swap "
                "the same file: wait for it to end"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except OSError:
            same = False
        if same:
            return fd
        os.close(fd)  # released and removed by its holder meanwhile: take the new file


def _refuse_previous_owner(target, real, owner, other):
    """The lock file's last owner ``other`` (its flock released) may still have a claim: a
    one-shot claim whose session still exists, or a swap of the file it never put back."""
    if not other or other.get("session") == owner.get("session"):
        return
    journal = str(other.get("journal") or "")
    if other.get("mode") == "file" and os.path.isdir(os.path.dirname(journal)):
        raise JournalError(
            f"{target}: in use by {_holder_text(other)}; a second run must not swap the same file"
        )
    if journal and _open_swaps_of(journal, real):
        raise JournalError(
            "{}: still swapped by {}, which is gone; put it back first with "
            "'envbisect reset --session {}'".format(
                target, _holder_text(other), other.get("session")
            )
        )


def _flock_soon(fd, grace_s=5.0):
    """Take the flock; False while a live holder has it.

    A holder killed while forking leaves a child that shares the lock until it execs (the
    fd is close-on-exec): when the recorded owner is gone, wait a moment for that instead of
    refusing.
    """
    deadline = time.monotonic() + grace_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            pid = _read_owner(fd).get("pid")
            if not isinstance(pid, int) or _alive(pid) or time.monotonic() > deadline:
                return False
            time.sleep(0.02)


def _alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = read_stat(pid)
    return proc is None or proc.state != "Z"  # a zombie holds nothing


def _read_owner(fd):
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 65536)
        data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def release(session, paths=None):
    """Give up the locks ``session`` holds (all, or those of ``paths``); returns their paths."""
    done = []
    for real, (fd, owner) in list(_HELD.items()):
        if owner != session or (paths is not None and real not in paths):
            continue
        with contextlib.suppress(OSError):
            os.unlink(lock_path(real))
        os.close(fd)  # closing drops the flock
        del _HELD[real]
        done.append(real)
    if paths is not None and fcntl is not None:
        # One-shot claims (remote): remove the lock files that name this session.
        for real in paths:
            if real in done:
                continue
            path = lock_path(real)
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _read_owner(fd).get("session") == session:
                    os.unlink(path)
                    done.append(real)
            except OSError:
                pass
            finally:
                os.close(fd)
    return done


def held(session):
    """Real paths this process holds locks on for ``session``."""
    return [real for real, (_fd, owner) in _HELD.items() if owner == session]


# ---- the journal ----------------------------------------------------------------------------


def _entries(journal):
    """Open swaps with their latest ``put`` and whether its in-place write finished."""
    entries = _checked(journal)
    restored = {e.get("id") for e in entries if e.get("op") == "restored"}
    swaps = {}
    order = []
    for e in entries:
        op, sid = e.get("op"), e.get("id")
        if sid in restored:
            continue
        if op == "swap":
            swaps[sid] = dict(e, _written=not e.get("inplace"))
            order.append(sid)
        elif op == "put" and sid in swaps:
            swaps[sid]["put"] = e.get("put")
            swaps[sid]["_written"] = not swaps[sid].get("inplace")
        elif op == "written" and sid in swaps:
            swaps[sid]["_written"] = True
    return [swaps[sid] for sid in order]


_OPS = ("swap", "put", "written", "restored")


def _check_line(journal, e):
    """JournalError for a line envbisect could not have written: an op without an integer
    ``id``, a swap without a ``path`` (guessing could forget a file still swapped)."""
    op = e.get("op")
    if op not in _OPS:
        return
    sid = e.get("id")
    if not isinstance(sid, int) or isinstance(sid, bool):
        raise JournalError(
            f"{journal}: a {op!r} line without an integer id; it was not written by "
            "envbisect: fix or remove that line"
        )
    if op == "swap" and not isinstance(e.get("path"), str):
        raise JournalError(
            f"{journal}: swap {sid} names no path; it was not written by envbisect: fix or "
            "remove that line"
        )


def open_swaps(journal):
    """Swap entries with no ``restored`` line yet, in order (``put`` is the latest)."""
    return _entries(journal)


def next_id(journal):
    return 1 + max([e["id"] for e in _checked(journal) if "id" in e] or [0])


def _checked(journal):
    entries = read_lines(journal)
    for e in entries:
        _check_line(journal, e)
    return entries


def swap(journal, backups, target, content, entry_id=None):
    """Replace ``target`` by ``content`` (None: remove it), journaling the original first.

    ``entry_id``: the id of this path's open swap when the caller knows it (a second content
    for the same file in one trial); the original journaled then stays the one restored.
    Returns the swap's id.
    """
    target = str(target)
    put = None if content is None else sha_bytes(content)
    if entry_id is None:
        for e in _entries(journal):
            if e.get("path") == target:
                entry_id = e["id"]
    if entry_id is not None:
        entry = next(e for e in _entries(journal) if e["id"] == entry_id)
        inplace = bool(entry.get("inplace")) and content is not None
        append_line(journal, {"op": "put", "id": entry_id, "put": put})
    else:
        entry_id, inplace = _journal_new_swap(journal, backups, target, content, put)
    if content is None:
        if os.path.lexists(target):
            os.unlink(target)
    elif inplace:
        write_in_place(target, content)
        append_line(journal, {"op": "written", "id": entry_id})
    else:
        atomic_write(target, content)
    return entry_id


def _journal_new_swap(journal, backups, target, content, put):
    """Journal the first swap of ``target`` (its original backed up first); returns the
    swap's id and whether ``content`` is to be written in place."""
    entry_id = next_id(journal)
    entry = {"op": "swap", "id": entry_id, "path": target, "existed": False, "put": put}
    if os.path.islink(target):
        raise JournalError(f"{target}: is a symlink; only regular files are swapped")
    elif os.path.isfile(target):
        entry.update(_back_up(backups, target, entry_id, content))
    elif os.path.lexists(target):
        raise JournalError(f"{target}: is not a regular file; refusing to swap it")
    if entry.get("existed") and not entry.get("inplace") and "symlink" not in entry:
        # A hidden name beside the file keeps the original inode: the restore renames it
        # back, which needs no free space (a full disk never leaves the file swapped), and
        # keeps its mode, times and other hard links.
        entry["held"] = os.path.join(
            os.path.dirname(target),
            f".{os.path.basename(target)}.envbisect-held-{entry_id}",
        )
    append_line(journal, entry)
    if entry.get("held"):
        if os.path.lexists(entry["held"]):
            os.unlink(entry["held"])
        os.link(target, entry["held"])
    return entry_id, bool(entry.get("inplace"))


def _back_up(backups, target, entry_id, content):
    """Copy the regular file ``target`` to ``backups/<entry_id>`` (fsynced); returns what
    the journal records of it: mode, times, sha256, links, and whether to write in place."""
    st = os.stat(target)
    os.makedirs(backups, exist_ok=True)
    backup = os.path.join(backups, str(entry_id))
    # Not through a symlink, and never a FIFO or device (a read that would block or not end).
    src_fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(src_fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise JournalError(f"{target}: is not a regular file; refusing to swap it")
        original = src.read()
    if os.path.lexists(backup):
        os.unlink(backup)
    fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(original)
        fh.flush()
        os.fsync(fh.fileno())
    return {
        "backup": str(entry_id),
        "mode": st.st_mode & 0o7777,
        "mtime_ns": st.st_mtime_ns,
        "atime_ns": st.st_atime_ns,
        "sha256": sha_bytes(original),
        "existed": True,
        "inplace": st.st_nlink > 1 and content is not None,
        "nlink": st.st_nlink,
    }


def _beside(target):
    """A free name next to ``target`` for the original of a file the user changed."""
    base = target + ORIGINAL_SUFFIX
    candidate, n = base, 1
    while os.path.lexists(candidate):
        n += 1
        candidate = f"{base}.{n}"
    return candidate


def restore(journal, backups):
    """Put back every open swap whose file still holds what envbisect put there.

    Returns one dict per swap closed: ``path``, ``outcome`` (``restored``; ``unchanged``: the
    file already held its original; ``kept``: the user changed it, so it is kept and the
    original, when there was one, is written to ``original``) and ``original``.
    """
    done = []
    for entry in reversed(_entries(journal)):
        try:
            done.append(_restore_one(journal, backups, entry))
        except OSError as exc:
            finished = {d["path"] for d in done}
            left = [str(e["path"]) for e in _entries(journal) if e["path"] not in finished]
            raise JournalError(
                "cannot restore {}: {}; still swapped: {}".format(
                    entry["path"], exc.strerror or exc, ", ".join(left)
                )
            ) from None
    return done


def _restore_one(journal, backups, entry):
    """Restore one open swap (see :func:`restore`); its outcome record."""
    target = str(entry["path"])
    now = file_state(target)
    put = entry.get("put")
    if entry.get("existed"):
        was = "link:" + entry["symlink"] if "symlink" in entry else entry.get("sha256")
    else:
        was = None
    ours = now == put or not entry.get("_written", True)
    original = None
    if now == was:
        outcome = "unchanged"
    elif ours:
        outcome = "restored"
        inplace = bool(entry.get("inplace")) and now is not None
        _original_to(entry, target, backups, was, inplace)
    else:
        outcome = "kept"
        if entry.get("existed"):
            original = _beside(target)
            _original_to(entry, original, backups, was, False)
    if entry.get("held") and os.path.lexists(entry["held"]):
        os.unlink(entry["held"])
    tmp = os.path.join(os.path.dirname(target), "." + os.path.basename(target) + ".envbisect-tmp")
    if os.path.lexists(tmp):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    line = {"op": "restored", "id": entry["id"], "path": target, "outcome": outcome}
    if original:
        line["original"] = original
    # The file is back; a journal line that cannot be written (a full disk) only means a
    # later restore finds it unchanged.
    with contextlib.suppress(OSError):
        append_line(journal, line)
    # The original is back in place (or beside it): the session's copy of it goes, since it
    # may hold what the user keeps private (a 0600 credentials file).
    if entry.get("backup") is not None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(backups, str(entry["backup"])))
    return {"path": target, "outcome": outcome, "original": original}


def _original_to(entry, dest, backups, was, inplace):
    """Put the original at ``dest``: the held inode renamed back (no space needed, same
    mode and times), else written from the backup."""
    held = entry.get("held")
    if held and sha256_of(held) == was:
        os.replace(held, dest)
    else:
        _put_back(entry, dest, backups, inplace=inplace)


def _put_back(entry, dest, backups, inplace):
    if not entry.get("existed"):
        if os.path.lexists(dest):
            os.unlink(dest)
        return
    if "symlink" in entry:
        if os.path.lexists(dest):
            os.unlink(dest)
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        os.symlink(entry["symlink"], dest)
        return
    backup = os.path.join(backups, str(entry["backup"]))
    try:
        with open(backup, "rb") as fh:
            data = fh.read()
    except OSError:
        raise JournalError(
            f"backup {backup} of {dest} is missing; the original cannot be restored"
        ) from None
    if inplace and os.path.isfile(dest) and not os.path.islink(dest):
        write_in_place(dest, data)
        if entry.get("mode") is not None:
            os.chmod(dest, int(entry["mode"]))
    else:
        atomic_write(dest, data, mode=entry.get("mode"))
    if entry.get("mtime_ns") is not None:
        os.utime(dest, ns=(int(entry["atime_ns"]), int(entry["mtime_ns"])))
