"""Durable file writes for the journal and the session (stdlib only, Python 3.8+ syntax;
shipped with ``envbisect.agent.journal``): fsynced JSON lines, atomic and in-place writes,
and the sha256 of what a file holds."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat


class JournalError(Exception):
    """A swap or restore that cannot be done safely (the host turns it into SessionError)."""


# ---- small helpers --------------------------------------------------------------------------


def append_line(path, obj):
    """Append one JSON line and fsync, so a kill right after still finds it."""
    data = (json.dumps(obj, sort_keys=True, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


# A journal or log line is one small JSON object; a file far larger was not written here.
MAX_JOURNAL_BYTES = 256 << 20


def read_lines(path):
    """Every JSON-object line of ``path``; a torn line (kill mid-write) is skipped.

    A line that is not UTF-8 was not written by envbisect: JournalError naming the line
    (skipping it could forget a swap that still has to be put back)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return []
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JournalError(f"{path}: not a regular file; it was not written by envbisect")
        raw = fh.read(MAX_JOURNAL_BYTES + 1)
    if len(raw) > MAX_JOURNAL_BYTES:
        raise JournalError(
            f"{path}: over {MAX_JOURNAL_BYTES >> 20} MiB; it was not written by envbisect"
        )
    out = []
    for number, blob in enumerate(raw.splitlines(), 1):
        try:
            line = blob.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JournalError(
                f"{path}: line {number} is not UTF-8 text (byte 0x{blob[exc.start]:02x}); "
                "it was not written by envbisect: fix or remove that line"
            ) from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        except RecursionError:
            raise JournalError(
                f"{path}: line {number} is nested too deep; it was not written by envbisect: "
                "fix or remove that line"
            ) from None
        if isinstance(obj, dict):
            out.append(obj)
    return out


def sha256_of(path):
    """sha256 of a regular file's bytes, or None when it cannot be read."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def file_state(path):
    """What ``path`` holds now: None (absent), "link:<target>" or a sha256."""
    if os.path.islink(path):
        return "link:" + os.readlink(path)
    if not os.path.lexists(path):
        return None
    if not os.path.isfile(path):
        return "other"
    return sha256_of(path) or "unreadable"


def _fsync_dir(path):
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(target, data, mode=None):
    """Write ``data`` to ``target`` by rename: readers see the old file or the whole new one."""
    parent = os.path.dirname(target) or "."
    os.makedirs(parent, exist_ok=True)
    if mode is None and os.path.exists(target):
        mode = os.stat(target).st_mode & 0o7777
    tmp = os.path.join(parent, "." + os.path.basename(target) + ".envbisect-tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)  # a leftover (or a planted symlink): never written through
    # Created exclusively and never through a symlink; 0600 until the final mode is set.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(parent)


def write_in_place(target, data):
    """Overwrite ``target`` through its inode (other hard links see the same bytes)."""
    fd = os.open(target, os.O_WRONLY | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def sha_bytes(data):
    return hashlib.sha256(data).hexdigest()
