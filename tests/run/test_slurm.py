"""Slurm workers on a real single-node cluster (slurmctld + slurmd + munge on this machine).

Skipped with the reason where Slurm cannot start; ``.ci/run`` installs slurm-wlm and munge
and sets CI_REQUIRE_SLURM=1, under which a cluster that does not start is a failure.
"""

from __future__ import annotations

import json
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
from helpers_slurm import SlurmCluster, slurm_cluster  # noqa: F401 - a fixture, used by name

from envbisect.cli import cli
from envbisect.model.session import Session
from envbisect.run.slurm import slurm_reason
from tests.helpers_run import Scenario, pkg

# What srun and slurmstepd write when Slurm ends a step (captured from Slurm 22.05 here).
TIME_LIMIT = (
    b"slurmstepd-vm: error: *** STEP 5.0 ON vm CANCELLED AT 2026-12-03T06:32:48 DUE TO TIME "
    b"LIMIT ***\nsrun: error: vm: task 0: Terminated\nsrun: Force Terminated StepId=5.0\n"
)


def test_slurm_reason_reads_what_slurm_wrote() -> None:
    assert slurm_reason(TIME_LIMIT, 143) == "slurm cancelled step 5.0 on vm: time limit"
    oom = (
        b"slurmstepd: error: Detected 1 oom_kill event in StepId=7.0. "
        b"Some of the step tasks have been OOM Killed.\n"
    )
    why = slurm_reason(oom, 137) or ""
    assert why.startswith("slurm: OUT_OF_MEMORY (slurmstepd: error: Detected 1 oom_kill")
    assert slurm_reason(b"srun: error: task 0: Exited with exit code 253\n", 253) == (
        "slurm ended it (srun exit 253)"
    )
    assert slurm_reason(b"Traceback ...\nValueError: bad\n", 1) is None


def _scenario(tmp_path: Path, workers: list[dict[str, Any]], *, units: int = 6) -> Scenario:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0") if units == 1 else sc.venv("ebwork==2.0", "ebonly==1.0")
    git = sc.git_entry(sc.commits[0])
    if units == 1:
        good: dict[str, Any] = {"env": {}, "git": git}
        bad: dict[str, Any] = {"env": {"EB_SLOW": "8"}, "git": git}
        good["packages"] = bad["packages"] = {"ebwork": pkg("1.0")}
    else:
        good = {"packages": {"ebwork": pkg("1.0")}, "env": {"A1": "x"}, "git": git}
        bad = {
            "packages": {"ebwork": pkg("2.0"), "ebonly": pkg("1.0")},
            "env": {"A1": "y", "A2": "new", "A3": "new", "EB_SLOW": "8"},
            "git": git,
        }
    sc.write(good=good, bad=bad, loose_good=b"lr = 0.2\n", loose_bad=b"lr = 0.2\n")
    config = yaml.safe_load(sc.config.read_text())
    config["workers"] = workers
    sc.config.write_text(yaml.safe_dump(config))
    return sc


def _argv(sc: Scenario, *extra: str, smoke: tuple[str, ...] = ()) -> list[str]:
    return [
        "run",
        "--config",
        str(sc.config),
        "--python",
        sc.python,
        "--session",
        str(sc.tmp / "session"),
        "--json",
        str(sc.tmp / "result.json"),
        "--bad",
        str(sc.bad),
        *extra,
        "--",
        *(smoke or ("python", str(sc.repo / "train.py"))),
    ]


def _far_path() -> str:
    """PATH of the jobs (srun passes the submitting environment on): with uv, as on a node
    where envbisect can build venvs."""
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"


def _job_names(cluster: SlurmCluster) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%j %T"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        check=False,
    )
    return [line for line in out.stdout.splitlines() if line.startswith("envbisect-")]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["salloc", "srun"])
