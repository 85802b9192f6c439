"""The probe ends a trial's process once the program is done (issue 32): its main body, its
non-daemon threads, its output and the facts; the program's atexit handlers and the
interpreter's teardown are skipped (torch's compile worker pool took 9.4 s of a 22 s run on
the H100). ``--full-exit`` keeps the program's own exit."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from envbisect.model.metric import MetricSpec
from envbisect.run.launch import QUICK_NOTE, RunLog, RunSpec, SmokeCommand, run_once
from envbisect.transport import Transport

FIGURE = r"throughput: ([0-9.]+) tok/s"

PROGRAM = """\
import atexit, sys, threading, time
from pathlib import Path

marker = Path(sys.argv[1])
atexit.register(lambda: marker.write_text("atexit ran"))
if "--figure-at-exit" in sys.argv:
    atexit.register(lambda: print("throughput: 7.5 tok/s", flush=True))


def late():
    time.sleep(0.3)  # the main body is done before this thread is
    print("thread finished", flush=True)


threading.Thread(target=late).start()
if "--figure-at-exit" not in sys.argv:
    sys.stdout.write("throughput: 12.5 tok/s\\n")  # buffered: the probe flushes it
if "--exit-3" in sys.argv:
    sys.exit(3)
"""


def _run(tmp_path: Path, *args: str, full_exit: bool = False, regex: str | None = FIGURE) -> RunLog:
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    logs: list[RunLog] = []
    spec = RunSpec(Transport(), sys.executable, None, None, 120, tmp_path / "logs", "run-1")
    argv = (sys.executable, str(script), str(tmp_path / "marker"), *args)
    metric = MetricSpec.parse(regex) if regex else None
    smoke = SmokeCommand(argv, metric, full_exit=full_exit)
    run_once(smoke, spec, record=logs.append)
    return logs[0]


def _facts(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "logs" / "run-1.facts.json").read_text())


def test_the_probe_ends_the_process_after_the_program_and_its_threads(tmp_path: Path) -> None:
    log = _run(tmp_path)
    assert log.measurement.ok and log.measurement.tok_per_s == 12.5
    out = (tmp_path / "logs" / "run-1.stdout").read_text()
    assert "thread finished" in out  # the program's thread ran to its end first
    assert not (tmp_path / "marker").exists()  # its atexit handler never ran
    assert _facts(tmp_path)["quick_exit"] is True
    assert log.as_dict()["breakdown"]["quick_exit"] is True


def test_full_exit_runs_the_programs_own_exit(tmp_path: Path) -> None:
    log = _run(tmp_path, full_exit=True)
    assert log.measurement.ok and log.measurement.tok_per_s == 12.5
    assert (tmp_path / "marker").read_text() == "atexit ran"
    assert "quick_exit" not in _facts(tmp_path)


def test_the_programs_exit_status_is_kept(tmp_path: Path) -> None:
    log = _run(tmp_path, "--exit-3")
    assert log.launch.exit_status == 3
    assert _facts(tmp_path)["exit_code"] == 3 and _facts(tmp_path)["quick_exit"] is True


def test_a_figure_printed_at_exit_is_missed_and_the_failure_says_full_exit(
    tmp_path: Path,
) -> None:
    quick = _run(tmp_path / "quick", "--figure-at-exit")
    assert not quick.measurement.ok
    assert str(quick.measurement.failure).startswith("no metric")
    assert QUICK_NOTE in str(quick.measurement.failure) and "--full-exit" in QUICK_NOTE
    full = _run(tmp_path / "full", "--figure-at-exit", full_exit=True)
    assert full.measurement.ok and full.measurement.tok_per_s == 7.5


def test_a_figure_printed_but_not_asked_for_is_read_not_the_exit_note(tmp_path: Path) -> None:
    """Found as a user: a script printing ``throughput: 7.2 Ktok/s`` run without
    --metric-regex was told that "a figure written at exit needs --full-exit"; its figure
    was printed, just never asked for. A token rate is now read with no regex at all
    (``model.logforms``), and the run says so."""
    log = _run(tmp_path, regex=None)
    assert log.measurement.ok and log.measurement.tok_per_s == 12.5, log.measurement.failure
    said = log.measurement.result["metric_from"]
    assert said["form"] == "a token rate" and said["unit"] == "tok/s"
    assert "throughput: 12.5 tok/s" in said["line"]


@pytest.mark.slow
def test_a_compile_cache_written_before_a_quick_exit_is_warm_for_the_next_run(
    tmp_path: Path,
) -> None:
    """What trials share (one warm compile cache per compiled code) is written while the
    program compiles, not at its exit: the second run, quick exit too, hits the first's."""
    script = tmp_path / "compiled.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(8, 8)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "@torch.compile\n"
        "def step(x):\n    return model(x).relu().sum()\n"
        "for _ in range(3):\n"
        "    step(torch.ones(4, 8)).backward(); opt.step(); opt.zero_grad()\n"
        "print('throughput: 10.0 tok/s')\n"
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    hits = []
    for name in ("run-1", "run-2"):
        spec = RunSpec(Transport(), sys.executable, env, None, 300, tmp_path / "logs", name)
        m = run_once(SmokeCommand((sys.executable, str(script)), MetricSpec.parse(FIGURE)), spec)
        assert m.ok, m.failure
        facts = json.loads((tmp_path / "logs" / f"{name}.facts.json").read_text())
        assert facts["quick_exit"] is True
        hits.append(facts["compile"]["fxgraph_cache_hit"])
    assert hits[0] == 0 and hits[1] > 0, hits
