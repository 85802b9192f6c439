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


def _probe(tmp_path: Path, *flags: str) -> object:
    from envbisect.cli import cli

    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    logs = ["--log-dir", str(tmp_path / "logs")]
    return CliRunner().invoke(
        cli, ["probe", *logs, *flags, "python", str(script)], standalone_mode=False
    )


def test_probe_takes_runs_json_spelling_and_keeps_format_json(tmp_path: Path) -> None:
    """``probe --json -- python s.py``: JSON on stdout (the command not misread as an
    interpreter); ``--json FILE``: the file, text on stdout; ``--format json`` as before."""
    alone = _probe(tmp_path, "--python", sys.executable, "--json", "--")
    assert alone.exception is None and alone.return_value == 0, alone.output
    assert json.loads(alone.stdout)["exit_status"] == 0
    out = tmp_path / "facts.json"
    to_file = _probe(tmp_path, "--python", sys.executable, "--json", str(out), "--")
    assert to_file.exception is None and to_file.return_value == 0, to_file.output
    assert json.loads(out.read_text())["exit_status"] == 0
    assert "program output: " in to_file.stdout and not to_file.stdout.startswith("{")
    old = _probe(tmp_path, "--python", sys.executable, "--format", "json", "--")
    assert old.return_value == 0 and json.loads(old.stdout)["exit_status"] == 0


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["probe", "--json", "python", "s.py"],
            "--json python: that is the command, not a file; write --json -- python ... "
            "(JSON on stdout) or --json FILE -- python ...",
        ),
        (
            ["probe", "--jsn", "--", "python", "s.py"],
            "probe has no option --jsn; the command to run goes after --",
        ),
        (
            ["run", "--good", "g.yaml", "--format", "json", "--", "python", "s.py"],
            "run has no option --format: machine-readable output is --json PATH ('-': stdout); "
            "the command to run goes after --",
        ),
        (
            ["check", "--until-ktoks", "1k", "--json", "-", "--", "python", "s.py"],
            "check has no option --json: only run and probe write JSON (--json PATH); "
            "the command to run goes after --",
        ),
    ],
)
def test_a_misplaced_output_option_is_one_line_and_exit_2(
    tmp_path: Path, argv: list[str], said: str
) -> None:
    import subprocess

    (tmp_path / "g.yaml").write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", *argv],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"envbisect: error: {said}"]
