"""The tiny preset with one core kept busy by another process, against the same machine quiet.

Usage (from the repo root):
    python benchmarks/bench_busy.py [--pairs 5] [--reference-pairs 1] [--json OUT]

Each pair runs the smoke test (``python -m envbisect.agent.drafter --preset tiny --samples 3``,
a fresh process) once on the quiet machine and once while ``sh -c 'while :; do :; done'`` (started
and killed by this script) keeps one core busy; the order within a pair alternates so drift
hits both sides alike. Two thread settings are measured: the smoke test's own sizing (the tiny
preset takes one thread) and ``--cpu-threads N`` with N the usable cores (what torch did
before: one thread per core; it collapses when a core is busy, so it gets only
``--reference-pairs`` pairs: one busy run of it takes minutes). Reports per setting the
median tok/s quiet and busy and the median of the paired ratios busy/quiet (goal: >= 0.6
for the default sizing), plus what the smoke result recorded about the load (busy cores at
start and during the run). Other users' processes load a shared machine too: ``uptime`` is
printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class BusyCore:
    """One core kept busy by a shell loop in its own process group, ended on exit."""

    def __enter__(self) -> BusyCore:
        self.proc = subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)
        time.sleep(0.5)  # let the scheduler see it before the measured run starts
        return self

    def __exit__(self, *exc: object) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def run_once(extra: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("OMP_NUM_THREADS", None)
    argv = [sys.executable, "-m", "envbisect.agent.drafter", "--preset", "tiny", "--samples", "3"]
    proc = subprocess.run([*argv, *extra], env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ENVBISECT_RESULT ")]
    if not lines:
        raise SystemExit(f"no result from {argv + extra}: {proc.stderr[-1000:]}")
    res = json.loads(lines[-1].split(" ", 1)[1])
    if not res.get("ok"):
        raise SystemExit(f"smoke failed: {res.get('error')}")
    return res


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--reference-pairs", type=int, default=1)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    settings = {"default sizing": [], f"--cpu-threads {cores}": ["--cpu-threads", str(cores)]}
    rows: dict[str, list[dict]] = {name: [] for name in settings}
    print(f"before: {uptime()}", flush=True)
    for i in range(ns.pairs):
        for name, extra in settings.items():
            if extra and i >= ns.reference_pairs:
                continue
            pair: dict[str, dict] = {}
            for busy in (False, True) if i % 2 == 0 else (True, False):
                if busy:
                    with BusyCore():
                        pair["busy"] = run_once(extra)
                else:
                    pair["quiet"] = run_once(extra)
            q, b = pair["quiet"], pair["busy"]
            rows[name].append(
                {
                    "quiet": q["tok_per_s"],
                    "busy": b["tok_per_s"],
                    "ratio": b["tok_per_s"] / q["tok_per_s"],
                    "threads": b["cpu"]["threads"],
                    "busy_cores_start": b["cpu"]["busy_cores_start"],
                    "busy_cores_during": b["cpu"]["busy_cores_during"],
                    "quiet_busy_cores_during": q["cpu"]["busy_cores_during"],
                }
            )
            r = rows[name][-1]
            print(
                f"pair {i + 1} {name}: quiet {r['quiet']:,.0f} busy {r['busy']:,.0f} tok/s "
                f"ratio {r['ratio']:.2f} (busy cores seen: start {r['busy_cores_start']}, "
                f"during {r['busy_cores_during']}; quiet run during "
                f"{r['quiet_busy_cores_during']})",
                flush=True,
            )
    print(f"after: {uptime()}")
    print("| threads | quiet tok/s (median) | busy tok/s (median) | busy/quiet (median of pairs) |")
    print("| --- | ---: | ---: | ---: |")
    for name, rs in rows.items():
        print(
            f"| {name} ({rs[0]['threads']}) | {statistics.median(r['quiet'] for r in rs):,.0f} "
            f"| {statistics.median(r['busy'] for r in rs):,.0f} "
            f"| {statistics.median(r['ratio'] for r in rs):.2f} |"
        )
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
