"""A warm compile cache whose content is gone is made again by running the state once; the
cache unit is then bisected like any other (real runs of a real command, CLI to report)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from envbisect.cli import cli
from tests.helpers_run import manifest

pytestmark = pytest.mark.slow

# A workload with a compile cache: a cold run compiles its "kernel" (real arithmetic, in
# the timed window, then stored in the cache), a warm run loads it. Each run appends what
# it found to runs.log beside the script, so the test can see which runs were warm.
CACHED = r"""
import json, os, time
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
kernel = os.path.join(cache, "kernel.txt")
n = int(os.environ.get("ENVBISECT_SAMPLES", "1"))
warm = os.path.exists(kernel)
acc, tokens = 0, 4000
start = time.perf_counter()
if not warm:
    for t in range(tokens * 320):  # the compile: 8 times the work of the steps
        acc = (acc + t * t) % 1000003
    with open(kernel, "w") as fh:
        fh.write(str(acc))
for t in range(tokens * 40):  # the steps
    acc = (acc + t) % 1000003
rate = tokens / (time.perf_counter() - start)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs.log"), "a") as fh:
    fh.write(("warm" if warm else "cold") + "\n")
with open(os.environ["ENVBISECT_RESULT"], "w") as fh:
    json.dump({"ok": True, "tok_per_s": rate, "samples": [rate] * n}, fh)
"""


def _world(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Good: a warm inductor cache, since cleared; bad: that cache empty, plus a harmless
    env change."""
    script = tmp_path / "cached.py"
    script.write_text(CACHED)
    cache = tmp_path / "inductor"
    cache.mkdir()  # cleared: the good state's files are gone
    warm = {"path": str(cache), "exists": True, "files": 3, "bytes": 300}
    cold = {"path": str(cache), "exists": True, "files": 0, "bytes": 0}
    good = manifest(tmp_path / "good.yaml", caches={"inductor": warm}, env={})
    bad = manifest(tmp_path / "bad.yaml", caches={"inductor": cold}, env={"EB_HARMLESS": "1"})
    # The user's own config names the cache: a run touches only what it names.
    (tmp_path / "envbisect.yaml").write_text(f"caches: {{inductor: {cache}}}\n")
    return script, good, bad


def _run(tmp_path: Path, script: Path, good: Path, bad: Path) -> tuple[Any, dict[str, Any]]:
    out = tmp_path / "r.json"
    argv = [
        "run", "--config", str(tmp_path / "envbisect.yaml"), "--python", sys.executable,
        "--good", str(good), "--bad", str(bad), "--session", str(tmp_path / "session"),
        "--json", str(out), "--report", str(tmp_path / "report.md"),
        "--", sys.executable, str(script),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    return res, json.loads(out.read_text()) if out.exists() else {}


def test_a_cleared_warm_cache_is_made_by_a_run_and_bisected(tmp_path: Path) -> None:
    script, good, bad = _world(tmp_path)
    res, doc = _run(tmp_path, script, good, bad)
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["caches:inductor"]
    assert "caches:inductor" not in doc["not_bisected"]
    note = "the recorded warm cache is gone; warm made by one run of this state's command"
    assert note in res.stderr
    assert any(note in n for n in doc["notes"]) and note in (tmp_path / "report.md").read_text()
    # Every warm state's trial began with one filling run, then measured warm; every run
    # of a cold state found the cache empty (the endpoints' second process too).
    trials = sorted((tmp_path / "session" / "trials").iterdir())
    fills = [t for t in trials if (t / "fill.stdout").exists()]
    assert fills and all(not (t / "fill.stdout").exists() for t in trials[1:2])
    runs = (tmp_path / "runs.log").read_text().split()

    def measured(ts: list[Path]) -> int:
        return sum(len(list(t.glob("run-*.result.json"))) for t in ts)

    cold_trials = [t for t in trials if t not in fills]
    assert runs.count("warm") == measured(fills)
    assert runs.count("cold") == len(fills) + measured(cold_trials)
    # Every run recorded the machine's contention while it ran; flagged samples are counted.
    for t in trials:
        for call in json.loads((t / "trial.json").read_text())["calls"]:
            for run in call["runs"]:
                assert {"others_cores", "load1", "contended", "cores"} <= set(run["contention"])
    assert all("contended_samples" in t for t in doc["trials"])
    # The user's cleared cache stays as it is.
    assert list((tmp_path / "inductor").iterdir()) == []


# A workload that keeps no compile cache: its speed is set by EB_SLOW alone.
UNCACHED = r"""
import json, os
n = int(os.environ.get("ENVBISECT_SAMPLES", "1"))
rate = 300.0 if os.environ.get("EB_SLOW") else 1000.0
with open(os.environ["ENVBISECT_RESULT"], "w") as fh:
    samples = [rate * (1 + 0.01 * k) for k in range(n)]
    json.dump({"ok": True, "tok_per_s": rate, "samples": samples}, fh)
"""


def test_a_command_that_writes_no_cache_is_filled_once(tmp_path: Path) -> None:
    script, good, _bad = _world(tmp_path)
    script.write_text(UNCACHED)
    cold = {"path": str(tmp_path / "inductor"), "exists": True, "files": 0, "bytes": 0}
    bad = manifest(tmp_path / "bad.yaml", caches={"inductor": cold}, env={"EB_SLOW": "1"})
    res, doc = _run(tmp_path, script, good, bad)
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    trials = sorted((tmp_path / "session" / "trials").iterdir())
    assert len([t for t in trials if (t / "fill.stdout").exists()]) == 1
    assert "later states skip that run" in res.stderr
    assert "warm is the empty dir (the command writes none)" in res.stderr
