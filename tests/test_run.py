"""End-to-end runs: real uv venvs, real git worktrees, real file swaps, a real workload."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from envbisect.bisect.session import Session
from envbisect.cli import cli
from tests.helpers_run import Scenario, pkg

pytestmark = pytest.mark.slow


def _run_cli(
    sc: Scenario, *extra: str, smoke: tuple[str, ...] | None = None
) -> tuple[Any, dict[str, Any]]:
    out = sc.tmp / "result.json"
    argv = [
        "run",
        "--config",
        str(sc.config),
        "--python",
        sc.python,
        "--session",
        str(sc.tmp / "session"),
        "--json",
        str(out),
        "--report",
        str(sc.tmp / "report.md"),
        "--bad",
        str(sc.bad),
        *extra,
        "--",
        *(smoke or ("python", str(sc.repo / "train.py"))),
    ]
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    return res, json.loads(out.read_text()) if out.exists() else {}


def _max_trials(units: int) -> int:
    # endpoints + binary isolation + confirming the culprit alone and everything but it
    return 2 + math.ceil(math.log2(units)) + 2


def test_env_var_culprit_among_packages_and_files(tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==2.0", "ebonly==1.0")
    git = sc.git_entry(sc.commits[0])
    sc.write(
        good={"packages": {"ebwork": pkg("1.0")}, "env": {"KEEP": "1"}, "git": git},
        bad={
            "packages": {"ebwork": pkg("2.0"), "ebonly": pkg("1.0")},
            "env": {"KEEP": "1", "EB_SLOW": str(8)},
            "git": git,
        },
        loose_good=b"lr = 0.1\n",
        loose_bad=b"lr = 0.2\n",
    )
    before = sc.fingerprint()
    res, doc = _run_cli(sc)
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    assert doc["culprits"][0]["changes"] == [{"key": "EB_SLOW", "old": "-", "new": "8"}]
    assert doc["outcome"] == "found"
    units = 4  # packages:ebwork, packages:ebonly, files:<loose>, env:EB_SLOW
    assert 3 <= len(doc["trials"]) <= _max_trials(units)
    assert "Culprit: env EB_SLOW unset → 8 — " in res.stdout
    report = (tmp_path / "report.md").read_text()
    assert "Culprit: env EB_SLOW" in report and "envbisect run --good" in report
    assert sc.fingerprint() == before
    session = Session.existing(tmp_path / "session")
    assert session.finished() and not (session.root / "worktrees").exists()


def test_package_version_culprit_with_a_fresh_snapshot_as_bad(tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==3.0")
    sc.write(
        good={"packages": {"ebwork": pkg("1.0")}},
        bad={"packages": {"ebwork": pkg("3.0")}},
        loose_good=b"x\n",
        loose_bad=b"x\n",
    )
    before = sc.fingerprint()
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        cli,
        [
            "run",
            "--config",
            str(sc.config),
            "--python",
            sc.python,
            "--good",
            str(sc.good),
            "--bad",
            str(sc.bad),
            "--session",
            str(tmp_path / "s"),
            "--json",
            str(out),
            "--",
            "python",
            str(sc.repo / "train.py"),
        ],
        standalone_mode=False,
        catch_exceptions=False,
    )
    doc = json.loads(out.read_text())
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["packages:ebwork"]
    assert doc["culprits"][0]["changes"] == [{"key": "ebwork", "old": "1.0", "new": "3.0"}]
    assert sc.fingerprint() == before


def test_git_culprit_is_narrowed_to_the_first_bad_commit(tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0")
    sc.commit("docs")
    slow = sc.commit("more work per token", knob="8\n")
    sc.commit("docs again")
    sc.commit("and again")
    sc.write(
        good={"git": sc.git_entry(sc.commits[0]), "env": {}},
        bad={"git": sc.git_entry(sc.commits[-1]), "env": {"EB_OTHER": "1"}},
        loose_good=b"a\n",
        loose_bad=b"b\n",
    )
    before = sc.fingerprint()
    res, doc = _run_cli(sc, "--repeats", "3", smoke=("python", "train.py"))
    assert res.return_value == 0, res.output
    [culprit] = doc["culprits"]
    assert culprit["unit"] == f"git:{sc.repo}"
    assert culprit["commit"] == slow
    assert f"first bad commit {slow[:12]}" in res.stdout
    assert sc.fingerprint() == before
