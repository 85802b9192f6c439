"""``run`` with a user's own training script: a sample per logged step from one process
(``--metric-regex``, ``--warmup-lines``), and the probe's facts explaining the culprit."""

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

# A user-style log: a throughput per step; EB_SLOW makes every step 3× slower. The first
# two steps are slow in every state (a warm-up).
STEPS = """
import os, sys
steps = int(sys.argv[1])
rate = 60.0 if os.environ.get("EB_SLOW") else 180.0
for i in range(steps):
    r = rate / 10 if i < 2 else rate * (1 + 0.002 * i)
    print(f"step {i} | loss 2.31 | {r:.1f} Ktok/s", flush=True)
    print(f"config noise line {i}: 999.0 Ktok/s is not a step", file=sys.stderr)
"""

REGEX = r"loss [0-9.]+ \| ([0-9.]+) Ktok/s"


def _run(tmp_path: Path, cmd: list[str], *extra: str, until: str) -> tuple[Any, dict[str, Any]]:
    good = manifest(tmp_path / "good.yaml", env={})
    bad = manifest(tmp_path / "bad.yaml", env={"EB_A": "1", "EB_B": "1", "EB_SLOW": "1"})
    (tmp_path / "envbisect.yaml").write_text("{}\n")
    out = tmp_path / "r.json"
    argv = [
        "run", "--config", str(tmp_path / "envbisect.yaml"), "--python", sys.executable,
        "--good", str(good), "--bad", str(bad), "--until", until,
        "--session", str(tmp_path / "session"), "--json", str(out), *extra,
        "--", sys.executable, *cmd,
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    return res, json.loads(out.read_text())


def _processes(tmp_path: Path) -> dict[str, int]:
    trials = sorted((tmp_path / "session" / "trials").iterdir())
    return {t.name: len(list(t.glob("run-*.stdout"))) for t in trials}


def test_a_sample_per_logged_step_from_one_process(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(STEPS)
    res, doc = _run(
        tmp_path, [str(script), "12"], "--metric-regex", REGEX, "--warmup-lines", "2",
        "--repeats", "3", until="70%",
    )  # fmt: skip
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    runs = _processes(tmp_path)
    trials = sorted(runs)
    # every trial one start, the endpoints too (3× apart: no second good process)
    assert all(runs[t] == 1 for t in trials), runs
    # 12 logged steps, the first 2 dropped: 10 samples per process, none from stderr noise
    middle = [t for t in doc["trials"] if t["purpose"] and "endpoint" not in t["purpose"]]
    assert middle and all(len(t["samples"]) == 10 for t in middle)
    assert all(max(t["samples"]) < 200_000 for t in doc["trials"])  # tok/s


def test_default_warmup_drops_the_first_third(tmp_path: Path) -> None:
    from envbisect.model.metric import MetricSpec, measure

    spec = MetricSpec.parse(REGEX)
    log = "".join(f"step {i} | loss 2.0 | {100 + i}.0 Ktok/s\n" for i in range(9)).encode()
    m = measure(stdout=log, stderr=b"", returncode=0, timed_out=False, spec=spec)
    assert m.samples == tuple(float(1000 * (100 + i)) for i in range(3, 9))
    assert m.tok_per_s == 1000 * 106.0 - 500  # the median of the six
    one = measure(stdout=log[:33], stderr=b"", returncode=0, timed_out=False, spec=spec)
    assert one.samples == (100_000.0,)


# The culprit stops compiling the step: the probe sees it in the bad trial, not the good.
COMPILED = """
import os, sys, time
import torch

def step_fn(x):
    return (x * 2).sum()

step = step_fn if os.environ.get("EB_SLOW") else torch.compile(step_fn, backend="eager")
work = 40000 if os.environ.get("EB_SLOW") else 4000
for i in range(6):
    t = time.perf_counter()
    step(torch.ones(4))
    acc = 0
    for j in range(work):
        acc += j
    print(f"step {i} | loss 2.31 | {4.0 / (time.perf_counter() - t):.1f} Ktok/s", flush=True)
"""


def test_the_probe_explains_the_culprit_good_vs_bad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    script = tmp_path / "train.py"
    script.write_text(COMPILED)
    res, doc = _run(tmp_path, [str(script)], "--metric-regex", REGEX, "--repeats", "3", until="40%")
    assert res.return_value == 0, res.output
    [culprit] = doc["culprits"]
    assert culprit["unit"] == "env:EB_SLOW"
    assert "bad: 0 compiled frames (good: 1)" in culprit["why"]
    assert "bad: 0 threads called compiled code (good: 1)" in culprit["why"]
    assert "  bad: 0 compiled frames (good: 1)" in res.output  # under the culprit line
    by_index = {t["index"]: t for t in doc["trials"]}
    good = by_index[culprit["evidence"]["good_trial"]]["facts"]
    bad = by_index[culprit["evidence"]["bad_trial"]]["facts"]
    assert good["compile"]["frames_compiled"] == 1 and bad["compile"]["frames_compiled"] == 0
    assert good["torch"] == bad["torch"] and good["torch"].startswith("2.")
    # the trial log shows the command as typed, and that it ran under the probe
    first = json.loads((tmp_path / "session" / "trials" / "001" / "trial.json").read_text())
    run = first["calls"][0]["runs"][0]
    assert run["argv"] == [sys.executable, str(script)]
    assert run["probe"] == "ran under the probe; facts in run-1.facts.json"


def test_no_probe_runs_the_command_as_typed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(STEPS)
    res, doc = _run(
        tmp_path, [str(script), "9"], "--metric-regex", REGEX, "--no-probe", until="70%"
    )
    assert res.return_value == 0, res.output
    assert all(t["facts"] is None for t in doc["trials"])
    assert not list((tmp_path / "session").rglob("*.facts.json"))
    log = json.loads((tmp_path / "session" / "trials" / "001" / "trial.json").read_text())
    run = log["calls"][0]["runs"][0]
    assert run["argv"] == [sys.executable, str(script), "9"] and "probe" not in run
