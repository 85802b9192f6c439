"""Cost of the realized-state check that run does before every trial, against the cost of
starting the same interpreter (``python -c pass``) and a bare echo agent round trip.

The check (``envbisect.realize.faithful.check_state``) ships the collector restricted to
python/packages/torch/files/git/env into the state's interpreter and compares the facts.
Measured here on this repository's own venv (its packages, torch included, one file, one
git repo, two env values), rounds interleaved so drift hits all three alike; reported:
median wall ms of each, and the per-round ratio of the check to the bare interpreter start.

Usage: python benchmarks/bench_state_check.py [--rounds N]
Nothing is asserted; results are recorded in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envbisect.realize.faithful import check_state
from envbisect.transport import Transport

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    target = ROOT / "pyproject.toml"
    expected = {
        ("files", str(target)): hashlib.sha256(target.read_bytes()).hexdigest(),
        ("git", str(ROOT)): None,  # whatever HEAD is: the comparison is not the point here
        ("env", "EB_A"): "1",
        ("env", "EB_B"): None,
        ("packages", "torch"): None,
    }
    env = {"EB_A": "1", "PATH": "/usr/bin:/bin"}
    rows: dict[str, list[float]] = {"python -c pass": [], "echo agent": [], "state check": []}
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp)
        for _ in range(args.rounds):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            bare = time.perf_counter() - t
            t = time.perf_counter()
            Transport().run_agent(
                sys.executable, "envbisect.agent.echo", {}, timeout_s=60, log_dir=log
            )
            echo = time.perf_counter() - t
            check = check_state(
                transport=Transport(),
                python=sys.executable,
                env=env,
                expected=expected,
                log_dir=log,
            )
            if check.error:
                raise SystemExit(check.error)
            rows["python -c pass"].append(bare)
            rows["echo agent"].append(echo)
            rows["state check"].append(check.elapsed_s)
            ratios.append(check.elapsed_s / bare)
    for name, xs in rows.items():
        print(f"{name:16s} median {statistics.median(xs) * 1000:7.1f} ms  (n={len(xs)})")
    print(f"state check / python start: median ratio {statistics.median(ratios):.1f}x")


if __name__ == "__main__":
    main()
