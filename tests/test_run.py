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
import yaml
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
    assert (
        "Culprit: env EB_SLOW" in report
        and "envbisect run --config " in report
        and " --good " in report
    )
    assert sc.fingerprint() == before
    session = Session.existing(tmp_path / "session")
    assert session.finished() and not (session.root / "worktrees").exists()


def test_package_culprit_against_a_fresh_snapshot_of_the_current_state(tmp_path: Path) -> None:
    """Both sides are real snapshots; the user then upgraded a package and touched a file."""
    from envbisect import manifest as mf
    from envbisect.collect import take_snapshot
    from envbisect.config import Config
    from envbisect.transport import Transport
    from tests.helpers_run import install

    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0", "ebonly==1.0")
    sc.loose.write_bytes(b"lr = 0.1\n")
    sc.config.write_text(
        yaml.safe_dump(
            {
                "repos": [str(sc.repo)],
                "files": [str(sc.loose)],
                "keep_blobs": True,
                "manifests_dir": str(sc.mdir),
                "good": str(sc.mdir / "good.yaml"),
                "index_url": sc.index.as_uri(),
                "find_links": [str(sc.wheels)],
            }
        )
    )
    config = Config.load(sc.config)
    mf.save(take_snapshot(config, Transport(), sc.python, label="good"), sc.mdir / "good.yaml")
    # What the user did since: upgrade ebwork (slow), remove ebonly, edit the loose file.
    install(sc.target, sc.wheels, "ebwork==3.0")
    subprocess.run(
        [
            str(Path(sys.executable).parent / "uv"),
            "pip",
            "uninstall",
            "-q",
            "--python",
            sc.python,
            "ebonly",
        ],
        check=True,
    )
    sc.loose.write_bytes(b"lr = 0.2\n")
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
    assert len(doc["trials"]) <= _max_trials(3)  # ebwork, ebonly, the loose file
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
    from tests.helpers_run import SLOWDOWN, run_workload

    git_dir = sc.tmp / "probe"
    git_dir.mkdir()
    (git_dir / "train.py").write_text((sc.repo / "train.py").read_text())
    threshold = run_workload(sc.python, git_dir / "train.py") / SLOWDOWN**0.5
    res, doc = _run_cli(
        sc, "--until-ktoks", f"{threshold:.0f}", "--repeats", "3", smoke=("python", "train.py")
    )
    assert res.return_value == 0, res.output
    assert f"good means ≥ {threshold:,.0f} tok/s ({threshold / 1000:.1f} Ktok/s)" in res.stderr
    assert doc["threshold_tok_per_s"] == pytest.approx(round(threshold))
    [culprit] = doc["culprits"]
    assert culprit["unit"] == f"git:{sc.repo}"
    assert culprit["commit"] == slow
    # 2 endpoints + isolating 1 of 2 units (≤ 2) + confirming + ⌈log2 4⌉ narrowing steps
    assert len(doc["trials"]) <= 2 + 2 + 2 + 2
    assert f"first bad commit {slow[:12]}" in res.stdout
    assert sc.fingerprint() == before


def _env_culprit_scenario(tmp_path: Path) -> Scenario:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==2.0", "ebonly==1.0")
    git_entry = sc.git_entry(sc.commits[0])
    sc.write(
        good={"packages": {"ebwork": pkg("1.0")}, "git": git_entry},
        bad={
            "packages": {"ebwork": pkg("2.0"), "ebonly": pkg("1.0")},
            "env": {"EB_SLOW": "8"},
            "git": git_entry,
        },
        loose_good=b"lr = 0.1\n",
        loose_bad=b"lr = 0.2\n",
    )
    return sc


def _spawn(sc: Scenario, *extra: str) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "envbisect",
        "run",
        "--config",
        str(sc.config),
        "--python",
        sc.python,
        "--bad",
        str(sc.bad),
        "--session",
        str(sc.tmp / "session"),
        "--json",
        str(sc.tmp / "result.json"),
        *extra,
        "--",
        "python",
        str(sc.repo / "train.py"),
    ]
    env = {**os.environ, "EB_TOKENS": "20000"}  # trials long enough to be caught mid-way
    return subprocess.Popen(
        argv,
        env=env,
        stdout=open(sc.tmp / "run.out", "wb"),  # noqa: SIM115 - closed with the process
        stderr=open(sc.tmp / "run.err", "wb"),  # noqa: SIM115
    )


def _wait_for(proc: subprocess.Popen[bytes], what: str, pred: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended (exit {proc.returncode}) before {what}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


def _swap_open(sc: Scenario) -> bool:
    """A swap is journaled and its new content written (the journal line comes first)."""
    root = sc.tmp / "session"
    if not (root / "journal.jsonl").exists() or not Session(root).journal.open_swaps():
        return False
    return sc.loose.read_bytes() == b"lr = 0.1\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_mid_trial_restores_everything_then_resume_finishes(
    tmp_path: Path, signum: int
) -> None:
    sc = _env_culprit_scenario(tmp_path)
    before = sc.fingerprint()
    proc = _spawn(sc)
    _wait_for(proc, "a file swapped in place", lambda: _swap_open(sc))
    assert sc.loose.read_bytes() == b"lr = 0.1\n"  # the good content is in place right now
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == 130
    assert "interrupted; files restored, session saved" in (tmp_path / "run.err").read_text()
    assert sc.fingerprint() == before
    log = CliRunner().invoke(cli, ["log", "--session", str(tmp_path / "session")])
    assert log.exit_code == 0 and "unfinished: continue with 'envbisect run --resume'" in log.output
    resumed = _spawn(sc, "--resume")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "run.err").read_text()
    doc = json.loads((tmp_path / "result.json").read_text())
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    assert sc.fingerprint() == before


