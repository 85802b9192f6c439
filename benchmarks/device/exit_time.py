"""Issue 32: where the good state's "after" time goes (the program's exit after its last step).

On the H100 the good trials of ``fast_trials.py`` spent 10.5-14.1 s *after* their last step
(bad trials: 0.0 s). This builds that scenario's good state (``fast_trials.good_state``, gpu
sizes) and runs the command plainly, cache warm, three ways, twice each:

- ``default``: as the user types it;
- ``threads1``: ``TORCHINDUCTOR_COMPILE_THREADS=1`` (no compile worker pool);
- ``osexit``: a wrapper that runs the script and then ``os._exit(0)`` (no interpreter teardown).

Each run records the time the script's main body ended (a wrapper around runpy) and the time
the process was reaped. Writes OUTDIR/exit_time.json and prints a table.

    PYTHONPATH=src python3 benchmarks/device/exit_time.py OUTDIR [--size gpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fast_trials import good_state  # noqa: E402 - the module beside us

WRAP = (
    "import os, runpy, sys, time\n"
    "sys.argv = sys.argv[1:]\n"
    "sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "sys.stdout.flush()\n"
    "print('MAIN_END', time.time(), flush=True)\n"
    "if os.environ.get('EXIT_TIME_OSEXIT'):\n"
    "    os._exit(0)\n"
)


def one(ws: Path, env: dict[str, str]) -> dict[str, float]:
    argv = [sys.executable, "-c", WRAP, "repo/train.py", "--data", "data/prompts.jsonl"]
    t0 = time.time()
    proc = subprocess.run(argv, cwd=ws, env=env, capture_output=True, text=True, check=False)
    t1 = time.time()
    end = [float(x.split()[1]) for x in proc.stdout.splitlines() if x.startswith("MAIN_END")]
    return {
        "exit": proc.returncode,
        "wall_s": round(t1 - t0, 2),
        "main_s": round(end[0] - t0, 2) if end else None,
        "exit_s": round(t1 - end[0], 2) if end else None,
        "figure": next((x for x in proc.stdout.splitlines() if "throughput" in x), ""),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--size", default="gpu")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    ws = a.outdir / "ws"
    good_state(ws, a.size)
    base = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(ws / "c"),
        "TRITON_CACHE_DIR": str(ws / "t"),
    }
    print("cold:", one(ws, base), flush=True)  # fills the cache
    ways = {
        "default": base,
        "threads1": {**base, "TORCHINDUCTOR_COMPILE_THREADS": "1"},
        "osexit": {**base, "EXIT_TIME_OSEXIT": "1"},
    }
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in ways}
    for _ in range(a.repeat):
        for name, env in ways.items():
            r = one(ws, env)
            rows[name].append(r)
            print(name, r, flush=True)
    summary = {
        k: {
            "wall_s": statistics.median(r["wall_s"] for r in v),
            "exit_s": statistics.median(r["exit_s"] or 0 for r in v),
        }
        for k, v in rows.items()
    }
    (a.outdir / "exit_time.json").write_text(
        json.dumps({"rows": rows, "summary": summary}, indent=1)
    )
    for k, v in summary.items():
        print(f"{k:9s} wall {v['wall_s']:6.2f}s  exit {v['exit_s']:6.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
