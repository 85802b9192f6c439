"""Samples from inside the process: a real torch script on CPU that prints one figure at the
end (``throughput: N tok/s``), run once under the probe, gives a trial its samples from
the training steps the probe timed (``envbisect.model.steps``)."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from envbisect.cli import main
from envbisect.model.metric import MetricSpec
from envbisect.run.launch import RunLog, RunSpec, SmokeCommand, run_once
from envbisect.transport import Transport

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "probe" / "final_only.py"
FINAL = r"throughput: ([0-9.]+) tok/s"

pytestmark = pytest.mark.slow


def _run(
    tmp_path: Path,
    *args: str,
    samples: int = 3,
    step_fn: str | None = None,
    script: Path = SCRIPT,
    pin: tuple[str, ...] = (),
) -> RunLog:
    logs: list[RunLog] = []
    spec = RunSpec(
        transport=Transport(),
        python=sys.executable,
        env=None,
        cwd=None,
        timeout_s=300,
        log_dir=tmp_path / "logs",
        name="run-1",
        samples=samples,
        pin=pin,
    )
    smoke = SmokeCommand((sys.executable, str(script), *args), MetricSpec.parse(FINAL))
    if step_fn is not None:
        smoke = SmokeCommand(smoke.argv, smoke.metric, step_fn=step_fn)
    run_once(smoke, spec, record=logs.append)
    return logs[0]


def _printed(tmp_path: Path) -> float:
    text = (tmp_path / "logs" / "run-1.stdout").read_text()
    [figure] = re.findall(FINAL, text)  # the script prints one figure, at the end
    return float(figure)


def test_a_script_with_one_final_figure_gives_three_samples_from_one_process(
    tmp_path: Path,
) -> None:
    log = _run(tmp_path, "9")
    m = log.measurement
    # one process: the figure it printed is the reported one, its steps are the samples
    assert m.ok and m.tok_per_s == _printed(tmp_path)
    assert len(m.samples) >= 3
    # each kept step's sample: the figure times that step's rate over the kept steps'
    # median rate, so their median is the figure
    steps = json.loads((tmp_path / "logs" / "run-1.facts.json").read_text())["steps"]
    rates = [1 / t for t in steps["intervals_s"][2:]]
    mid = statistics.median(rates)
    assert m.samples == pytest.approx([m.tok_per_s * r / mid for r in rates], rel=1e-9)
    assert statistics.median(m.samples) == pytest.approx(m.tok_per_s)
    used = log.as_dict()["samples_from"]
    # 9 steps: 8 timed (step 1 has no start), the first third of those (2) left out
    assert used["steps_seen"] == 9 and used["steps_used"] == [4, 9]
    assert len(m.samples) == 6 and "optimizer" in used["rule"]
    part = log.as_dict()["breakdown"]
    assert part["steps_s"] > 0 and part["startup_s"] > 0
    # each part is rounded to the millisecond: three roundings
    assert part["startup_s"] + part["steps_s"] + part["after_s"] <= part["wall_s"] + 3e-3


def test_one_sample_asked_is_the_figure_alone(tmp_path: Path) -> None:
    log = _run(tmp_path, "6", samples=1)
    assert log.measurement.samples == (_printed(tmp_path),)
    assert "samples_from" not in log.as_dict()


def test_no_optimizer_no_steps_unless_the_step_function_is_named(tmp_path: Path) -> None:
    plain = _run(tmp_path / "a", "8", "--no-optimizer")
    assert plain.measurement.samples == (_printed(tmp_path / "a"),)
    for name in ("__main__:train_step", "final_only:train_step"):
        named = _run(tmp_path / name, "8", "--no-optimizer", step_fn=name)
        assert len(named.measurement.samples) == 5, name
        assert named.as_dict()["samples_from"]["rule"] == f"each return of {name} ends a step"


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--step-fn", "train_step"], "expected MODULE:QUALNAME"),
        (["--step-fn", "train:step", "--no-probe"], "drop --no-probe"),
    ],
)
def test_a_bad_step_function_is_one_line_and_exit_2(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["check", "--until-ktoks", "12k", *flags, "--", sys.executable, str(SCRIPT)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err


def test_the_probe_facts_name_the_traced_sources(tmp_path: Path) -> None:
    script = tmp_path / "compiled.py"
    script.write_text(
        "import torch\n"
        "opt_in = torch.nn.Linear(4, 4)\n"
        "opt = torch.optim.SGD(opt_in.parameters(), lr=0.1)\n"
        "def helper(x):\n    return x * 2\n"
        "@torch.compile(backend='eager')\n"
        "def f(x):\n    return helper(x).sin()\n"
        "for _ in range(4):\n    f(torch.ones(3)); opt.step()\n"
        "print('throughput: 10.0 tok/s')\n"
    )
    logs: list[RunLog] = []
    spec = RunSpec(Transport(), sys.executable, None, None, 300, tmp_path / "logs", "run-1")
    run_once(SmokeCommand((sys.executable, str(script)), MetricSpec.parse(FINAL)), spec,
             record=logs.append)  # fmt: skip
    facts = json.loads((tmp_path / "logs" / "run-1.facts.json").read_text())
    assert str(script) in facts["traced_sources"]
    # the compiled frame and the function inlined into it, by name
    assert [str(script), "f"] in facts["traced_code"]
    assert [str(script), "helper"] in facts["traced_code"]
    assert facts["steps"]["steps"] == 4


def test_steps_that_compiled_leave_the_figure_the_one_sample(tmp_path: Path) -> None:
    """New shapes recompiling in the timed steps (inductor, a fresh cache): the steps that
    compiled are the program's own cost, so the reported figure is the one sample and no
    second process is asked for it."""
    script = SCRIPT.with_name("recompile_late.py")
    logs: list[RunLog] = []
    env = {**__import__("os").environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    spec = RunSpec(
        Transport(), sys.executable, env, None, 600, tmp_path / "logs", "run-1", samples=3
    )
    run_once(SmokeCommand((sys.executable, str(script)), MetricSpec.parse(FINAL)), spec,
             record=logs.append)  # fmt: skip
    m = logs[0].measurement
    assert m.ok and m.samples == (_printed(tmp_path),)
    used = logs[0].as_dict()["samples_from"]
    assert used["from"] == "figure" and used["compiled_steps"], used
    assert set(used["compiled_steps"]) <= {7, 8, 9}  # the steps that met a new length
    assert "torch compiled during timed step(s)" in used["text"]
    assert m.result["compiled_in_windows"]["compile_s"] > 0


@pytest.mark.parametrize("step_fn", [None, "__main__:train_step"])
def test_a_threaded_script_warmed_up_in_its_main_thread_times_one_threads_steps(
    tmp_path: Path, step_fn: str | None
) -> None:
    """The H100's own threaded trainer: one optimizer stepped once in the main thread to
    warm up, then three threads with an optimizer each. The first optimizer to step was the
    warm-up's: one step seen, the figure alone as the sample (a trial needed 3 processes),
    and the threads' training counted as time after the last step."""
    log = _run(tmp_path, "9", step_fn=step_fn, script=SCRIPT.with_name("threads_warmup.py"))
    used = log.as_dict()["samples_from"]
    # the three threads' 27 steps, merged in time order, in windows of one step of each: 9
    # window ends, 8 timed, the first third (2) left out; not the warm-up's one step
    assert used["steps_seen"] == 9 and used["steps_used"] == [4, 9]
    assert used["steps_per_sample"] == 3 and len(log.measurement.samples) == 6
    who = "optimizers" if step_fn is None else "threads"
    assert used["rule"].startswith(f"3 {who} stepped together: a window of 3 steps")
    assert used["rule"].endswith("; 1 more stepped only before or after it")
    part = log.as_dict()["breakdown"]
    # the steps run from the warm-up's end to the last thread's last step: the threads'
    # training is in them, not after them
    assert part["steps_s"] > 9 * 0.01 and part["after_s"] < part["steps_s"]


def test_threads_taking_turns_give_samples_around_the_printed_figure(tmp_path: Path) -> None:
    """A user's threaded trainer (CPU, no data-loader wait): its threads take turns holding
    the GIL, so one thread's own steps are mostly fast with some long waits (read through
    their mean they once put the trial's median at 3.2x the figure the script printed).
    Windows of one step of each thread are the samples, their median the printed figure."""
    script = SCRIPT.with_name("threads_warmup.py")
    log = _run(tmp_path, "90", "--busy", samples=3, script=script)
    assert log.as_dict()["samples_from"]["steps_per_sample"] == 3
    median = statistics.median(log.measurement.samples)
    assert median == pytest.approx(_printed(tmp_path), rel=1e-9), (median, _printed(tmp_path))
