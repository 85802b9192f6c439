"""A culprit's crash-rate runs, several processes at once (``--rate-runs-at-once``, issue 31:
on the H100 the grown data's four rate runs took 180 s of a 410 s run, one after the other).
Real processes of a real command, CLI to JSON: each process of the batch gets its own copy of
the state's compile cache (a cold one stays cold for every one of them), the batch runs at
once, its crashes count towards the rate, and the user's cache is left as it was."""

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
from envbisect.model.errors import UsageError
from tests.helpers_run import cli_snapshot, manifest

pytestmark = pytest.mark.slow

# Threads compiling at once on an empty cache crash (the field's race); one thread (the
# user's own warm-up, EB_SERIAL) or a warm cache runs. Each run appends its start, end and
# whether the cache was warm to runs.log beside the script.
RACY = r"""
import json, os, time
start = time.time()
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
kernel = os.path.join(cache, "kernel.txt")
warm = os.path.exists(kernel)
acc = 0
for t in range(6_000_000 if not warm else 200_000):  # compiling, or only the steps
    acc = (acc + t * t) % 1000003
if not warm:
    with open(kernel, "w") as fh:
        fh.write(str(acc))


def log(what):
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "runs.log"), "a") as fh:
        fh.write(f"{what} {start} {time.time()}\n")


if not warm and not os.environ.get("EB_SERIAL"):
    log("cold")
    raise RuntimeError("Detected that you are using FX to symbolically trace a dynamo-optimized")
log("warm" if warm else "cold")
print("throughput: 5000 tok/s", flush=True)
"""


def _snapshot(tmp_path: Path, label: str) -> Path:
    out = tmp_path / f"{label}.yaml"
    return cli_snapshot(tmp_path / "envbisect.yaml", sys.executable, label, out)


def _world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """Good: a warm cache (its content kept by the snapshot); bad: the cache cleared and the
    field's harmless allocator setting."""
    script = tmp_path / "racy.py"
    script.write_text(RACY)
    cache = tmp_path / "inductor"
    cache.mkdir()
    (tmp_path / "envbisect.yaml").write_text(
        f"caches: {{inductor: {cache}}}\nmanifests_dir: {tmp_path / 'manifests'}\n"
        "keep_blobs: true\n"
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "EB_SERIAL": "1"}
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120)
    (tmp_path / "runs.log").unlink()
    good = _snapshot(tmp_path, "good")
    for f in cache.iterdir():  # the user clears the compile cache
        f.unlink()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    return script, good, _snapshot(tmp_path, "bad")


def _run(
    tmp_path: Path, script: Path, good: Path, bad: Path, *extra: str
) -> tuple[dict[str, Any], str]:
    out = tmp_path / "r.json"
    argv = [
        "run", "--config", str(tmp_path / "envbisect.yaml"), "--python", sys.executable,
        "--good", str(good), "--bad", str(bad), "--session", str(tmp_path / "session"),
        "--json", str(out), "--metric-regex", r"throughput: ([0-9.]+) tok/s", *extra,
        "--", sys.executable, str(script),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0, res.output
    assert "more runs at once for the culprit's crash rate" in res.stderr
    return json.loads(out.read_text()), res.stderr


def test_the_rate_runs_go_at_once_each_on_its_own_cold_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, good, bad = _world(tmp_path, monkeypatch)
    doc, said = _run(tmp_path, script, good, bad, "--rate-runs-at-once", "3")
    # The bad endpoint's estimate goes at once too.
    assert "crashed 1 of 1; 2 more runs at once to estimate its crash rate" in said
    (culprit,) = doc["culprits"]
    assert culprit["unit"] == "caches:inductor"
    assert culprit["crash"].startswith("crashed 5 of 5"), culprit["crash"]
    # Every run of the cold state found its cache cold, the three of the batch too: none
    # warmed another's (each had its own copy), and all of them crashed.
    runs = [line.split() for line in (tmp_path / "runs.log").read_text().splitlines()]
    cold = [(float(a), float(b)) for what, a, b in runs if what == "cold"]
    batch = sorted(cold)[-3:]  # the culprit's last three runs started together
    assert max(a for a, _ in batch) < min(b for _, b in batch)  # they overlapped
    session = tmp_path / "session" / "trials"
    assert not list(session.glob("*/together"))  # the copies are gone
    assert list((tmp_path / "inductor").iterdir()) == []  # the user's cache stays cleared


def test_rate_runs_at_once_and_workers_exclude_each_other(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text("workers: [{name: a}, {name: b}]\n")
    good = manifest(tmp_path / "good.yaml", env={})
    bad = manifest(tmp_path / "bad.yaml", env={"PYTORCH_CUDA_ALLOC_CONF": "x"})
    argv = [
        "run", "--config", str(tmp_path / "w.yaml"), "--good", str(good), "--bad", str(bad),
        "--rate-runs-at-once", "4", "--", sys.executable, "-c", "pass",
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False)
    assert isinstance(res.exception, UsageError)  # the CLI's one line and exit 2
    assert "--rate-runs-at-once runs several processes on the one target" in str(res.exception)
