"""End-to-end runs: real uv venvs, real git worktrees, real file swaps, a real workload."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from envbisect.cli import cli
from envbisect.model.errors import Interrupted
from envbisect.model.session import Session
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
    from envbisect.model import manifest as mf
    from envbisect.model.config import Config
    from envbisect.model.trust import sign
    from envbisect.snapshot import take_snapshot
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
    good = sign(take_snapshot(config, Transport(), sc.python, label="good"))  # as snapshot -o
    mf.save(good, sc.mdir / "good.yaml")
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
    releases = [t for t in doc["trials"] if t["purpose"] == "narrow: releases of ebwork"]
    assert len(doc["trials"]) - len(releases) <= _max_trials(3)  # ebwork, ebonly, loose file
    # Then ebwork's one release in between (2.0, as fast as 1.0): ⌈log2 1⌉ + 1 trial at most.
    assert len(releases) <= 1
    assert doc["culprits"][0]["within"]["release"]["first_bad"] == "3.0"
    assert sc.fingerprint() == before


def test_git_culprit_is_narrowed_to_the_first_bad_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    monkeypatch.chdir(sc.repo)  # `python train.py` as typed inside the repo
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
    # Found 6: a git culprit had no commit range or subjects in the report.
    report = (tmp_path / "report.md").read_text()
    assert f"commits {sc.commits[0][:12]}..{sc.commits[-1][:12]} in {sc.repo} (4):" in report
    assert f"{slow[:12]} more work per token  ← first bad commit" in report
    assert f"{sc.commits[-1][:12]} and again\n" in report
    # Next: the commit checked out, then the command as the run ran it (its cwd, the
    # target's python for a bare `python`).
    assert f"git -C {sc.repo} checkout {slow[:12]} && cd {sc.repo} && {sc.python} train.py" in (
        report
    )
    assert culprit["details"][0].startswith("commits ")


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
    named = CliRunner().invoke(cli, ["log", str(tmp_path / "session")])  # as users type it
    assert named.exit_code == 0 and named.output == log.output
    resumed = _spawn(sc, "--resume")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "run.err").read_text()
    doc = json.loads((tmp_path / "result.json").read_text())
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    assert sc.fingerprint() == before


def test_an_interrupt_whose_exception_was_lost_still_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in CI: Ctrl-C mid-trial, and the run went on to exit 0. Python raises the
    signal's exception at the main thread's next bytecode; when that is a finalizer's, the
    exception is printed as "Exception ignored" and lost. The latch the signal also sets
    stops the run at the trial's next process: here it is set, and no exception raised."""
    from envbisect.run import interrupt

    sc = _env_culprit_scenario(tmp_path)
    monkeypatch.setenv("EB_TOKENS", "20000")  # trials long enough to be caught mid-way
    before = sc.fingerprint()

    def lose_one() -> None:  # a signal whose exception went to a finalizer
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if _swap_open(sc):
                interrupt.LATCH.set()
                return
            time.sleep(0.02)

    threading.Thread(target=lose_one, daemon=True).start()
    with pytest.raises(Interrupted, match="interrupted; files restored, session saved"):
        _run_cli(sc)
    assert sc.fingerprint() == before
    assert not Session(tmp_path / "session").finished()  # resumable, not ended


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
    # (A state measured again after samples under load shows those as set aside.)
    used = sum(len(t["samples"]) + len(t["set_aside_samples"]) for t in doc["trials"])
    assert sum(len(r.samples) for r in records) == used
    # A finished trial is kept as logged; the resumed search may add samples to it (an
    # endpoint sampled until the threshold settles), never take any back or measure anew.
    for old, new in zip(finished, records, strict=False):
        assert (new.index, new.key, new.applied) == (old.index, old.key, old.applied)
        assert new.samples[: len(old.samples)] == old.samples
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
    (tmp_path / "far-home").mkdir()  # the target's HOME: its session dir goes with tmp_path
    via = ("--via", f"env HOME={tmp_path / 'far-home'}")
    res, doc = _run_cli(sc, *via, smoke=(sys.executable, str(sc.repo / "train.py")))
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    assert f"files:{sc.loose}" not in doc.get("not_bisected", {})
    assert sc.fingerprint() == before


