"""``run --profile`` end to end on CPU with real torch: a user's training script whose
culprit (an env var) swaps the fused attention op for bmm + softmax by hand; once the culprit
is named, its evidence is run under the profiler and the kernel diff names the ops, in the
terminal, the report and ``--json``, with the traces kept in the session."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.cli import cli
from tests.helpers_run import manifest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "probe" / "attn_train.py"
FUSED = "aten::_scaled_dot_product_flash_attention_for_cpu"
REGEX = r"loss [0-9.]+ \| ([0-9.]+) Ktok/s"


def test_run_profile_puts_the_culprits_kernel_diff_beside_it(tmp_path: Path) -> None:
    good = manifest(tmp_path / "good.yaml", env={})
    bad = manifest(tmp_path / "bad.yaml", env={"ATTN": "math", "EB_OTHER": "1"})
    (tmp_path / "envbisect.yaml").write_text("{}\n")
    doc_path, report = tmp_path / "r.json", tmp_path / "report.md"
    session = tmp_path / "session"
    argv = [
        "run", "--config", str(tmp_path / "envbisect.yaml"), "--python", sys.executable,
        "--good", str(good), "--bad", str(bad), "--until", "70%", "--repeats", "2",
        "--metric-regex", REGEX, "--warmup-lines", "2", "--profile",
        "--session", str(session), "--json", str(doc_path), "--report", str(report),
        "--", sys.executable, str(SCRIPT), "10",
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0, res.output
    doc = json.loads(doc_path.read_text())
    assert [c["unit"] for c in doc["culprits"]] == ["env:ATTN"]
    changes = {c["name"]: c for c in doc["kernels"]["changes"]}
    assert changes[FUSED]["change"] == "vanished"
    assert changes["aten::bmm"]["change"] == "appeared"
    assert changes["aten::bmm"]["bad_calls_per_step"] == 6
    assert changes["aten::_softmax"]["change"] == "appeared"
    # the traces are in the session, valid Chrome trace JSON, one per side
    traces = {side: Path(doc["kernels"][side]["trace"]) for side in ("good", "bad")}
    assert traces["good"] == (session / "profile" / "good" / "profile.trace.json").resolve()
    assert traces["bad"] == (session / "profile" / "culprit" / "profile.trace.json").resolve()
    for side, trace in traces.items():
        names = {e["name"] for e in json.loads(trace.read_text())["traceEvents"]}
        assert (FUSED in names) is (side == "good"), side
    # the terminal and the report show the top lines and both traces' paths
    lines = res.output.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("kernels, good → culprit"))
    top = lines[head + 1 : head + 11]
    assert any(f"vanished    {FUSED} (op)" in line for line in top), top
    assert any("appeared    aten::bmm (op)" in line for line in top), top
    assert f"  traces: good {traces['good']}" in lines
    md = report.read_text()
    assert "### Kernels and ops, good vs culprit (torch.profiler)" in md
    assert f"culprit {traces['bad']}" in md and "appeared    aten::bmm (op)" in md


def test_run_profile_refuses_the_built_in_smoke_test(tmp_path: Path) -> None:
    good = manifest(tmp_path / "good.yaml", env={})
    bad = manifest(tmp_path / "bad.yaml", env={"EB_A": "1"})
    (tmp_path / "envbisect.yaml").write_text("{}\n")
    argv = [
        "run", "--config", str(tmp_path / "envbisect.yaml"), "--python", sys.executable,
        "--good", str(good), "--bad", str(bad), "--profile",
        "--session", str(tmp_path / "session"),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False)
    assert res.exception is not None and getattr(res.exception, "exit_code", None) == 2
    assert "--profile needs your own Python command under the probe" in str(res.exception)
