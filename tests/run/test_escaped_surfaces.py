"""One escaping rule on every surface: a name holding a newline and escape sequences (OSC
title, clear-screen) from a manifest is shown escaped by run's progress, its report and
--json, the session log, ``log``, ``diff`` and the error line; an env name no process can
hold is refused before the first trial."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.helpers_run import manifest
from tests.helpers_user_repo import envbisect

NAME = "EB_X\n\x1b]0;pwned\x07\x1b[2J"
SHOWN = "EB_X\\n\\x1b]0;pwned\\x07\\x1b[2J"
WORK = (
    "import os\n"
    "slow = any(k.startswith('EB_X') for k in os.environ)\n"
    "print('ENVBISECT_RESULT {\"tok_per_s\": %d}' % (500 if slow else 5000))\n"
)


def test_a_hostile_name_is_escaped_on_every_surface(tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text(WORK)
    manifest(tmp_path / "good.yaml", env={})
    manifest(tmp_path / "bad.yaml", env={NAME: "1", "EB_Y": "1"})
    run = envbisect(
        tmp_path, "run", "--good", "good.yaml", "--bad", "bad.yaml", "--until-ktoks", "1k",
        "--session", "s", "--report", "r.md", "--json", "r.json", "--repeats", "1",
        "--", sys.executable, "w.py",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    log = envbisect(tmp_path, "log", "--session", "s")
    diff = envbisect(tmp_path, "diff", "good.yaml", "bad.yaml")
    surfaces = {
        "progress": run.stderr,
        "stdout": run.stdout,
        "report": (tmp_path / "r.md").read_text(),
        "json": (tmp_path / "r.json").read_text(),
        "session log": (tmp_path / "s" / "log.jsonl").read_text(),
        "log": log.stdout + log.stderr,
        "diff": diff.stdout + diff.stderr,
    }
    for where, text in surfaces.items():
        assert "\x1b" not in text and "\x07" not in text, where
        assert "EB_X\n" not in text, where
    for where in ("progress", "report", "log"):
        assert SHOWN in surfaces[where], (where, surfaces[where][-2000:])
    assert f"Culprit: env {SHOWN}" in surfaces["report"]


def test_an_env_name_no_process_can_hold_is_refused_before_the_first_trial(
    tmp_path: Path,
) -> None:
    (tmp_path / "w.py").write_text(WORK)
    manifest(tmp_path / "good.yaml", env={})
    manifest(tmp_path / "bad.yaml", env={"EB_A=B\x1b[2J": "1", "EB_Y": "1"})
    run = envbisect(
        tmp_path, "run", "--good", "good.yaml", "--bad", "bad.yaml", "--until-ktoks", "1k",
        "--session", "s", "--", sys.executable, "w.py",
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last == (
        f"envbisect: error: {tmp_path / 'bad.yaml'}: env EB_A=B\\x1b[2J: a name with '=' or "
        "NUL cannot be set in a process's environment; fix or remove that entry"
    )
    assert "trial 1" not in run.stderr
