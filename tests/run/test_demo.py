"""The newcomer path, end to end: `envbisect demo` must name the one real culprit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envbisect.run import demo

pytestmark = pytest.mark.slow


def _demo(workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbisect", "demo", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_demo_names_the_one_real_culprit_and_reuses_what_it_built(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    first = _demo(workdir)
    assert first.returncode == 0, first.stderr[-3000:]
    # It shows the real commands a user would type, in order.
    shown = [line for line in first.stderr.splitlines() if line.startswith("$ ")]
    verbs = [line.split("envbisect ", 1)[1].split()[0] for line in shown if "envbisect " in line]
    assert verbs == ["snapshot", "smoke", "snapshot", "diff", "run"]
    result = json.loads((workdir / "result.json").read_text())
    assert result["outcome"] == "found"
    assert [c["unit"] for c in result["culprits"]] == [f"env:{demo.CULPRIT_ENV[0]}"]
    report = (workdir / "report.md").read_text()
    assert demo.CULPRIT_ENV[0] in report
    assert "Culprit:" in first.stderr + first.stdout
    # The drift is real: at least six kinds of change, each a unit of the diff.
    units = {t for trial in result["trials"] for t in trial["applied"]}
    assert {u.split(":", 1)[0] for u in units} >= {"packages", "files", "git", "env", "data"}

    again = _demo(workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing the demo" in again.stderr
    assert json.loads((workdir / "result.json").read_text())["culprits"] == result["culprits"]