def test_a_bisection_whose_trials_are_slurm_jobs_finds_the_culprit(
    tmp_path: Path,
    slurm_cluster: SlurmCluster,  # noqa: F811 - the fixture imported above
    monkeypatch: Any,
    mode: str,
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("PATH", _far_path())
    sc = _scenario(
        tmp_path, [{"name": "slurm", "slurm": {"count": 2, "time": "00:10:00", "mode": mode}}]
    )
    res = CliRunner().invoke(cli, _argv(sc), standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0, res.output
    doc = json.loads((tmp_path / "result.json").read_text())
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    # Both allocations measured the good state (calibration). A worker whose speed is off
    # by too much there is left out with its reason logged (on a loaded CI box slurm1 was);
    # the trials ran on the workers kept, and on both when both were kept.
    session = Session.existing(tmp_path / "session")
    events = session.events()
    kept = {e["worker"] for e in events if e.get("type") == "calibration"}
    refused = {e["worker"] for e in events if e.get("type") == "calibration-refused"}
    assert kept | refused == {"slurm0", "slurm1"} and "slurm0" in kept
    assert {t["worker"] for t in doc["trials"]} == kept
    # The smoke runs ran as Slurm steps or jobs: Slurm's own variables reached them.
    assert session.trials()
    assert _job_names(slurm_cluster) == []


@pytest.mark.slow
def test_a_trial_over_its_slurm_time_limit_is_a_crash_with_slurms_reason(
    tmp_path: Path,
    slurm_cluster: SlurmCluster,  # noqa: F811 - the fixture imported above
    monkeypatch: Any,
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("PATH", _far_path())
    hang = tmp_path / "hang.py"
    hang.write_text(
        "import os, runpy, sys, time\n"
        "if os.environ.get('EB_SLOW'):\n"
        "    time.sleep(600)\n"
        "runpy.run_path(sys.argv[1], run_name='__main__')\n"
    )
    sc = _scenario(tmp_path, [{"name": "slurm", "slurm": {"count": 2, "time": "1"}}], units=1)
    res = CliRunner().invoke(
        cli,
        _argv(sc, smoke=("python", str(hang), str(sc.repo / "train.py"))),
        standalone_mode=False,
        catch_exceptions=False,
    )
    doc = json.loads((tmp_path / "result.json").read_text())
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    [bad] = [t for t in doc["trials"] if t["applied"]]
    assert bad["failure"].startswith("crash: slurm cancelled step "), bad
    assert bad["failure"].endswith(": time limit") or ": time limit" in bad["failure"]
    assert _job_names(slurm_cluster) == []


@pytest.mark.slow
def test_ctrl_c_leaves_no_job_in_squeue(
    tmp_path: Path,
    slurm_cluster: SlurmCluster,  # noqa: F811 - the fixture imported above
) -> None:
    hang = tmp_path / "hang.py"
    hang.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    sc = _scenario(tmp_path, [{"name": "slurm", "slurm": {"count": 2, "time": "00:10:00"}}])
    env = {**slurm_cluster.env(), "PYTHONUNBUFFERED": "1", "PATH": _far_path()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "envbisect", *_argv(sc, smoke=("python", str(hang)))],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # A test run started in the background of a non-interactive shell inherits SIGINT
        # ignored, and Python then never raises KeyboardInterrupt: give the run Ctrl-C back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 240
        # Wait until both workers run a smoke step of the calibration round.
        while time.monotonic() < deadline:
            started = list((tmp_path / "session").glob("**/run-1.stdout"))
            if sum(1 for p in started if p.read_text().startswith("started")) >= 2:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)
        else:
            pytest.fail("the smoke runs did not start")
        assert _job_names(slurm_cluster), "no envbisect job while a trial runs"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert b"session saved" in err
    assert _job_names(slurm_cluster) == []
    # Nothing of the abandoned round was logged as a trial.
    assert Session.existing(tmp_path / "session").trials() == [] or all(
        t.samples for t in Session.existing(tmp_path / "session").trials()
    )
    assert not os.environ.get("SLURM_JOB_ID")
