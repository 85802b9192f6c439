"""Honest verdicts (issue 24): a state that cannot be built is never "bad"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.cli import cli
from tests.helpers_run import Scenario, pkg

pytestmark = pytest.mark.slow


def test_a_package_that_cannot_be_built_is_unresolved_never_the_culprit(tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==2.0")
    # 9.9 exists in no configured index: the bad side cannot be built here.
    sc.write(
        good={"packages": {"ebwork": pkg("2.0")}},
        bad={"packages": {"ebwork": pkg("9.9")}},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    out = tmp_path / "result.json"
    argv = [
        "run", "--config", str(sc.config), "--python", sc.python,
        "--session", str(tmp_path / "session"), "--json", str(out), "--bad", str(sc.bad),
        "--repeats", "1", "--", "python", str(sc.repo / "train.py"),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    doc = json.loads(out.read_text())
    assert doc["culprits"] == [], doc
    assert res.return_value != 0 and doc["outcome"] != "found"
    trials = doc["trials"]
    built = [t for t in trials if "build:" in str(t.get("failure") or "")]
    assert built and all(t["verdict"] == "unresolved" for t in built), trials
