"""Run every benchmark in turn (`make bench`), printing each one's table.

Each script measures a ratio against a reference in the same run and prints markdown;
benchmarks/RESULTS.md records the figures with the commands that produced them. Pass
script names to run a subset: `python benchmarks/run_all.py snapshot diff`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> arguments: modest run counts, so the whole set finishes in minutes on 2 cores.
BENCHES: dict[str, list[str]] = {
    "snapshot": ["--runs", "7"],
    "diff": ["--runs", "9"],
    "diff_core": ["--pairs", "3"],
    "loader": ["--runs", "5"],
    "transport": ["--rounds", "11"],
    "search": ["--seeds", "200"],
    "run": ["--runs", "5"],
    "run_remote": ["--runs", "5"],
    "smoke": ["--runs", "5"],
    "at_once": ["--pairs", "1"],
}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"run_all: unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHES)}")
        return 2
    failed = []
    for name in names:
        cmd = [sys.executable, str(HERE / f"bench_{name}.py"), *BENCHES[name]]
        print(f"\n### {name}: {' '.join(cmd[1:])}", flush=True)
        start = time.monotonic()
        code = subprocess.call(cmd)
        print(f"({name}: exit {code}, {time.monotonic() - start:.0f} s)", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"run_all: failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
