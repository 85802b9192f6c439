"""Wall time of a 16-unit CPU bisection: 2 workers on 2 pinned cores vs 1 worker (goal ≤ 0.7×).

The scenario (built under --workdir): a uv venv target, a git repo with the workload of
tests/helpers_run.py (real arithmetic per token), and two manifests that differ in 16 env
units, one of which (``EB_SLOW``) makes training 8× slower: the held-out setting with one
field mechanism among bystanders. Each side is the whole ``envbisect run`` process (start-up,
diff, fact check and calibration included), a fresh session each time:

  A: envbisect run ... --workers 2     (cores 0 and 1, one worker each, OMP_NUM_THREADS=1)
  B: envbisect run ... --workers 1

run in turn A B A B ... (--pairs, one warm-up pair not counted); the ratio A/B is taken pair
by pair and its median quoted. Every run must name the culprit; the rounds and trials of the
last run of each side are printed too.

Usage: python benchmarks/bench_parallel.py [--pairs N] [--workdir DIR] [--print-commands]
(--print-commands builds the scenario and prints the two command lines, for an external
timer). Needs two cores; on a shared machine the medians move with the other load.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers_run import Scenario, pkg  # noqa: E402 - after the path fix above

UNITS = 16
TOKENS = "48000"  # about 0.5 s per fast run on the reference machine


def build(workdir: Path) -> Scenario:
    sc = Scenario(workdir)
    sc.venv("ebwork==1.0")
    git = sc.git_entry(sc.commits[0])
    good_env = {f"EB_KNOB{i:02d}": "a" for i in range(UNITS - 1)}
    bad_env = {f"EB_KNOB{i:02d}": "b" for i in range(UNITS - 1)}
    bad_env["EB_SLOW"] = "8"
    both = {"packages": {"ebwork": pkg("1.0")}, "git": git}
    sc.write(
        good={**both, "env": {**good_env, "EB_TOKENS": TOKENS}},
        bad={**both, "env": {**bad_env, "EB_TOKENS": TOKENS}},
        loose_good=b"lr = 0.2\n",
        loose_bad=b"lr = 0.2\n",
    )
    return sc


def command(sc: Scenario, workers: int, session: Path, out: Path) -> list[str]:
    exe = Path(sys.executable).parent / "envbisect"
    return [
        str(exe),
        "run",
        "--config",
        str(sc.config),
        "--python",
        sc.python,
        "--bad",
        str(sc.bad),
        "--session",
        str(session),
        "--json",
        str(out),
        "--workers",
        str(workers),
        "--",
        "python",
        str(sc.repo / "train.py"),
    ]


def one(sc: Scenario, workers: int, tag: str) -> tuple[float, dict]:  # type: ignore[type-arg]
    session = sc.tmp / f"session-{tag}"
    out = sc.tmp / f"result-{tag}.json"
    shutil.rmtree(session, ignore_errors=True)
    start = time.monotonic()
    proc = subprocess.run(command(sc, workers, session, out), capture_output=True, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    doc = json.loads(out.read_text())
    culprits = [c["unit"] for c in doc["culprits"]]
    if culprits != ["env:EB_SLOW"]:
        raise SystemExit(f"wrong culprit with {workers} worker(s): {culprits}")
    return wall, doc


SPIN = "acc = 0\nfor i in range(4_000_000):\n    acc = (acc + i * 7) % 1000003\n"


def capacity(rounds: int = 3) -> list[float]:
    """How much two pinned CPU-bound processes at once slow each other here: per round, one
    alone on core 0, then one on core 0 and one on core 1 together; the ratio of the
    together wall (the slower one) to the alone wall. 1.0: two free cores; 2.0: no gain."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    out = []
    for _ in range(rounds):
        start = time.monotonic()
        subprocess.run(["taskset", "-c", str(cores[0]), sys.executable, "-c", SPIN], check=True)
        alone = time.monotonic() - start
        start = time.monotonic()
        procs = [
            subprocess.Popen(["taskset", "-c", str(c), sys.executable, "-c", SPIN]) for c in cores
        ]
        for p in procs:
            p.wait()
        out.append((time.monotonic() - start) / alone)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--print-commands", action="store_true")
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two cores")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="envbisect-bench-parallel-"))
    sc = build(workdir)
    if args.print_commands:
        for k in (2, 1):
            argv = command(sc, k, workdir / f"s{k}", workdir / f"r{k}.json")
            # A fresh session per run: remove the last one first.
            print(
                shlex.join(["sh", "-c", 'rm -rf "$0" && exec "$@"', str(workdir / f"s{k}"), *argv])
            )
        return 0
    a_times, b_times, ratios = [], [], []
    docs: dict[int, dict] = {}  # type: ignore[type-arg]
    for i in range(args.pairs + 1):
        a, docs[2] = one(sc, 2, "a")
        b, docs[1] = one(sc, 1, "b")
        if i == 0:
            continue  # warm-up pair
        a_times.append(a)
        b_times.append(b)
        ratios.append(a / b)
    print(f"scenario: {UNITS} env units, culprit EB_SLOW; {args.pairs} pairs after 1 warm-up")
    print("| side | wall s median (min–max) | rounds | trials |")
    print("|---|---|---|---|")
    for k, times in ((2, a_times), (1, b_times)):
        rounds = max(t["round"] for t in docs[k]["trials"])
        print(
            f"| --workers {k} | {statistics.median(times):.2f} ({min(times):.2f}–{max(times):.2f}) "
            f"| {rounds} | {len(docs[k]['trials'])} |"
        )
    lo, hi = min(ratios), max(ratios)
    print(f"| A/B paired | {statistics.median(ratios):.3f} ({lo:.3f}–{hi:.3f}) | | |")
    cap = capacity()
    print(
        f"parallel capacity of this machine now: two pinned CPU-bound processes together take "
        f"{statistics.median(cap):.2f}x the wall of one alone (1.0 = two free cores; "
        f"rounds: {', '.join(f'{c:.2f}' for c in cap)})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
