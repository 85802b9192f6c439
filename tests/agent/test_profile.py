"""The probe's profiler inside a real training loop: real torch on CPU, the fixture
``attn_train.py`` under the probe with a profile asked for; a culprit that changes the
attention path (bmm + softmax by hand → the fused scaled_dot_product_attention op) named by
the kernel diff, from facts and traces the runs left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from envbisect.cli import cli
from envbisect.model.kernels import Change, ProfileRequest, ProfileTable, diff
from envbisect.run.probed import probe_command
from envbisect.transport import Transport

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "probe"
PY = sys.executable
FUSED = "aten::_scaled_dot_product_flash_attention_for_cpu"

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, attn: str, *args: str, profile: ProfileRequest | None = None) -> Any:
    os.environ["ATTN"] = attn  # the autouse fixture restores the environment
    return probe_command(
        [PY, str(FIXTURES / "attn_train.py"), *args],
        transport=Transport(),
        python=PY,
        timeout_s=300,
        log_dir=tmp_path / attn,
        profile=profile,
    )


@pytest.fixture(autouse=True)
def _attn_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTN", "math")


def _names(d: Any, *changes: Change) -> set[str]:
    return {c.name for c in d.notable if c.change in changes}


def test_a_culprit_that_changes_the_attention_path_is_named_by_the_kernel_diff(
    tmp_path: Path,
) -> None:
    good = _run(tmp_path, "math", "8", profile=ProfileRequest(3, 3))
    bad = _run(tmp_path, "sdpa", "8", profile=ProfileRequest(3, 3))
    assert good.exit_status == 0 and bad.exit_status == 0
    d = diff(ProfileTable.from_facts(good.facts), ProfileTable.from_facts(bad.facts))
    # the fused op (forward and backward) came with the culprit; bmm and softmax went
    appeared = _names(d, Change.APPEARED)
    assert {FUSED, FUSED + "_backward"} <= appeared
    assert {"aten::bmm", "aten::_softmax", "aten::_softmax_backward_data"} <= _names(
        d, Change.VANISHED
    )
    assert not appeared & {"aten::bmm", "aten::_softmax"}
    fused = next(c for c in d.changes if c.name == FUSED)
    assert fused.good_calls == 0 and fused.bad_calls == 1 and fused.bad_us > 0
    assert fused.share == pytest.approx(fused.bad_us / max(d.good.step_us, d.bad.step_us))
    # both traces are valid Chrome trace JSON, and the fused op is in the culprit's alone
    for run, has_fused in ((good, False), (bad, True)):
        trace = Path(run.facts["profile"]["trace"])
        assert trace.parent == run.log_dir.resolve()
        events = json.loads(trace.read_text())["traceEvents"]
        ops = {e["name"] for e in events if e.get("ph") == "X"}
        assert (FUSED in ops) is has_fused and ("aten::bmm" in ops) is not has_fused
        assert all(isinstance(e.get("ts", 0), (int, float)) for e in events)
    # the same from the command line: the two facts files, text and JSON
    files = [str(r.log_dir / "probe.facts.json") for r in (good, bad)]
    res = CliRunner().invoke(cli, ["profile-diff", *files], standalone_mode=False)
    assert res.exception is None and res.return_value == 0, res.output
    assert any(
        line.strip().startswith(f"appeared    {FUSED} (op)") for line in res.output.splitlines()
    )
    assert f"culprit {bad.facts['profile']['trace']}" in res.output
    res = CliRunner().invoke(
        cli, ["profile-diff", "--format", "json", *files], standalone_mode=False
    )
    changes = {c["name"]: c for c in json.loads(res.output)["changes"]}
    assert changes["aten::bmm"]["change"] == "vanished"
    assert changes["aten::bmm"]["good_calls_per_step"] == 6  # 2 forward, 4 backward
    assert changes[FUSED]["change"] == "appeared"


def test_the_window_holds_the_steps_after_warm_up(tmp_path: Path) -> None:
    run = _run(tmp_path, "math", "9", profile=ProfileRequest(steps=4, skip=2))
    prof = run.facts["profile"]
    assert (prof["steps"], prof["skip"], prof["optimizer_steps"]) == (4, 2, 9)
    assert prof["stopped"] == "after step 6" and prof["device"] == "cpu"
    rows = {r["name"]: r for r in prof["rows"]}
    # two Linear layers forward per step: 4 steps, 8 addmm; one softmax per step
    assert rows["aten::addmm"]["count"] == 8 and rows["aten::_softmax"]["count"] == 4
    assert rows["Optimizer.step#SGD.step"]["kind"] == "annotation"
    assert prof["step_us"] == pytest.approx(prof["window_s"] * 1e6 / 4, rel=1e-3)


def test_a_program_that_ends_early_is_stopped_at_exit_and_one_without_steps_says_so(
    tmp_path: Path,
) -> None:
    early = _run(tmp_path / "e", "math", "4", profile=ProfileRequest(steps=3, skip=3))
    prof = early.facts["profile"]
    assert (prof["steps"], prof["stopped"]) == (1, "at exit")
    assert {r["name"]: r for r in prof["rows"]}["aten::addmm"]["count"] == 2
    runner = CliRunner()
    args = ["probe", "--profile", "--python", PY, "--log-dir", str(tmp_path / "n")]
    script = str(FIXTURES / "attn_train.py")
    res = runner.invoke(cli, [*args, "--", PY, script, "3", "--no-opt"], standalone_mode=False)
    assert res.exception is None and res.return_value == 0, res.output
    assert "profile: no optimizer step seen: nothing profiled" in res.output
    assert not (tmp_path / "n" / "probe.trace.json").exists()


def test_probe_profile_prints_the_table_and_unasked_runs_are_untouched(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["probe", "--profile", "--profile-steps", "2", "--python", PY]
    script = str(FIXTURES / "attn_train.py")
    res = runner.invoke(
        cli, [*args, "--log-dir", str(tmp_path / "p"), "--", PY, script, "6"], standalone_mode=False
    )
    assert res.exception is None and res.return_value == 0, res.output
    lines = res.output.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("profiled 2 steps (cpu"))
    assert lines[head + 1].split() == [
        "op",
        "/",
        "kernel",
        "kind",
        "calls/step",
        "self/step",
        "of",
        "step",
    ]
    trace = tmp_path / "p" / "probe.trace.json"
    assert f"trace (Chrome trace, opens in Perfetto): {trace.resolve()}" in lines
    assert json.loads(trace.read_text())["traceEvents"]
    plain = _run(tmp_path / "plain", "math", "6")
    assert "profile" not in plain.facts
    assert not list((tmp_path / "plain").rglob("*.trace.json"))


def test_profile_diff_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    unprofiled = tmp_path / "plain.json"
    unprofiled.write_text(json.dumps({"schema": "envbisect/facts@1", "torch": "2.13"}))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    for a, b, said in (
        (tmp_path / "missing.json", unprofiled, "missing.json: cannot be read"),
        (broken, unprofiled, "broken.json: not JSON"),
        (unprofiled, unprofiled, "plain.json: no profile in the facts"),
    ):
        proc = subprocess.run(
            [PY, "-m", "envbisect", "profile-diff", str(a), str(b)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr


def test_through_a_layer_the_table_comes_back_in_the_frame_and_the_trace_stays_there(
    tmp_path: Path,
) -> None:
    from envbisect.transport import parse_layer

    layered = Transport((parse_layer("env ENVBISECT_TEST_LAYER=1"),))
    run = probe_command(
        [PY, str(FIXTURES / "attn_train.py"), "7"],
        transport=layered,
        python=PY,
        timeout_s=300,
        log_dir=tmp_path / "logs",
        profile=ProfileRequest(steps=2, skip=2),
    )
    prof = run.facts["profile"]
    trace = Path(prof["trace"])
    try:
        # the target's temporary directory, not the log directory here
        assert trace.parent == Path("/tmp") and trace.name.startswith("envbisect-probe-")
        assert json.loads(trace.read_text())["traceEvents"]
        assert (prof["steps"], prof["stopped"]) == (2, "after step 4")
        kept = json.loads((tmp_path / "logs" / "probe.facts.json").read_text())
        assert ProfileTable.from_facts(kept).steps == 2
    finally:
        trace.unlink(missing_ok=True)
