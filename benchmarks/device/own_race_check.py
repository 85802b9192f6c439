"""On a GPU machine: does an own threaded script (``field/train_threads.py``,
``field/train_buckets.py``) race on an empty compile cache and train on a warm one? A few
processes of each, before a whole drift is spent on it.

For each style (a field_drift.py style: the script and its flags), a warm cache is made by one
single-threaded run, then ``--runs`` processes of three threads run on an empty cache and
``--runs`` on the warm one, and ``--grown`` on a copy of the warm one with the field drift's
grown data, each cut after ``--timeout`` seconds (a hang). Each runs under
``trace_census.py``. One JSON line per process: style, cache, outcome (ok / crash / hung),
wall, the last line, the census (FX traces by thread and asker, AOTAutograd and FX graph
cache hits and misses).

    python3 benchmarks/device/own_race_check.py OUTFILE [--styles a,b] [--runs 2] [--grown 0]
        [--timeout 45] [--lengths 1024,1536,2048]

The good dataset's prompts cycle through ``--lengths`` (default the buckets of that style).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from field_drift import BUCKETS, IN_BUCKETS, STYLES, new_lengths, write_data  # noqa: E402


def one(py: str, data: Path, cache: Path, style: str, threads: int, timeout: float) -> dict:
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
    }
    script, flags = STYLES[style]
    argv = [py, str(HERE / "trace_census.py"), str(HERE / "field" / script),
            "--data", str(data), "--threads", str(threads), *flags]  # fmt: skip
    t = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **env})  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"outcome": "hung", "wall_s": round(time.monotonic() - t, 1), "last": ""}
    lines = (p.stdout + p.stderr).strip().splitlines() or [""]
    census = [ln for ln in lines if ln.startswith("census: ")]
    lines = [ln for ln in lines if not ln.startswith("census: ")] or [""]
    err = [ln for ln in lines if "Error" in ln]
    return {
        "outcome": "ok" if p.returncode == 0 else "crash", "wall_s": round(time.monotonic() - t, 1),
        "last": (err[-1] if err and p.returncode else lines[-1])[:300],
        "census": json.loads(census[-1][len("census: "):]) if census else None,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--styles", default="eager-backward")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--grown", type=int, default=0, help="runs on grown data, warm cache")
    ap.add_argument("--timeout", type=float, default=45)
    ap.add_argument("--lengths", default=None, help="the prompts' lengths, cycled")
    ns = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="envbisect-own-race-"))
    data = root / "prompts.jsonl"
    try:
        with ns.out.open("a", encoding="utf-8") as fh:

            def keep(style: str, cache: str, row: dict) -> None:
                line = json.dumps({"style": style, "cache": cache, **row})
                print(line, flush=True)
                fh.write(line + "\n")
                fh.flush()

            for style in ns.styles.split(","):
                if ns.lengths:
                    lengths = [int(n) for n in ns.lengths.split(",")]
                else:
                    lengths = list(BUCKETS) if style in IN_BUCKETS else [1024]
                data.write_text(
                    "".join(
                        json.dumps({"id": i, "length": lengths[i % len(lengths)]}) + "\n"
                        for i in range(2000)
                    )
                )
                warm = root / f"warm-{style}"
                keep(style, "warm-maker", one(sys.executable, data, warm, style, 1, 3 * ns.timeout))
                for i in range(ns.runs):
                    cold = root / f"cold-{style}-{i}"
                    keep(style, "cold", one(sys.executable, data, cold, style, 3, ns.timeout))
                    shutil.rmtree(cold, ignore_errors=True)
                    keep(style, "warm", one(sys.executable, data, warm, style, 3, ns.timeout))
                grown = root / "grown.jsonl"
                if ns.grown:
                    write_data(grown, 11000, grown=True, new=new_lengths(style))
                for i in range(ns.grown):
                    copy = root / f"grown-{style}-{i}"
                    shutil.copytree(warm, copy)
                    keep(style, "grown", one(sys.executable, grown, copy, style, 3, ns.timeout))
                    shutil.rmtree(copy, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