def test_kill_9_then_resume_repeats_no_finished_trial(tmp_path: Path) -> None:
    sc = _env_culprit_scenario(tmp_path)
    before = sc.fingerprint()
    proc = _spawn(sc)
    session = Session(tmp_path / "session")
    _wait_for(proc, "two finished trials", lambda: len(session.trials()) >= 2)
    proc.kill()
    proc.wait()
    finished = session.trials()
    resumed = _spawn(sc, "--resume")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "run.err").read_text()
    doc = json.loads((tmp_path / "result.json").read_text())
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    records = session.trials()
    # Every logged sample was used by the search exactly once: nothing measured twice.
    assert sum(len(r.samples) for r in records) == sum(len(t["samples"]) for t in doc["trials"])
    assert records[: len(finished)] == finished
    assert sc.fingerprint() == before


def test_kill_9_with_a_file_swapped_then_reset_restores_the_machine(tmp_path: Path) -> None:
    sc = _env_culprit_scenario(tmp_path)
    before = sc.fingerprint()
    proc = _spawn(sc)
    _wait_for(proc, "a file swapped in place", lambda: _swap_open(sc))
    proc.kill()
    proc.wait()
    assert sc.loose.read_bytes() == b"lr = 0.1\n"  # left swapped by the dead process
    res = CliRunner().invoke(cli, ["reset", "--session", str(tmp_path / "session")])
    assert res.exit_code == 0, res.output
    assert f"restored {sc.loose}" in res.output
    assert sc.fingerprint() == before
    assert not (tmp_path / "session" / "venvs").exists()


def test_bad_input_is_one_line_and_leaves_no_session(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "envbisect",
            "run",
            "--good",
            str(tmp_path / "nope.yaml"),
            "--until-ktoks",
            "12k",
            "--session",
            str(tmp_path / "s"),
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"envbisect: error: {tmp_path / 'nope.yaml'}: no such manifest file"
    )
    assert not (tmp_path / "s").exists()


def test_identical_states_have_nothing_to_bisect(tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0")
    sc.write(good={}, bad={}, loose_good=b"same\n", loose_bad=b"same\n")
    res, doc = _run_cli(sc)
    assert res.return_value == 1
    assert doc["outcome"] == "not-reproduced" and doc["trials"] == []
    assert "nothing to bisect" in res.stdout


def test_env_culprit_through_a_layer_chain(tmp_path: Path) -> None:
    """Through --via, env units travel inside the command; files are realized there too."""
    sc = Scenario(tmp_path)
    sc.venv()
    sc.write(
        good={"env": {"KEEP": "1"}},
        bad={"env": {"KEEP": "1", "EB_SLOW": "8"}},
        loose_good=b"a\n",
        loose_bad=b"b\n",
    )
    before = sc.fingerprint()
    res, doc = _run_cli(sc, "--via", "env", smoke=(sys.executable, str(sc.repo / "train.py")))
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    assert f"files:{sc.loose}" not in doc.get("not_bisected", {})
    assert sc.fingerprint() == before


@pytest.mark.parametrize("on_crash", ["bad", "skip"])
def test_a_crashing_change_is_the_culprit_or_is_skipped(tmp_path: Path, on_crash: str) -> None:
    sc = Scenario(tmp_path)
    sc.venv()
    sc.write(
        good={"env": {}},
        bad={"env": {"EB_CRASH": "1", "EB_SLOW": "8"}},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    res, doc = _run_cli(sc, "--on-crash", on_crash)
    crashed = [t for t in doc["trials"] if t["failure"]]
    assert crashed and all("simulated training crash" in t["failure"] for t in crashed)
    if on_crash == "bad":
        assert res.return_value == 0, res.output
        assert [c["unit"] for c in doc["culprits"]] == ["env:EB_CRASH"]
    else:
        # The bad endpoint cannot be measured: nothing to bisect against.
        assert res.return_value == 1
        assert doc["outcome"] != "found"


WINDOWED = """
import json, os
n = int(os.environ["ENVBISECT_SAMPLES"])
rate = 300.0 if os.environ.get("EB_SLOW") else 1000.0
rates = [rate * (1 + 0.01 * k) for k in range(n)]
with open(os.environ["ENVBISECT_RESULT"], "w") as fh:
    json.dump({"ok": True, "tok_per_s": rates[0], "samples": rates}, fh)
"""


def test_trial_samples_come_from_one_process_endpoints_from_two(tmp_path: Path) -> None:
    from tests.helpers_run import manifest

    script = tmp_path / "windowed.py"
    script.write_text(WINDOWED)
    good = manifest(tmp_path / "good.yaml", env={})
    bad = manifest(tmp_path / "bad.yaml", env={"EB_A": "1", "EB_B": "1", "EB_SLOW": "1"})
    (tmp_path / "envbisect.yaml").write_text("{}\n")
    out = tmp_path / "r.json"
    argv = [
        "run", "--config", str(tmp_path / "envbisect.yaml"), "--python", sys.executable,
        "--good", str(good), "--bad", str(bad), "--until-ktoks", "600",
        "--session", str(tmp_path / "session"), "--json", str(out),
        "--", sys.executable, str(script),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0, res.output
    doc = json.loads(out.read_text())
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    runs = {}
    for trial in sorted((tmp_path / "session" / "trials").iterdir()):
        runs[trial.name] = len(list(trial.glob("run-*.result.json")))
    trials = sorted(runs)
    assert runs[trials[0]] == 2 and runs[trials[1]] == 2  # the endpoints: two processes
    assert all(runs[t] == 1 for t in trials[2:]), runs  # every other state: one process
    assert all(len(t["samples"]) >= 3 for t in doc["trials"])
