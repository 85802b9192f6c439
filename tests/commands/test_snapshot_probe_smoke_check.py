"""``snapshot``, ``probe``, ``smoke`` and ``check`` called as their own click commands, each on
a real interpreter: this test's own Python, a real script, a real workload."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.commands import check, probe, smoke, snapshot
from envbisect.model import manifest
from envbisect.model.errors import SmokeError
from tests.helpers_run import WORKLOAD


def _call(command: object, *argv: str) -> tuple[int, str]:
    done = CliRunner().invoke(command, list(argv), standalone_mode=False, catch_exceptions=False)  # type: ignore[arg-type]
    return done.return_value, done.output


def test_snapshot_writes_a_manifest_of_this_python(tmp_path: Path) -> None:
    out = tmp_path / "now.yaml"
    code, _ = _call(
        snapshot.command,
        "--python",
        sys.executable,
        "--label",
        "now",
        "-o",
        str(out),
        "--env",
        "HOME",
    )
    assert code == 0
    loaded = manifest.load(str(out))
    assert loaded.label == "now"
    assert "click" in loaded.section("packages")
    assert loaded.section("python")["executable"] == sys.executable


def test_probe_runs_a_script_once_and_reports_its_exit(tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("import sys\nprint('hello')\nsys.exit(3)\n")
    code, out = _call(
        probe.command,
        "--format",
        "json",
        "--log-dir",
        str(tmp_path / "logs"),
        "--",
        sys.executable,
        str(script),
    )
    assert code == 1
    assert json.loads(out)["exit_status"] == 3
    assert "hello" in (tmp_path / "logs" / "probe.stdout").read_text()


def test_smoke_prints_its_command_and_refuses_a_malformed_env(tmp_path: Path) -> None:
    code, out = _call(smoke.command, "--python", sys.executable, "--print-command")
    assert code == 0 and sys.executable in out
    with pytest.raises(SmokeError, match="--env 'NOEQUALS': expected NAME=VALUE"):
        _call(smoke.command, "--python", sys.executable, "--env", "NOEQUALS")


def test_check_passes_a_fast_workload_and_fails_a_slow_one(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(WORKLOAD)
    code, out = _call(check.command, "--until-ktoks", "1tok/s", "--", sys.executable, str(script))
    assert code == 0, out
    code, out = _call(check.command, "--until-ktoks", "1000M", "--", sys.executable, str(script))
    assert code == 1, out
