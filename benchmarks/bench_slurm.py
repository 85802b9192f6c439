"""Slurm: a new job per process (``srun``) vs a step of one reused allocation (``salloc``).

A trial of a Slurm worker runs several processes through Slurm (the actuation agent, every
smoke run, the restore): what each costs before the program starts decides the mode. On the
single-node cluster of tests/helpers_slurm.py (started here, in a temp dir), measured in
turn per round:

  A: ``srun -n1 --job-name=... -- python3 -c pass``            (a job each)
  B: ``srun --jobid=J --overlap -n1 -- python3 -c pass``       (a step of allocation J)
  C: ``python3 -c pass``                                         (no Slurm: the floor)

--rounds rounds after one warm-up; medians of wall time, and the paired ratio A/B.
Usage: python benchmarks/bench_slurm.py [--rounds N]  (needs root, slurm-wlm and munge)
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers_slurm import start_cluster, stop_cluster, why_not  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.monotonic()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()
    reason = why_not()
    if reason:
        raise SystemExit(reason)
    cluster = start_cluster(Path(tempfile.mkdtemp(prefix="envbisect-bench-slurm-")))
    env = cluster.env()
    try:
        out = subprocess.run(
            ["salloc", "--no-shell", "-n1", "--job-name=bench-alloc"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        m = re.search(r"Granted job allocation (\d+)", out.stderr + out.stdout)
        assert m, out.stderr
        job = m.group(1)
        prog = [sys.executable, "-c", "pass"]
        sides = {
            "A: srun, a job per process": ["srun", "-n1", "--job-name=bench-job", "--", *prog],
            "B: step of one salloc allocation": [
                "srun",
                f"--jobid={job}",
                "--overlap",
                "-n1",
                "--",
                *prog,
            ],
            "C: no Slurm": prog,
        }
        times: dict[str, list[float]] = {k: [] for k in sides}
        for i in range(args.rounds + 1):
            for name, argv in sides.items():
                t = timed(argv, env)
                if i:
                    times[name].append(t)
        subprocess.run(["scancel", job], env=env, check=False)
    finally:
        stop_cluster(cluster)
    a, b = times["A: srun, a job per process"], times["B: step of one salloc allocation"]
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    print(f"{args.rounds} rounds after 1 warm-up, single-node cluster on this machine")
    print("| side | wall s median (min–max) |")
    print("|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.3f} ({min(ts):.3f}–{max(ts):.3f}) |")
    print(f"| A/B paired | {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
