"""Parallel runs end to end: local slots (pinned cores, GPU slots), ssh workers, Ctrl-C.

Real uv venvs, real git, the real sshd fixture; a faithful fake ``nvidia-smi`` stands in
for GPUs (each slot's trial must see its own ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from helpers_ssh import (  # the same module object as test_transport_ssh's: one sshd
    SshServer,
    sshd_server,  # noqa: F401 - a pytest fixture, used by name
)

from envbisect.cli import cli, main
from envbisect.model.events import TrialRecord
from envbisect.model.session import Session, state_key
from envbisect.run.launch import SmokeCommand
from envbisect.run.options import RunOptions
from envbisect.run.parallel import calibrate_workers
from envbisect.run.trial import TrialRunner
from envbisect.run.workers import Worker, WorkerPool
from envbisect.search import Outcome, State
from tests.helpers_run import Scenario, pkg

pytestmark = pytest.mark.slow

FAKES = Path(__file__).parents[1] / "fakes" / "bin"

# Says where it ran (GPU, cores, threads) and reports a steady rate set by the state, so
# that what is asserted is the plumbing, not this shared machine's speed (speed is
# benchmarks/bench_parallel.py's business).
PROBE = """
import json, os
try:
    import ebwork
    work = ebwork.WORK
except ImportError:
    work = 1
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "-"))
print("AFFINITY=" + ",".join(str(c) for c in sorted(os.sched_getaffinity(0))))
print("OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", "-"))
rate = 12000.0 / work / int(os.environ.get("EB_SLOW") or 1)
print("ENVBISECT_RESULT " + json.dumps({"ok": True, "tok_per_s": rate}))
"""


def _probe(sc: Scenario) -> tuple[str, ...]:
    path = sc.tmp / "probe.py"
    path.write_text(PROBE)
    return ("python", str(path))


def _said(trial_dir: str, what: str) -> str:
    for line in (Path(trial_dir) / "run-1.stdout").read_text().splitlines():
        if line.startswith(what + "="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{what} not in {trial_dir}")


def _scenario(tmp_path: Path, *, loose_changes: bool = False) -> Scenario:
    """Six units, the culprit an env var; no file swapped in place unless asked."""
    sc = Scenario(tmp_path)
    sc.venv("ebwork==2.0", "ebonly==1.0")
    git = sc.git_entry(sc.commits[0])
    env_good = {"KEEP": "1", "A1": "x", "A2": "x"}
    sc.write(
        good={"packages": {"ebwork": pkg("1.0")}, "env": env_good, "git": git},
        bad={
            "packages": {"ebwork": pkg("2.0"), "ebonly": pkg("1.0")},
            "env": {"KEEP": "1", "A1": "y", "A2": "y", "A3": "new", "EB_SLOW": "8"},
            "git": git,
        },
        loose_good=b"lr = 0.1\n" if loose_changes else b"lr = 0.2\n",
        loose_bad=b"lr = 0.2\n",
    )
    return sc


def _run(sc: Scenario, *extra: str, session: str = "session", smoke: tuple[str, ...] = ()) -> Any:
    out = sc.tmp / f"{session}.json"
    argv = [
        "run",
        "--config",
        str(sc.config),
        "--python",
        sc.python,
        "--session",
        str(sc.tmp / session),
        "--json",
        str(out),
        "--report",
        str(sc.tmp / f"{session}.md"),
        "--bad",
        str(sc.bad),
        *extra,
        "--",
        *(smoke or ("python", str(sc.repo / "train.py"))),
    ]
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    return res, json.loads(out.read_text()) if out.exists() else {}


def _refused(sc: Scenario, capsys: Any, *extra: str) -> str:
    """Run through the entry point (errors → exit codes); the stderr of a refused run."""
    argv = [
        "run",
        "--config",
        str(sc.config),
        "--python",
        sc.python,
        "--session",
        str(sc.tmp / "s"),
        "--bad",
        str(sc.bad),
        *extra,
        "--",
        "python",
        str(sc.repo / "train.py"),
    ]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    return err


def _run_report(sc: Scenario, session: str) -> str:
    return (sc.tmp / f"{session}.md").read_text()


def _rounds(doc: dict[str, Any]) -> int:
    return max(t["round"] for t in doc["trials"])


def test_two_pinned_cpu_workers_find_the_same_culprit_in_fewer_rounds(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to pin two workers")
    sc = _scenario(tmp_path)
    before = sc.fingerprint()
    one, doc1 = _run(sc, "--workers", "1", session="one", smoke=_probe(sc))
    two, doc2 = _run(sc, "--workers", "2", session="two", smoke=_probe(sc))
    assert one.return_value == 0 and two.return_value == 0, two.output
    assert [c["unit"] for c in doc2["culprits"]] == [c["unit"] for c in doc1["culprits"]]
    assert [c["unit"] for c in doc2["culprits"]] == ["env:EB_SLOW"]
    assert _rounds(doc2) < _rounds(doc1)
    assert {t["worker"] for t in doc2["trials"]} == {"cpu0", "cpu1"}
    assert all(t["worker"] is None for t in doc1["trials"])
    # Every trial ran pinned to its worker's core, and the log and table say where.
    session = Session.existing(tmp_path / "two")
    trials = session.trials()
    assert all(t.worker in ("cpu0", "cpu1") and t.round is not None for t in trials)
    cal = [e for e in session.events() if e["type"] == "calibration"]
    assert [e["worker"] for e in cal] == ["cpu0", "cpu1"]
    assert cal[0]["decision"] == "reference"
    assert "round" in two.output and "worker" in two.output
    assert _run_report(sc, "two").count(" rounds on 2 workers (cpu0, cpu1)") == 1
    log = CliRunner().invoke(cli, ["log", "--session", str(tmp_path / "two")])
    assert log.exit_code == 0 and "cpu1" in log.output and "calibration cpu1" in log.output
    assert sorted(t.index for t in trials) == list(range(1, len(trials) + 1))
    cores = sorted(os.sched_getaffinity(0))
    for t in trials:
        want = cores[:1] if t.worker == "cpu0" else cores[1:2]
        assert _said(t.log_dir, "AFFINITY") == ",".join(map(str, want)), t
        assert _said(t.log_dir, "OMP_NUM_THREADS") == "1"
    assert all(Path(t.log_dir).name == f"{t.index:03d}" for t in trials)
    assert sc.fingerprint() == before


def test_gpu_slots_each_see_their_own_device(tmp_path: Path, monkeypatch: Any) -> None:
    sc = _scenario(tmp_path)
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GPUS", "NVIDIA H200:143771,NVIDIA H200:143771")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    res, doc = _run(sc, "--workers", "auto", smoke=_probe(sc))
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    seen = set()
    for t in Session.existing(tmp_path / "session").trials():
        want = {"gpu0": "0", "gpu1": "1"}[str(t.worker)]
        assert _said(t.log_dir, "CUDA_VISIBLE_DEVICES") == want
        seen.add(t.worker)
    assert seen == {"gpu0", "gpu1"}, res.output
    assert (tmp_path / "session" / "workers" / "target.yaml").is_file()


def test_a_worker_on_another_gpu_model_is_refused(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    sc = _scenario(tmp_path)
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GPUS", "NVIDIA H200:143771,NVIDIA A100-SXM4-80GB:81920")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    err = _refused(sc, capsys, "--workers", "auto")
    assert (
        "worker gpu1: GPU 1 'NVIDIA A100-SXM4-80GB' differs from the target's 'NVIDIA H200'" in err
    )
    assert not (tmp_path / "s" / "trials").exists()


def test_slots_sharing_a_host_refuse_a_file_swapped_in_place(tmp_path: Path, capsys: Any) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to pin two workers")
    sc = _scenario(tmp_path, loose_changes=True)
    err = _refused(sc, capsys, "--workers", "2")
    assert "share one host" in err and "swaps a file in place" in err


def test_more_workers_than_cores_is_refused_with_the_reason(tmp_path: Path, capsys: Any) -> None:
    sc = _scenario(tmp_path)
    n = len(os.sched_getaffinity(0)) + 1
    err = _refused(sc, capsys, "--workers", str(n))
    assert f"--workers {n}: this host has {n - 1} core(s)" in err
    assert "disturb each other's throughput" in err


def test_two_ssh_workers_and_two_slots_agree_with_one_worker(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
) -> None:
    sc = _scenario(tmp_path)
    targets = {}
    workers: list[dict[str, Any]] = []
    for name in ("box1", "box2"):
        home = tmp_path / f"home-{name}"
        home.mkdir()
        targets[name] = {"via": [sshd_server.via, f"env HOME={home}"], "python": sc.python}
        workers.append({"name": name, "target": name})
    cores = sorted(os.sched_getaffinity(0))
    for i in range(2):
        workers.append({"name": f"slot{i}", "cpus": [cores[i % len(cores)]]})
    config = yaml.safe_load(sc.config.read_text())
    config.update(targets=targets, workers=workers)
    sc.config.write_text(yaml.safe_dump(config))
    one, doc1 = _run(sc, "--workers", "1", session="one", smoke=_probe(sc))
    many, doc4 = _run(sc, session="many", smoke=_probe(sc))
    assert one.return_value == 0 and many.return_value == 0, many.output
    assert [c["unit"] for c in doc4["culprits"]] == [c["unit"] for c in doc1["culprits"]]
    assert _rounds(doc4) < _rounds(doc1)
    used = {t["worker"] for t in doc4["trials"]}
    assert {"box1", "box2"} & used, used
    for name in ("box1", "box2"):
        # Each ssh worker's remote session dir is cleaned up at the end.
        assert not list((tmp_path / f"home-{name}" / ".envbisect").glob("session-*/worktrees/*"))


def test_resume_replays_every_trial_on_the_worker_that_measured_it(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to pin two workers")
    sc = _scenario(tmp_path)
    first, doc1 = _run(sc, "--workers", "2", session="s", smoke=_probe(sc))
    assert first.return_value == 0, first.output
    trials = sorted((tmp_path / "s" / "trials").iterdir())
    again, doc2 = _run(sc, "--workers", "2", "--resume", session="s", smoke=_probe(sc))
    assert again.return_value == 0, again.output
    assert "calibration read back from the session log" in again.output
    assert sorted((tmp_path / "s" / "trials").iterdir()) == trials  # nothing measured again
    assert [(t["applied"], t["worker"], t["round"]) for t in doc2["trials"]] == [
        (t["applied"], t["worker"], t["round"]) for t in doc1["trials"]
    ]


# ----------------------------------------------------------------------------- the set-up API
# What envbisect.run.parallel does before the first trial, driven directly: calibration of
# every worker at once (its decisions logged, read back on --resume), and the trial runner's
# replay of the reference worker's good state through a WorkerPool round.


class _Calibrated:
    """The part of ``TrialRunner`` calibration uses; each worker's good state runs at the
    speed given, and every measurement waits for the others (a barrier): measured one after
    another, the barrier breaks and the test fails."""

    def __init__(self, speeds: dict[str, float]) -> None:
        self.speeds = speeds
        self.barrier = threading.Barrier(len(speeds), timeout=10)
        self.calls: list[tuple[str, bool]] = []
        self.replayed: list[str] = []
        self.rounds: Any = None

    def measure(
        self, state: State, n: int, worker: Worker, cancel: threading.Event, *, calibration: bool
    ) -> Outcome:
        self.calls.append((worker.name, calibration))
        self.barrier.wait()
        speed = self.speeds[worker.name]
        return Outcome(samples=tuple(speed * (1 + 0.001 * i) for i in range(n)), worker=worker.name)

    def replay_as_good_endpoint(self, worker: str) -> None:
        self.replayed.append(worker)


def test_calibration_measures_all_workers_at_once_and_is_read_back_on_resume(
    tmp_path: Path,
) -> None:
    session = Session.start(tmp_path / "s", {})
    workers = [Worker("w0"), Worker("w1"), Worker("w2")]
    tester = _Calibrated({"w0": 1000.0, "w1": 900.0, "w2": 500.0})  # w2: 2x off, left out
    lines: list[str] = []
    kept, factors, sticky = calibrate_workers(
        workers,
        tester,
        session=session,
        samples=3,
        progress=lines.append,
    )
    assert [w.name for w in kept] == ["w0", "w1"]
    assert factors == {"w0": 1.0, "w1": pytest.approx(1000 / 900)}
    assert sticky == {State.of(()): "w0"}
    # Only the reference worker's run is a trial (the search replays it as its good end).
    assert sorted(tester.calls) == [("w0", False), ("w1", True), ("w2", True)]
    assert tester.replayed == ["w0"] and tester.rounds == {State.of(()): 0}
    assert any("worker w2" in line and "left out" in line for line in lines)
    events = [e for e in session.events() if e["type"].startswith("calibration")]
    assert [(e["type"], e["worker"]) for e in events] == [
        ("calibration-refused", "w2"),
        ("calibration", "w0"),
        ("calibration", "w1"),
    ]
    assert events[2]["decision"] == "scaled"
    assert sorted(events[0]) == ["reason", "samples", "type", "worker"]

    # --resume: read back from the log, nothing measured again.
    again = _Calibrated({})
    assert calibrate_workers(
        workers,
        again,
        session=session,
        samples=3,
        progress=lines.append,
    ) == (kept, factors, sticky)
    assert again.calls == []


def test_the_reference_workers_good_trial_is_replayed_through_a_pool_round(
    tmp_path: Path,
) -> None:
    """A real TrialRunner: the good state's logged trial (measured on w0 by calibration) is
    handed back to the search instead of being measured again, on the worker that measured
    it, its samples scaled by that worker's factor. Measuring for real would need an
    actuator; there is none, so a trial that is not replayed fails the test."""
    session = Session.start(tmp_path / "s", {})
    good = State.of(())
    session.append(
        TrialRecord(1, state_key((), ()), (), (), (10.0, 11.0), None, "t/001", worker="w0")
    )
    options = RunOptions(
        good=tmp_path / "good.yaml", bad=None, smoke=SmokeCommand(), python="python"
    )
    lines: list[str] = []
    tester = TrialRunner(options, session, None, lines.append, n_units=2)  # no actuator
    first = tester.measure(good, 2, Worker("w0"), threading.Event())
    assert first.samples == (10.0, 11.0) and first.worker == "w0"
    # Calibration took the trial; the search is to get it once more.
    tester.replay_as_good_endpoint("w0")
    pool = WorkerPool([Worker("w1"), Worker("w0")], tester.measure, factors={"w0": 2.0})
    (out,) = pool([(good, 2)])
    assert out.worker == "w0" and out.samples == (20.0, 22.0)
    assert pool.sticky[good] == "w0"
    assert sum("replayed from the session log" in line for line in lines) == 2


def test_a_good_state_killed_at_once_on_two_workers_is_said_not_a_traceback(
    tmp_path: Path,
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to pin two workers")
    sc = _scenario(tmp_path)
    probe = sc.tmp / "probe.py"
    # The good state (no ebonly) is killed before it reports anything, as the kernel's OOM
    # killer would; states with ebonly run.
    probe.write_text(
        "import importlib.util, os, signal\n"
        "if importlib.util.find_spec('ebonly') is None:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n" + PROBE
    )
    res, doc = _run(sc, "--workers", "2", session="s", smoke=("python", str(probe)))
    assert res.return_value == 1, res.output
    assert doc["outcome"] == "not-reproduced"
    assert "the good state fails here too (oom: killed by signal 9)" in res.output
    beside = [t for t in doc["trials"] if t["applied"] and t["samples"]]
    assert beside and {t["verdict"] for t in beside} == {"unresolved"}, res.output
