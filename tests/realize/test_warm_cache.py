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


def _snapshot(tmp_path: Path, label: str, *extra: str) -> tuple[Any, Path]:
    out = tmp_path / f"{label}.yaml"
    argv = [
        "snapshot", "--config", str(tmp_path / "envbisect.yaml"), "--python", sys.executable,
        "--label", label, "-o", str(out), *extra,
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    return res, out


def _kept_world(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A real warm cache (made by a cold run of the workload), snapshotted with its content
    kept; then the cache cleared and the bad state snapshotted."""
    import os
    import subprocess

    script = tmp_path / "cached.py"
    script.write_text(CACHED)
    cache = tmp_path / "inductor"
    cache.mkdir()
    (tmp_path / "envbisect.yaml").write_text(
        f"caches: {{inductor: {cache}}}\nmanifests_dir: {tmp_path / 'manifests'}\n"
        "keep_blobs: true\n"
    )
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "ENVBISECT_RESULT": str(tmp_path / "warmup.json"),
    }
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120)
    (tmp_path / "runs.log").unlink()
    res, good = _snapshot(tmp_path, "good")
    assert res.return_value == 0, res.output
    assert "inductor 1 files (content kept, " in res.stderr
    for f in cache.iterdir():  # the user clears the compile cache
        f.unlink()
    res, bad = _snapshot(tmp_path, "bad")
    assert res.return_value == 0, res.output
    return script, good, bad


def test_a_cleared_cache_whose_content_the_snapshot_kept_is_rebuilt_without_a_run(
    tmp_path: Path,
) -> None:
    script, good, bad = _kept_world(tmp_path)
    res, doc = _run(tmp_path, script, good, bad)
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["caches:inductor"]
    # No state was made warm by a run: the kept content was put back, and every run of a
    # warm state found it (runs.log: one line per run of the workload).
    trials = sorted((tmp_path / "session" / "trials").iterdir())
    assert not [t for t in trials if (t / "fill.stdout").exists()]
    log = (tmp_path / "session" / "log.jsonl").read_text()
    assert "caches inductor: made from the content the snapshot kept (1 files)" in log
    runs = (tmp_path / "runs.log").read_text().split()
    warm_runs = sum(
        len(list(t.glob("run-*.result.json")))
        for t in trials
        if "caches:inductor" not in json.loads((t / "trial.json").read_text())["applied"]
    )
    assert warm_runs and runs.count("warm") == warm_runs
    assert list((tmp_path / "inductor").iterdir()) == []  # the user's cache stays cleared


def test_a_cache_over_the_cap_is_not_kept_and_the_snapshot_says_how_to_raise_it(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "inductor"
    cache.mkdir()
    (cache / "kernel.bin").write_bytes(b"x" * 3000)
    (tmp_path / "envbisect.yaml").write_text(
        f"caches: {{inductor: {cache}}}\nmanifests_dir: {tmp_path / 'manifests'}\n"
    )
    res, out = _snapshot(tmp_path, "good", "--keep-caches", "2KiB")
    assert res.return_value == 0, res.output
    assert "over the 2.0 KiB cap for kept caches; not kept" in res.stderr
    assert "--keep-caches 1MiB" in res.stderr
    import yaml

    recorded = yaml.safe_load(out.read_text())
    assert recorded["caches"]["inductor"]["files"] == 1
    assert "kept" not in recorded["caches"]["inductor"]
    assert not (tmp_path / "manifests" / "blobs").exists()
    res = CliRunner().invoke(
        cli, ["snapshot", "--config", str(tmp_path / "envbisect.yaml"), "--keep-caches", "lots"]
    )
    assert res.exit_code == 2
    assert "--keep-caches: 'lots' is not a size (512MiB, 2GiB) or 'off'" in res.output
