"""A full disk and hostile caches (issue 24): a real small tmpfs, a real device node."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbisect.agent import actuate_remote
from envbisect.model.errors import SessionError
from envbisect.model.session import Session


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs (needs root and mount)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path) -> None:
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_a_full_disk_never_leaves_a_swapped_file_behind(tmp_path: Path, small_disk: Path) -> None:
    f = small_disk / "train.cfg"
    original = b"lr = 0.1\n" * 10000  # 90 KB: restoring by writing would need the space
    f.write_bytes(original)
    f.chmod(0o640)
    s = Session.start(tmp_path / "s", {})  # the session (and its backups) on another disk
    s.journal.swap(f, b"lr = 0.2\n")
    _fill(small_disk)  # the trial fills the disk
    s.journal.restore()
    s.unlock()
    assert f.read_bytes() == original
    assert stat.S_IMODE(f.stat().st_mode) == 0o640
    assert not [p.name for p in small_disk.iterdir() if "envbisect" in p.name]


def test_a_swap_on_a_full_disk_is_one_line_naming_the_file_and_reset(
    tmp_path: Path, small_disk: Path
) -> None:
    f = small_disk / "train.cfg"
    f.write_bytes(b"lr = 0.1\n")
    _fill(small_disk)
    s = Session.start(tmp_path / "s", {})
    with pytest.raises(SessionError) as err:
        s.journal.swap(f, b"lr = 0.2\n" * 20000)
    msg = str(err.value)
    assert "\n" not in msg and str(f) in msg and f"envbisect reset --session {s.root}" in msg
    s.journal.restore()
    s.unlock()
    assert f.read_bytes() == b"lr = 0.1\n"


def test_a_cache_larger_than_the_free_space_is_not_copied(tmp_path: Path, small_disk: Path) -> None:
    src = tmp_path / "cache"
    src.mkdir()
    (src / "big").write_bytes(b"x" * (1 << 20))
    out = actuate_remote.apply(
        {"caches": [{"name": "inductor", "dest": str(small_disk / "c"), "src": str(src)}]},
        put=None,
        record=None,
    )
    assert out["failure"].startswith("build: caches inductor: copying")
    assert "free; not copied" in out["failure"]
    assert not (small_disk / "c").exists()


def test_a_cache_holding_a_device_file_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a device node")
    src = tmp_path / "cache"
    src.mkdir()
    (src / "ok").write_text("compiled\n")
    os.mknod(src / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    dest = tmp_path / "trial" / "caches" / "inductor"
    out = actuate_remote.apply(
        {"caches": [{"name": "inductor", "dest": str(dest), "src": str(src)}]},
        put=None,
        record=None,
    )
    assert out["failure"] == (
        f"build: caches inductor: {src / 'zero'} is not a regular file; not copied"
    )
    assert not dest.exists()
