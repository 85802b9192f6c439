"""``run``, ``log`` and ``reset`` called as their own click commands (not through ``cli``):
a real bisection of a real workload, its session read back and reset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.commands import log, reset, run
from envbisect.model.errors import SessionError
from tests.helpers_run import Scenario, pkg

pytestmark = pytest.mark.slow


def test_run_names_the_env_var_then_log_lists_its_trials_and_reset_keeps_them(
    tmp_path: Path,
) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0")
    git = sc.git_entry(sc.commits[0])
    sc.write(
        good={"packages": {"ebwork": pkg("1.0")}, "git": git},
        bad={"packages": {"ebwork": pkg("1.0")}, "env": {"EB_SLOW": "8"}, "git": git},
        loose_good=b"lr = 0.1\n",
        loose_bad=b"lr = 0.1\n",
    )
    session = tmp_path / "session"
    out = tmp_path / "result.json"
    argv = ["--config", str(sc.config), "--python", sc.python, "--session", str(session)]
    argv += ["--json", str(out), "--bad", str(sc.bad), "--", "python", str(sc.repo / "train.py")]
    done = CliRunner().invoke(run.command, argv, standalone_mode=False, catch_exceptions=False)
    assert done.return_value == 0, done.output
    doc = json.loads(out.read_text())
    assert doc["outcome"] == "found"
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]

    shown = CliRunner().invoke(
        log.command, ["--session", str(session)], standalone_mode=False, catch_exceptions=False
    )
    assert shown.return_value == 0
    rows = {
        line.split()[0]: line.split() for line in shown.output.splitlines() if line[:1].isdigit()
    }
    assert rows["1"][-1] == "good" and rows["2"][1] == "env:EB_SLOW" and rows["2"][-1] == "bad"
    assert len(rows) == len(doc["trials"])
    assert "ended: found: culprit: env:EB_SLOW" in shown.output

    cleared = CliRunner().invoke(
        reset.command, ["--session", str(session)], standalone_mode=False, catch_exceptions=False
    )
    assert cleared.return_value == 0, cleared.output
    assert (session / "log.jsonl").exists()  # the record of what was measured stays


def test_log_and_reset_of_a_directory_without_a_session_say_so(tmp_path: Path) -> None:
    for command in (log.command, reset.command):
        with pytest.raises(SessionError, match="no bisection session there"):
            CliRunner().invoke(
                command,
                ["--session", str(tmp_path / "none")],
                standalone_mode=False,
                catch_exceptions=False,
            )
