"""``run``'s package-source check before the first trial, on a real target venv and real
local sources, through the real command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers_run import Scenario, build_wheel, install, pkg

pytestmark = pytest.mark.slow


def test_every_missing_version_is_one_line_and_exit_2_before_any_trial(tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==2.0")
    # Installed from a place the config does not name: the overlay links it, no source needed.
    private = tmp_path / "private"
    build_wheel(private, "ebpriv", "1.0", "P = 1\n")
    install(sc.target, private, "ebpriv==1.0")
    git = sc.git_entry(sc.commits[0])
    sc.write(
        good={
            "packages": {"ebwork": pkg("0.5"), "ebpriv": pkg("1.0"), "ebonly": pkg("1.0")},
            "git": git,
        },
        bad={"packages": {"ebwork": pkg("2.0"), "ebextra": pkg("9.9")}, "git": git},
        loose_good=b"lr = 0.1\n",
        loose_bad=b"lr = 0.1\n",
    )
    session = tmp_path / "session"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "envbisect",
            "run",
            "--config",
            str(sc.config),
            "--python",
            sc.python,
            "--session",
            str(session),
            "--bad",
            str(sc.bad),
            "--",
            "python",
            str(sc.repo / "train.py"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("envbisect: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = errors[0]
    assert f"{sc.config}: 2 package versions the run needs are not available" in line
    assert "ebextra==9.9, ebwork==0.5 (looked at: " in line
    assert f"default index {sc.index.as_uri()}, find-links {sc.wheels})" in line
    assert "ebpriv" not in line and "ebonly" not in line  # installed / in find-links
    assert not (session / "trials").exists() or not list((session / "trials").iterdir())
    assert "trial 1" not in proc.stderr


def test_a_bad_sources_field_is_one_line_naming_the_file_and_field_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "envbisect.yaml"
    config.write_text("indexes: [file:///a/simple]\nindex_strategy: first-match\n")
    good = tmp_path / "good.yaml"
    good.write_text("schema: envbisect/manifest@1\nmeta: {label: good}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "run", "--config", str(config), "--good", str(good)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"envbisect: error: {config}: field 'index_strategy' must be first-index or "
        "unsafe-first-match or unsafe-best-match, got 'first-match'"
    ]
