"""``diff_manifests`` alone on two 20,000-entry manifests, this tree against another one.

The section registry (issue 14) replaced an if/elif chain with a lookup and a method per
section; this measures what that costs where it could show: the core diff of the largest
manifests bench_diff.py generates (no loading, no rendering). Each tree runs in its own
process (``PYTHONPATH=<tree>/src``), A B A B ..., medians per process, ratio pair by pair.

Usage: python benchmarks/bench_diff_core.py --ref /path/to/other/checkout [--pairs 5]
Without --ref it times this tree only. Prints a markdown table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

# Run inside each tree: the manifests come from this tree's bench_diff.generate (the same
# data for both), the diff from the tree under test.
_CHILD = """
import json, statistics, sys, time
sys.path.insert(0, {bench!r})
from bench_diff import generate
from envbisect.diff import diff_manifests
good, bad = generate()
diff_manifests(good, bad)  # warm-up
times = []
for _ in range({runs}):
    t = time.perf_counter()
    result = diff_manifests(good, bad)
    times.append(time.perf_counter() - t)
print(json.dumps({{"median": statistics.median(times), "units": len(result.units)}}))
"""


def _time(tree: Path, runs: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    code = _CHILD.format(bench=str(HERE / "benchmarks"), runs=runs)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", type=Path, default=None, help="another checkout to compare")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--runs", type=int, default=7, help="diffs per process")
    args = parser.parse_args()
    rows: list[tuple[float, float | None]] = []
    for _ in range(args.pairs):
        ref = _time(args.ref, args.runs)["median"] if args.ref else None
        here = _time(HERE, args.runs)
        rows.append((here["median"], ref))
    here_med = statistics.median(r[0] for r in rows)
    print("| tree | median s (of per-process medians) |")
    print("|---|---|")
    print(f"| this tree ({here['units']} units) | {here_med:.3f} |")
    if args.ref:
        ref_med = statistics.median(r[1] for r in rows if r[1] is not None)
        ratios = [r[0] / r[1] for r in rows if r[1]]
        print(f"| {args.ref} | {ref_med:.3f} |")
        print(
            f"\npaired ratio this / ref: median {statistics.median(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {len(ratios)} pairs)"
        )


if __name__ == "__main__":
    main()