# A job that needs its token: it fails auth unless CUDA_TOKEN_X is the user's real one
# (compared by hash, so the token itself is in no file of the test either).
NEEDS_TOKEN = r"""
import hashlib, os, runpy, sys
got = os.environ.get("CUDA_TOKEN_X", "")
if hashlib.sha256(got.encode()).hexdigest()[:8] != sys.argv[1]:
    raise SystemExit("auth failed: CUDA_TOKEN_X is not the real token")
runpy.run_path(sys.argv[2], run_name="__main__")
"""


def _hash8(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:8]


@pytest.mark.parametrize("through", [False, True], ids=["local", "via"])
def test_a_redacted_token_reaches_every_trial_as_the_users_real_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, through: bool
) -> None:
    """Issue 17: every trial saw CUDA_TOKEN_X="{'redacted': ...}" and failed auth."""
    (tmp_path / "far-home").mkdir()  # the target's HOME: its session dir goes with tmp_path
    via = ("--via", f"env HOME={tmp_path / 'far-home'}") if through else ()
    sc = Scenario(tmp_path)
    sc.venv()
    real = "ghp_" + "R3alT0ken" * 4
    monkeypatch.setenv("CUDA_TOKEN_X", real)
    sc.write(
        good={"env": {"CUDA_TOKEN_X": {"redacted": _hash8("ghp_" + "0ld" * 12)}}},
        bad={"env": {"CUDA_TOKEN_X": {"redacted": _hash8(real)}, "EB_SLOW": "8"}},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    job = tmp_path / "job.py"
    job.write_text(NEEDS_TOKEN)
    smoke = (sys.executable, str(job), _hash8(real), str(sc.repo / "train.py"))
    res, doc = _run_cli(sc, *via, smoke=smoke)
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    assert all(t["failure"] is None for t in doc["trials"]), doc["trials"]
    note = (
        "env CUDA_TOKEN_X is a secret (redacted in the manifest): every trial passes it "
        "through from your environment unchanged"
    )
    assert note in doc["notes"] and note in res.stderr
    assert "not bisected: env CUDA_TOKEN_X: the good value is redacted" in res.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert real.encode() not in path.read_bytes(), path


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


def test_trial_samples_come_from_one_process_each(tmp_path: Path) -> None:
    from tests.helpers_run import manifest

    script = tmp_path / "windowed.py"
    script.write_text(WINDOWED)
    good = manifest(tmp_path / "good.yaml", env={})
    bad = manifest(tmp_path / "bad.yaml", env={"EB_A": "1", "EB_B": "1", "EB_SLOW": "1"})
    (tmp_path / "envbisect.yaml").write_text("{}\n")
    out = tmp_path / "r.json"
    argv = [
        "run", "--config", str(tmp_path / "envbisect.yaml"), "--python", sys.executable,
        "--good", str(good), "--bad", str(bad), "--until-ktoks", "600tok/s",
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
    # every state one process, the endpoints too: 3× apart, no verdict a few percent of
    # between-process spread could move (closer endpoints: tests/search/test_endpoints.py)
    assert all(runs[t] == 1 for t in trials), runs
    assert all(len(t["samples"]) >= 3 for t in doc["trials"])


# -- trust: blobs found wherever the snapshot put them; unfaithful endpoints; sessions ----


def _envbisect(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> Any:
    """``envbisect ARGV`` as a user types it: a real process in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "envbisect", *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def _loose_file_world(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A project dir with the workload and its knob.txt (listed under files:, kept as
    blobs) and a config that records EB_OTHER too; returns (work dir, knob, target python)."""
    from tests.helpers_run import WORKLOAD, make_venv

    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(WORKLOAD)
    knob = work / "knob.txt"
    knob.write_text("1\n")
    (work / "envbisect.yaml").write_text(
        yaml.safe_dump({"files": [str(knob)], "keep_blobs": True, "env": ["EB_OTHER"]})
    )
    target = make_venv(tmp_path / "target", tmp_path / "no-wheels")
    return work, knob, target / "bin" / "python"


def test_snapshot_o_elsewhere_still_finds_the_file_culprit(tmp_path: Path) -> None:
    """Found 1: `snapshot -o PATH` into another directory stored the content under
    ./manifests/blobs while run looked next to PATH; the file was not realized, the good
    endpoint ran with the bad file and the run blamed "outside the recorded software"."""
    work, knob, python = _loose_file_world(tmp_path)
    elsewhere = tmp_path / "keep" / "good.yaml"
    snap = _envbisect(work, "snapshot", "-o", str(elsewhere), "--python", str(python))
    assert snap.returncode == 0, snap.stderr
    assert not (elsewhere.parent / "blobs").exists()  # the content went to ./manifests/blobs
    knob.write_text("8\n")
    res = _envbisect(
        work,
        "run",
        "--good",
        str(elsewhere),
        "--python",
        str(python),
        "--json",
        "-",
        "--",
        "python",
        "train.py",
        env={"EB_OTHER": "1"},
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout[res.stdout.index("{") :])
    assert [c["unit"] for c in doc["culprits"]] == [f"files:{knob}"]
    assert "not bisected" not in res.stderr
    assert knob.read_text() == "8\n"
    # Found 6: the culprit file was two hashes although its content was stored.
    assert doc["culprits"][0]["details"] == [
        f"--- {knob} (good)",
        f"+++ {knob} (bad)",
        "@@ -1 +1 @@",
        "-1",
        "+8",
    ]
    assert doc["schema"] == "envbisect/run@1" and doc["machine"]["python"]


def test_an_unrealizable_good_endpoint_is_never_reported_as_not_reproduced(
    tmp_path: Path,
) -> None:
    """With the stored content gone, the good state cannot be built: the run says which
    change stayed in its bad form instead of blaming what is outside the software."""
    import shutil

    work, knob, python = _loose_file_world(tmp_path)
    good = tmp_path / "keep" / "good.yaml"
    assert _envbisect(work, "snapshot", "-o", str(good), "--python", str(python)).returncode == 0
    shutil.rmtree(work / "manifests" / "blobs")
    knob.write_text("8\n")
    res = _envbisect(
        work,
        "run",
        "--good",
        str(good),
        "--python",
        str(python),
        "--json",
        "-",
        "--",
        "python",
        "train.py",
        env={"EB_OTHER": "1"},
    )
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout[res.stdout.index("{") :])
    assert doc["outcome"] == "unfaithful"
    assert "outside the recorded software" not in doc["message"]
    assert f"files {knob}: no stored content" in doc["message"]
    assert "the cause is probably among them" in doc["message"]


def test_a_second_run_on_a_session_needs_resume_or_fresh(tmp_path: Path) -> None:
    """Found 4: a run without --resume silently replaced an earlier session's history."""
    sc = _env_culprit_scenario(tmp_path)
    first, doc = _run_cli(sc)
    assert first.return_value == 0, first.output
    trials = len(doc["trials"])
    again = _spawn(sc)
    assert again.wait(timeout=120) == 2
    err = (tmp_path / "run.err").read_text().strip().splitlines()[-1]
    assert err == (
        f"envbisect: error: {tmp_path / 'session'}: holds an earlier run's session "
        f"({trials} trials, ended found); continue it with --resume or replace it with --fresh"
    )
    assert len(Session.existing(tmp_path / "session").trials()) == trials
    resumed = _spawn(sc, "--resume")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "run.err").read_text()
    assert len(Session.existing(tmp_path / "session").trials()) == trials  # all replayed
    fresh = _spawn(sc, "--fresh")
    assert fresh.wait(timeout=300) == 0, (tmp_path / "run.err").read_text()
    assert Session.existing(tmp_path / "session").events()[0]["type"] == "start"
    assert len(Session.existing(tmp_path / "session").trials()) == trials
    both = _spawn(sc, "--fresh", "--resume")
    assert both.wait(timeout=60) == 2


# -- trust: every realized state is checked; trial logs say how a trial ran ----------------


def test_a_planted_unfaithful_state_is_caught_before_it_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found 2, planted: a PYTHONPATH left in the user's shell shadows the state's venv with
    the slow ebwork 3.0, so the "good" state would really run the bad package (and be
    reported as "the good state is slow here too"). The realized-state check sees it."""
    from tests.helpers_run import uv

    sc = Scenario(tmp_path)
    sc.venv("ebwork==3.0")
    shadow = tmp_path / "shadow"
    subprocess.run(
        [
            uv(),
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--offline",
            "--no-index",
            "--find-links",
            str(sc.wheels),
            "--target",
            str(shadow),
            "--python",
            sc.python,
            "ebwork==3.0",
        ],
        check=True,
    )
    sc.write(
        good={"packages": {"ebwork": pkg("1.0")}, "env": {}},
        bad={"packages": {"ebwork": pkg("3.0")}, "env": {"EB_OTHER": "1"}},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    res, doc = _run_cli(sc)
    assert res.return_value == 1, res.output
    assert doc["outcome"] == "unfaithful"
    good = doc["trials"][0]
    assert good["applied"] == [] and good["verdict"] == "unresolved" and good["samples"] == []
    assert good["failure"] == (
        "state not faithful: packages ebwork 3.0, expected 1.0 "
        "(a copy outside the state's venv shadows it?)"
    )
    assert "outside the recorded software" not in doc["message"]
    trial = json.loads((tmp_path / "session" / "trials" / "001" / "trial.json").read_text())
    [call] = trial["calls"]
    assert call["state_check"]["faithful"] is False
    assert call["runs"] == []  # nothing was measured in a state that is not the state


def test_trial_logs_say_how_each_run_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = _env_culprit_scenario(tmp_path)
    monkeypatch.setenv("EB_SECRET_TOKEN", "hunter2-not-in-any-log")
    res, doc = _run_cli(sc)
    assert res.return_value == 0, res.output
    root = tmp_path / "session" / "trials"
    bad_endpoint = doc["trials"][1]
    trial = json.loads((root / f"{bad_endpoint['index']:03d}" / "trial.json").read_text())
    call = trial["calls"][0]
    assert call["state_check"]["faithful"] is True and call["state_check"]["checked"] >= 3
    assert call["env_diff"]["set"]["EB_SLOW"] == "8"
    assert "EB_SECRET_TOKEN" not in json.dumps(call["env_diff"])  # unchanged: not a diff
    assert call["interpreter"].endswith("/bin/python") and call["cwd"] == str(Path.cwd())
    run = call["runs"][0]
    # The typed `python` is the state's interpreter, never the first on PATH.
    assert run["argv"] == [call["interpreter"], str(sc.repo / "train.py")]
    assert run["program"].endswith("/bin/python") and run["exit_status"] == 0
    assert run["wall_s"] > 0 and run["tok_per_s"] == pytest.approx(bad_endpoint["samples"][0])
    for t in doc["trials"]:
        calls = json.loads((root / f"{t['index']:03d}" / "trial.json").read_text())["calls"]
        taken = len(t["samples"]) + len(t["set_aside_samples"])
        assert sum(len(c["runs"]) for c in calls) == taken
    assert "hunter2" not in "".join(p.read_text() for p in root.glob("*/trial.json"))


NOISY = r"""
import json, os
# A state's speed: 1000 tok/s, or RATE; samples alternate +-25% (a counter per state),
# so a state near the threshold needs more samples.
rate = float(os.environ.get("RATE", "1000"))
counter = os.path.join(os.environ["COUNTER_DIR"], "n-" + str(int(rate)))
n = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(n + 1))
print("ENVBISECT_RESULT " + json.dumps({"ok": True, "tok_per_s": rate * (1.25, 0.75)[n % 2]}))
"""


def test_log_shows_the_trials_run_showed_one_number_per_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found 3: `log` had one row per sample batch with its own verdicts, and run's
    [log .../trials/NNN] numbers were those rows. Now a state is one trial everywhere."""
    sc = Scenario(tmp_path)
    sc.venv()
    (tmp_path / "noisy.py").write_text(NOISY)
    (tmp_path / "counters").mkdir()
    sc.write(
        good={"env": {}},
        bad={"env": {"RATE": "600", "EB_OTHER": "1"}},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    monkeypatch.setenv("COUNTER_DIR", str(tmp_path / "counters"))
    res, doc = _run_cli(sc, "--until-ktoks", "0.8k", smoke=("python", str(tmp_path / "noisy.py")))
    rows = doc["trials"]
    assert any(len(r["samples"]) > 3 for r in rows)  # some state got more samples
    dirs = sorted(p.name for p in (tmp_path / "session" / "trials").iterdir())
    assert dirs == [f"{r['index']:03d}" for r in sorted(rows, key=lambda r: r["index"])]
    for r in rows:
        runs = sorted((tmp_path / "session" / "trials" / f"{r['index']:03d}").glob("run-*.stdout"))
        assert len(runs) == len(r["samples"]) + len(r["set_aside_samples"])
    log = CliRunner().invoke(cli, ["log", "--session", str(tmp_path / "session")])
    assert log.exit_code == 0
    from envbisect.render.report import trial_table
    from envbisect.run.result import TrialRow

    assert trial_table([TrialRow.from_dict(r) for r in rows]) in log.output
    assert trial_table([TrialRow.from_dict(r) for r in rows]) in res.stdout
    for line in res.stderr.splitlines():
        if "[log " in line:
            number = int(line.rsplit("/", 1)[1].rstrip("]"))
            assert number in {r["index"] for r in rows}


def test_env_diffs_in_trial_logs_are_redacted_by_name_and_by_value() -> None:
    from envbisect.run.triallog import env_diff

    diff = env_diff(
        {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz123456", "NOTE": "ghp_" + "a" * 36, "X": "1"},
        base={"X": "1", "GONE": "y"},
    )
    assert diff["unset"] == ["GONE"]
    assert set(diff["set"]) == {"HF_TOKEN", "NOTE"}
    assert all(isinstance(v, dict) and "redacted" in v for v in diff["set"].values())
    assert "ghp_" not in str(diff) and "hf_abc" not in str(diff)


# -- trust: thresholds people can give -----------------------------------------------------


def test_until_a_percentage_of_the_measured_good_state(tmp_path: Path) -> None:
    sc = _env_culprit_scenario(tmp_path)
    res, doc = _run_cli(sc, "--until", "50%")
    assert res.return_value == 0, res.output
    assert "good means ≥ 50% of the good state's measured speed, from --until 50%" in res.stderr
    good = doc["trials"][0]
    assert good["applied"] == []
    # The threshold is half the good state's median as first measured (its first samples).
    assert doc["threshold_tok_per_s"] < good["median"]
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    report = (tmp_path / "report.md").read_text()
    assert "- threshold: good means ≥ 50% of the good state's measured speed" in report


def test_a_threshold_that_separates_nothing_gets_a_suggestion(tmp_path: Path) -> None:
    """Found 5: with the threshold far below both endpoints the run only said "does not
    reproduce"; it now says which threshold would separate them."""
    sc = _env_culprit_scenario(tmp_path)
    res, doc = _run_cli(sc, "--until-ktoks", "1tok/s")
    assert res.return_value == 1
    assert doc["outcome"] == "not-reproduced"
    assert "the endpoints themselves differ (good " in doc["message"]
    assert "would separate them" in doc["message"]
    assert "e+0" not in res.stdout + res.stderr  # one number format everywhere


def test_threshold_from_the_config_and_its_source_on_the_start_line(tmp_path: Path) -> None:
    sc = _env_culprit_scenario(tmp_path)
    cfg = yaml.safe_load(sc.config.read_text())
    cfg.update(threshold="1tok/s", repeats=3)
    sc.config.write_text(yaml.safe_dump(cfg))
    res, _doc = _run_cli(sc)
    assert "good means ≥ 1 tok/s (0.001 Ktok/s), from envbisect.yaml threshold" in res.stderr
    refused = CliRunner().invoke(
        cli, ["run", "--until-ktoks", "15", "--good", str(sc.good)], standalone_mode=False
    )
    assert "a bare number below 1,000 is ambiguous" in str(refused.exception)


def test_an_untracked_file_in_a_recorded_repo_is_still_realized(tmp_path: Path) -> None:
    """A listed file that git does not track (knob.txt) inside a recorded repo whose commit
    also changed is not part of the repo's unit: no worktree has it, so it is written."""
    from tests.helpers_run import commit_all, git, init_repo

    work, knob, python = _loose_file_world(tmp_path)
    init_repo(work)
    (work / ".gitignore").write_text("")
    git(work, "add", "train.py", ".gitignore")
    git(work, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "workload")
    cfg = yaml.safe_load((work / "envbisect.yaml").read_text())
    (work / "envbisect.yaml").write_text(yaml.safe_dump({**cfg, "repos": [str(work)]}))
    good = tmp_path / "keep" / "good.yaml"
    assert _envbisect(work, "snapshot", "-o", str(good), "--python", str(python)).returncode == 0
    knob.write_text("8\n")
    (work / ".gitignore").write_text("*.pyc\n")
    commit_all(work, "ignore bytecode")  # knob.txt stays untracked: add -A would take it
    git(work, "rm", "-q", "--cached", "knob.txt")
    git(work, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "untrack")
    res = _envbisect(
        work, "run", "--good", str(good), "--python", str(python), "--json", "-",
        "--", "python", "train.py",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout[res.stdout.index("{") :])
    assert [c["unit"] for c in doc["culprits"]] == [f"files:{knob}"]
    assert "No such file" not in res.stdout + res.stderr
