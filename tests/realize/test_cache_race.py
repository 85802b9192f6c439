"""The field's race on a cleared cache, on CPU with real torch (2.13: one process-wide FX
flag): a user's threaded training script whose empty-cache run traces a graph in one thread
while another enters its compiled step, which raises torch's "Detected that you are using FX
to symbolically trace a dynamo-optimized function". The good state's warm cache is gone and
its content was not kept: the run that makes it again must not race (the probe keeps the
compiles one thread at a time), and the empty cache is then named with its crash rate."""

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
from tests.helpers_run import manifest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "race" / "threaded_train.py"
REGEX = r"throughput: ([0-9.]+) Ktok/s"
FX_ERROR = "Detected that you are using FX to symbolically trace a dynamo-optimized function"


def _world(tmp_path: Path) -> tuple[Path, Path, Path]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.read_text())
    cache = tmp_path / "inductor"
    cache.mkdir()  # cleared: the good state's warm files are gone, their content not kept
    warm = {"path": str(cache), "exists": True, "files": 1, "bytes": 2}
    cold = {"path": str(cache), "exists": True, "files": 0, "bytes": 0}
    good = manifest(tmp_path / "good.yaml", caches={"inductor": warm}, env={})
    bad = manifest(tmp_path / "bad.yaml", caches={"inductor": cold}, env={"EB_HARMLESS": "1"})
    (tmp_path / "envbisect.yaml").write_text(f"caches: {{inductor: {cache}}}\n")
    return script, good, bad


def test_the_race_happens_on_an_empty_cache_only(tmp_path: Path) -> None:
    """The workload itself, run bare: cold crashes with the field's error, warm runs."""
    script, _good, _bad = _world(tmp_path)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    cold = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert cold.returncode != 0 and FX_ERROR in cold.stderr
    warm = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert warm.returncode == 0 and "throughput:" in warm.stdout


def _run(tmp_path: Path, script: Path, good: Path, bad: Path) -> tuple[Any, dict[str, Any]]:
    out = tmp_path / "r.json"
    argv = [
        "run", "--config", str(tmp_path / "envbisect.yaml"), "--python", sys.executable,
        "--good", str(good), "--bad", str(bad), "--session", str(tmp_path / "session"),
        "--json", str(out), "--metric-regex", REGEX, "--until", "70%",
        "--", sys.executable, str(script),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    return res, json.loads(out.read_text()) if out.exists() else {}


def test_the_warm_cache_is_made_without_the_race_and_the_empty_cache_named_by_its_crash_rate(
    tmp_path: Path,
) -> None:
    script, good, bad = _world(tmp_path)
    res, doc = _run(tmp_path, script, good, bad)
    assert res.return_value == 0, res.output
    assert "the good state fails here too" not in res.output + res.stderr
    [culprit] = doc["culprits"]
    assert culprit["unit"] == "caches:inductor"
    # The filling run kept the compiles apart and did not crash; the good state ran warm.
    assert "its compiles one thread at a time" in res.stderr
    fills = sorted((tmp_path / "session" / "trials").glob("*/fill.stdout"))
    assert fills
    for fill in fills:
        facts = json.loads(fill.with_name("fill.facts.json").read_text())
        assert facts["serialized"]["compiles"] is True and facts["crash"] is None
    # The empty cache crashes every run: the culprit is said with its rate and the error.
    trials = {t["index"]: t for t in doc["trials"]}
    crashed = [t for t in trials.values() if "caches:inductor" in t["applied"]]
    assert crashed and all(t["crashes"] == t["runs"] >= 1 for t in crashed)
    assert culprit["crash"].startswith("crashed 5 of 5 (good: 0 of ")
    assert FX_ERROR in culprit["crash"]
    line = next(x for x in res.output.splitlines() if x.startswith("Culprit:"))
    assert "cache inductor" in line and "crashed 5 of 5" in line and FX_ERROR in line
    # The probe's facts say why: another thread's FX trace was in flight.
    assert any("FX tracing flag of another thread's trace" in w for w in culprit["why"])
    assert list((tmp_path / "inductor").iterdir()) == []  # the user's cache stays cleared
