"""Two workers' runs on one host, back to back: what the cleanup after each run costs, and how
many runs the other worker's cleanup killed.

Each turn, two threads each start ``--runs`` short processes (``python -c pass``) through
``Transport.run`` one after the other, as two local workers' trials do: one thread's cleanup
(a scan of /proc for what its run left) overlaps the other's start. Before e535073 a cleanup
that began while the other thread was between runs could take that thread's freshly forked
process for an orphan and SIGKILL it (CI saw a good state fail as "oom: killed by signal 9").
The cleanup and a run's start now exclude each other; this measures what that costs.

With ``--before SRC`` (the ``src`` folder of a reference checkout, e.g. ``git worktree add
/tmp/eb-old 8fe8bd8``) the same turn runs in a process importing that code, turns alternating
(A B, B A, ...). Prints a markdown table: the median per-run wall time of each revision, the
median of the per-turn ratios (this / before), and the runs that died by signal 9.
Usage: python benchmarks/bench_reaper.py [--before SRC] [--turns N] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

TURN = r"""
import json, sys, tempfile, threading, time
from pathlib import Path
from envbisect.transport import Transport

runs = int(sys.argv[1])
root = Path(tempfile.mkdtemp(prefix="eb-bench-reaper-"))
killed = [0, 0]

def worker(w):
    t = Transport()
    for i in range(runs):
        r = t.run([sys.executable, "-c", "pass"], timeout_s=60, log_dir=root / f"w{w}",
                  name=f"r{i}")
        killed[w] += r.returncode == -9

start = time.perf_counter()
threads = [threading.Thread(target=worker, args=(w,)) for w in (0, 1)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - start
import shutil
shutil.rmtree(root)
print(json.dumps({"per_run_ms": 1000 * wall / (2 * runs), "killed": sum(killed)}))
"""


def turn(src: Path, runs: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", TURN, str(runs)], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"bench_reaper: a turn failed in {src}: {out.stderr.strip()[-500:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="src folder of the reference checkout")
    parser.add_argument("--turns", type=int, default=5, help="paired turns (default 5)")
    parser.add_argument("--runs", type=int, default=300, help="runs per thread and turn")
    args = parser.parse_args()
    this = Path(__file__).resolve().parents[1] / "src"
    if args.before is not None and not (args.before / "envbisect").is_dir():
        print(f"bench_reaper: --before {args.before}: no envbisect package there", file=sys.stderr)
        return 2
    revisions = {"this": this, **({"before": args.before} if args.before else {})}
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in revisions}
    for i in range(args.turns):
        order = list(revisions) if i % 2 == 0 else list(reversed(revisions))
        for name in order:
            seen[name].append(turn(revisions[name], args.runs))
        print(f"turn {i + 1}/{args.turns} done", file=sys.stderr, flush=True)
    total = 2 * args.runs * args.turns
    print("| code | median ms per run | killed by signal 9 |")
    print("|---|---|---|")
    for name, turns in seen.items():
        ms = statistics.median(t["per_run_ms"] for t in turns)
        dead = int(sum(t["killed"] for t in turns))
        print(f"| {name} | {ms:.2f} | {dead} of {total} |")
    if "before" in seen:
        ratios = [a["per_run_ms"] / b["per_run_ms"] for a, b in zip(*seen.values(), strict=True)]
        ratio = statistics.median(ratios)
        print(f"\nthis / before, median of {len(ratios)} paired turns: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
