"""A damaged session log and a session dir that cannot be written are one line, exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbisect.model.session import Session


def _envbisect(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbisect", *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=120,
    )


def _one_line_exit_2(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("envbisect: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[-1], lines[-1]


@pytest.mark.parametrize("verb", ["reset", "log"])
def test_a_bad_byte_in_the_session_log_is_one_line(tmp_path: Path, verb: str) -> None:
    s = Session.start(tmp_path / "s", {})
    s.unlock()
    with open(s.log_path, "ab") as fh:
        fh.write(b'{"type": "trial", "note": "\xff"}\n')
    proc = _envbisect(tmp_path, verb, "--session", str(tmp_path / "s"))
    _one_line_exit_2(proc, f"{s.log_path}: line 2 is not UTF-8 text (byte 0xff)")


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody can write, root included (a read-only tmpfs when root)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:
        if shutil.which("mount") is None:
            pytest.skip("root without mount: cannot make a read-only directory")
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs: {proc.stderr.decode().strip()}")
        try:
            yield ro
        finally:
            subprocess.run(["umount", "-l", str(ro)], check=False)
    else:
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)


def test_a_read_only_session_dir_is_one_line(tmp_path: Path, read_only_dir: Path) -> None:
    good = tmp_path / "g.yaml"
    good.write_text("schema: envbisect/manifest@1\nmeta: {label: g}\n")
    (tmp_path / "envbisect.yaml").write_text("{}\n")
    proc = _envbisect(
        tmp_path,
        "run",
        "--good", str(good),
        "--bad", str(good),
        "--until-ktoks", "12k",
        "--session", str(read_only_dir / "session"),
        "--", "true",
    )  # fmt: skip
    _one_line_exit_2(proc, str(read_only_dir / "session"), "Read-only file system")
