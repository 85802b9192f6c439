"""Files envbisect writes and reads on the user's behalf (this module does I/O).

Outputs are written atomically (readers see the old file or the whole new one) and only
over a regular file or a new name: a device, FIFO, socket, directory or symlink is refused
in one line. Inputs a user names (profile facts, journals) are read only from regular files
and up to a size cap, so that a FIFO cannot hang a command and a huge file cannot fill
memory.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from envbisect.model.errors import UsageError


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the whole new one."""
    atomic_write_bytes(path, text.encode("utf-8"))


def file_kind(mode: int) -> str:
    """What a non-regular file of ``mode`` is, in words (``a device``, ``a FIFO``...)."""
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def not_a_file(path: Path | str) -> str | None:
    """What is at ``path`` when it is there and not a regular file (a symlink is not
    followed); None for a regular file or a new name."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else file_kind(mode)


def refuse_not_a_file(flag: str, path: Path | str) -> None:
    """UsageError when writing ``path`` would replace something that is not a file."""

    kind = not_a_file(path)
    if kind is not None:
        raise UsageError(
            f"{flag} {path}: is {kind}; envbisect writes only over a regular file or a new "
            "name (use - for stdout)"
        )


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one; never
    over a device, FIFO, socket, directory or symlink (UsageError)."""
    refuse_not_a_file("output", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_writable(flag: str, path: Path) -> None:
    """UsageError unless ``path`` can be written as a file (before the work that fills it)."""

    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    refuse_not_a_file(flag, path)
    parent = path.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: the directory {parent} is not writable")
    if len(os.fsencode(path.name)) > 255:
        raise UsageError(f"{flag} {path}: the file name is longer than 255 bytes")


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; UsageError naming
    ``path`` when it cannot be read, is not a regular file (a FIFO is never waited on) or
    is larger than ``limit`` (``what`` says what the file should have been)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path}: is {file_kind(st.st_mode)}; give {what} as a regular file")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UsageError(
            f"{path}: larger than the {limit // (1 << 20)} MiB {what} can be; is it the right file?"
        )
    return data
