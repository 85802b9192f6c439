"""Issue 47: the machine's speed drops between trials (other users' jobs start once the
culprit is isolated): the run makes no claim the load made. Before saying that "other
changes slow it down too", it measures the good state and everything but the culprit again,
back to back, and says what the pair shows. Real processes throughout: the load is busy
loops started by the test, the workload a CPU loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers_run import manifest

pytestmark = pytest.mark.slow

WORK = """
import os, time
work = 8 if os.environ.get("EB_SLOW") else 1
tokens = 3000
acc = 0
start = time.perf_counter()
for t in range(tokens):
    for i in range(60 * work):
        acc = (acc + i * t) % 1000003
print('ENVBISECT_RESULT {"tok_per_s": %.1f}' % (tokens / (time.perf_counter() - start)))
"""


def _trials_measured(log: Path) -> int:
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if json.loads(line).get("type") == "trial")


def test_a_load_started_between_trials_makes_no_claim_of_other_slowdowns(
    tmp_path: Path,
) -> None:
    (tmp_path / "w.py").write_text(WORK)
    manifest(tmp_path / "good.yaml", env={})
    # The culprit sorts first: isolation measures it alone before the load starts.
    manifest(tmp_path / "bad.yaml", env={"EB_SLOW": "1", "EB_ZZ_INNOCENT": "1"})
    cmd = [
        sys.executable, "-m", "envbisect", "run", "--good", "good.yaml", "--bad", "bad.yaml",
        "--until", "60%", "--session", "s", "--json", "r.json", "--cpu-threads", "off",
        "--", sys.executable, "w.py",
    ]  # fmt: skip
    run = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)  # fmt: skip
    loads: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + 240
        while _trials_measured(tmp_path / "s" / "log.jsonl") < 3 and run.poll() is None:
            assert time.monotonic() < deadline, "the run never measured its third trial"
            time.sleep(0.02)
        # Other users' jobs: three busy loops per core (a trial gets a quarter of a core).
        loads = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(3 * (os.cpu_count() or 1))
        ]
        out, err = run.communicate(timeout=600)
    finally:
        for p in loads:
            p.kill()
            p.wait()
        if run.poll() is None:
            run.kill()
    assert run.returncode in (0, 1), err
    doc = json.loads((tmp_path / "r.json").read_text())
    said = err + json.dumps(doc)
    # The claim the load would have made is never made; where everything but the culprit
    # measured slow under the load, the paired measurement says why not.
    assert "other changes slow it down too (--find-all" not in said, err
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"], err
    without = [t for t in doc["trials"] if t["purpose"].startswith("confirm: without")]
    if without and without[0]["verdict"] == "bad":
        assert "not said that other changes slow it down too" in said, err
