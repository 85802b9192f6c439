"""A trial's cost and noise: 3 samples from one drafter process against 3 processes of one.

Before, a trial of 3 samples started 3 processes (interpreter, torch import, warm-up each);
now one process gives 3 timed windows after one warm-up. Pairs run in turn (A B A B ...)
so that drift of a shared machine moves both; medians and the pairwise ratio are reported,
with the spread of the samples within one process and between processes (the noise the
verdict must not under-state).

Usage: python benchmarks/bench_trial.py [--pairs 5] [--python PY] [-- drafter flags]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def drafter(py: str, flags: list[str], samples: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        env = dict(os.environ, PYTHONPATH=str(SRC), ENVBISECT_RESULT=str(out))
        t = time.monotonic()
        subprocess.run(
            [py, "-m", "envbisect.agent.drafter", *flags, "--samples", str(samples)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        return time.monotonic() - t, json.loads(out.read_text())


def cv(values: list[float]) -> float:
    logs = [math.log(v) for v in values]
    return statistics.stdev(logs) if len(logs) > 1 else 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("flags", nargs="*", default=["--preset", "tiny"])
    args = ap.parse_args()
    one, three, ratios, within, between = [], [], [], [], []
    for _ in range(args.pairs):
        wall_a, res = drafter(args.python, args.flags, 3)
        within.append(cv(res["samples"]))
        wall_b, rates = 0.0, []
        for _ in range(3):
            w, r = drafter(args.python, args.flags, 1)
            wall_b += w
            rates.append(r["tok_per_s"])
        between.append(cv(rates))
        one.append(wall_a)
        three.append(wall_b)
        ratios.append(wall_a / wall_b)
        print(f"pair: one process {wall_a:.1f}s, three processes {wall_b:.1f}s", flush=True)
    print(
        f"trial of 3 samples, median wall: one process {statistics.median(one):.1f}s, "
        f"three processes {statistics.median(three):.1f}s, ratio {statistics.median(ratios):.2f}"
    )
    print(
        f"log-spread of 3 samples, median: within one process {statistics.median(within):.3f}, "
        f"between processes {statistics.median(between):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
