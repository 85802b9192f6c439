from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from envbisect.cli import cli


def test_python_m_help_runs_as_a_real_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0
    for verb in ("snapshot", "diff", "run", "check", "smoke"):
        assert verb in proc.stdout


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert "envbisect" in result.output
