"""Locks and temp files on a shared host: another user's planted symlink never makes a run
write through it (a second, unprivileged user plants them where root runs envbisect)."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbisect.agent import journal
from envbisect.model.errors import SessionError
from envbisect.model.session import Session

USER = "ebt24lock"


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    """A second, unprivileged user (created and removed here; needs root and useradd)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create a second user")
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", USER], check=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], check=False)


def _as(user: pwd.struct_passwd, *argv: str) -> None:
    subprocess.run(argv, check=True, user=user.pw_uid, group=user.pw_gid)


def test_the_default_lock_dir_is_per_user_and_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ENVBISECT_LOCK_DIR")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    f = tmp_path / "cfg.ini"
    f.write_text("x\n")
    s = Session.start(tmp_path / "s", {})
    s.journal.swap(f, b"y\n")
    d = Path(journal.lock_dir())
    assert d == tmp_path / "cache" / "envbisect" / "locks"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700 and d.stat().st_uid == os.geteuid()
    s.journal.restore()
    s.unlock()
    assert f.read_text() == "x\n"


def test_a_lock_dir_of_another_user_is_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    other_user: pwd.struct_passwd,
    request: pytest.FixtureRequest,
) -> None:
    victim = tmp_path / "victim.key"
    victim.write_text("PRIVATE\n")
    victim.chmod(0o600)
    shared = Path(tempfile.mkdtemp(prefix="envbisect-t24-", dir="/tmp"))  # reachable by both
    shared.chmod(0o1777)
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    planted = shared / "locks"
    _as(other_user, "mkdir", "-m", "0777", str(planted))
    f = tmp_path / "cfg.ini"
    f.write_text("x\n")
    # The attacker knows where the lock of f goes and points it at the victim.
    monkeypatch.setenv("ENVBISECT_LOCK_DIR", str(planted))
    name = os.path.basename(journal.lock_path(str(f)))
    _as(other_user, "ln", "-s", str(victim), str(planted / name))
    s = Session.start(tmp_path / "s", {})
    with pytest.raises(SessionError, match="owned by another user or writable by others"):
        s.journal.swap(f, b"y\n")
    assert victim.read_text() == "PRIVATE\n" and f.read_text() == "x\n"


def test_a_planted_lock_symlink_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim.key"
    victim.write_text("PRIVATE\n")
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    monkeypatch.setenv("ENVBISECT_LOCK_DIR", str(locks))
    f = tmp_path / "cfg.ini"
    f.write_text("x\n")
    (locks / os.path.basename(journal.lock_path(str(f)))).symlink_to(victim)
    s = Session.start(tmp_path / "s", {})
    with pytest.raises(SessionError, match="cannot take its lock"):
        s.journal.swap(f, b"y\n")
    assert victim.read_text() == "PRIVATE\n" and f.read_text() == "x\n"


def test_a_planted_temp_symlink_beside_a_swapped_file_is_not_written_through(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim.key"
    victim.write_text("PRIVATE\n")
    f = tmp_path / "proj" / "cfg.ini"
    f.parent.mkdir()
    f.write_text("x\n")
    (f.parent / ".cfg.ini.envbisect-tmp").symlink_to(victim)
    s = Session.start(tmp_path / "s", {})
    s.journal.swap(f, b"y\n")
    assert f.read_text() == "y\n" and not f.is_symlink()
    s.journal.restore()
    s.unlock()
    assert victim.read_text() == "PRIVATE\n" and f.read_text() == "x\n"


def test_a_symlink_is_not_swapped(tmp_path: Path) -> None:
    victim = tmp_path / "victim.key"
    victim.write_text("PRIVATE\n")
    link = tmp_path / "cfg.ini"
    link.symlink_to(victim)
    s = Session.start(tmp_path / "s", {})
    with pytest.raises(SessionError, match="only regular files are swapped"):
        s.journal.swap(link, b"evil\n")
    s.unlock()
    assert victim.read_text() == "PRIVATE\n"


def test_a_private_files_backup_stays_private(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("PRIVATE\n")
    key.chmod(0o600)
    s = Session.start(tmp_path / "s", {})
    s.journal.swap(key, b"other\n")
    backups = list((tmp_path / "s").rglob("backups/*"))
    assert backups and all(stat.S_IMODE(b.stat().st_mode) == 0o600 for b in backups)
    s.journal.restore()
    s.unlock()
    assert key.read_text() == "PRIVATE\n" and stat.S_IMODE(key.stat().st_mode) == 0o600
