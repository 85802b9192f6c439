"""Two independent causes, each slowing a real workload on its own (issue 23: the field's
cleared cache and grown dataset each made training die): ``run`` stops at the first and
says others remain; ``--find-all`` names both and says they are independent."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from envbisect.cli import cli
from tests.helpers_run import SLOWDOWN, Scenario, pkg


def _two_causes(tmp_path: Path) -> Scenario:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==3.0")  # the live venv is the bad state: the slow build
    git = sc.git_entry(sc.commits[0])
    good = {"packages": {"ebwork": pkg("1.0")}, "env": {"A1": "x"}, "git": git}
    bad = {
        "packages": {"ebwork": pkg("3.0")},
        "env": {"A1": "y", "EB_SLOW": str(SLOWDOWN)},
        "git": git,
    }
    sc.write(good=good, bad=bad, loose_good=b"lr = 0.2\n", loose_bad=b"lr = 0.2\n")
    return sc


def _run(sc: Scenario, *extra: str) -> tuple[int, str, dict]:
    argv = [
        "run",
        "--config", str(sc.config),
        "--python", sc.python,
        "--session", str(sc.tmp / f"session{len(extra)}"),
        "--json", str(sc.tmp / "result.json"),
        "--bad", str(sc.bad),
        # Each cause alone is SLOWDOWN× slower, both together SLOWDOWN²×: half the good
        # speed tells a state with either cause from one without.
        "--until", "50%",
        *extra,
        "--", "python", str(sc.repo / "train.py"),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    return res.return_value, res.output, json.loads((sc.tmp / "result.json").read_text())


def test_the_first_cause_says_others_remain_and_find_all_names_them_all(tmp_path: Path) -> None:
    sc = _two_causes(tmp_path)
    code, out, doc = _run(sc)
    assert code == 0, out
    assert len(doc["culprits"]) == 1
    assert "--find-all isolates them" in out
    code, out, doc = _run(sc, "--find-all")
    assert code == 0, out
    assert sorted(c["unit"] for c in doc["culprits"]) == ["env:EB_SLOW", "packages:ebwork"]
    assert "2 independent causes: each one alone brings the regression" in out
