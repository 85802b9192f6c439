"""CPU figures of the smoke test: run-to-run spread of the tiny preset and the throughput
ratio of environment changes against a baseline measured in the same run.

Usage (from the repo root):
    python benchmarks/bench_smoke.py [--runs 5] [--only NAME ...] [--json OUT]

Every run is a fresh process (``python -m envbisect.agent.drafter --preset tiny``), so env
changes act as they do in the field. Runs are interleaved (baseline, change 1, change 2, ...,
then again) so that a machine whose speed drifts affects every configuration alike. Reports
per configuration: median tok/s, CV over the runs, median whole-process seconds, and the
ratio baseline/config of the median tok/s (> 1 means slower than the baseline). "tok/s" here is
timed tokens / (steps x median step time), which a burst of load from other processes moves
far less than the window figure (also reported, as the smoke result's own tok_per_s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_dataset(path: Path, scale: int, records: int = 64, seed: int = 0) -> None:
    """JSONL of lengths around the tiny preset's seq_len (256), times ``scale``."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for _ in range(records):
            fh.write(json.dumps({"length": scale * rng.randrange(192, 257, 16)}) + "\n")


def configs(tmp: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    short, long = tmp / "lengths-1x.jsonl", tmp / "lengths-4x.jsonl"
    write_dataset(short, 1)
    write_dataset(long, 4)
    return {
        "baseline": ([], {}),
        "OMP_NUM_THREADS=1": ([], {"OMP_NUM_THREADS": "1"}),
        "MKL_ENABLE_INSTRUCTIONS=SSE4_2": ([], {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}),
        "ATEN_CPU_CAPABILITY=default": ([], {"ATEN_CPU_CAPABILITY": "default"}),
        "MKL_CBWR=COMPATIBLE": ([], {"MKL_CBWR": "COMPATIBLE"}),
        "data 1x lengths": (["--data", str(short)], {}),
        "data 4x lengths": (["--data", str(long)], {}),
    }


def run_once(args: list[str], env_over: dict[str, str]) -> tuple[dict, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **env_over)
    argv = [sys.executable, "-m", "envbisect.agent.drafter", "--preset", "tiny", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ENVBISECT_RESULT ")]
    if not lines:
        raise SystemExit(f"no result from {argv} {env_over}: {proc.stderr[-1000:]}")
    return json.loads(lines[-1].split(" ", 1)[1]), wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = configs(Path(tmp))
        names = [n for n in table if ns.only is None or n in ns.only or n == "baseline"]
        samples: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
        for i in range(ns.runs):
            for name in names:
                res, wall = run_once(*table[name])
                if not res.get("ok"):
                    raise SystemExit(f"{name}: run failed: {res.get('error')}")
                # tokens over (steps x median step): robust to a burst of load from elsewhere
                steady = res["tok_per_s_steady"]
                samples[name].append((steady, wall, res["warmup_s"], res["tok_per_s"]))
                print(
                    f"run {i + 1} {name}: {res['tok_per_s']:.0f} tok/s, {wall:.1f}s",
                    file=sys.stderr,
                )
    base = statistics.median(s[0] for s in samples["baseline"])
    rows = []
    for name in names:
        toks = [s[0] for s in samples[name]]
        window = [s[3] for s in samples[name]]
        med = statistics.median(toks)
        cv = statistics.stdev(toks) / statistics.mean(toks) if len(toks) > 1 else 0.0
        rows.append(
            {
                "config": name,
                "runs": len(toks),
                "median_tok_per_s": round(med, 1),
                "median_window_tok_per_s": round(statistics.median(window), 1),
                "window_cv": round(statistics.stdev(window) / statistics.mean(window), 4)
                if len(window) > 1
                else 0.0,
                "cv": round(cv, 4),
                "median_wall_s": round(statistics.median(s[1] for s in samples[name]), 2),
                "median_warmup_s": round(statistics.median(s[2] for s in samples[name]), 3),
                "slowdown_vs_baseline": round(base / med, 3),
            }
        )
    print("config | runs | tok/s (median step) | CV | window tok/s | window CV | wall s | slowdown")
    for r in rows:
        print(
            f"{r['config']} | {r['runs']} | {r['median_tok_per_s']:.0f} | {100 * r['cv']:.1f}% | "
            f"{r['median_window_tok_per_s']:.0f} | {100 * r['window_cv']:.1f}% | "
            f"{r['median_wall_s']:.1f} | {r['slowdown_vs_baseline']:.2f}x"
        )
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
