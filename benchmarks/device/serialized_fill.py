"""On a GPU machine: does the warm-cache filling run race? The drafter in the field's race
configuration (3 drafter threads, flex compiled) from an empty inductor + Triton cache, run
under envbisect's probe as ``run`` runs a filling run (``serialize_compiles``: one thread
traces or compiles at a time) and, as the control, under the probe without it.

Usage (repo root, on the GPU machine):
    PYTHONPATH=src python3 benchmarks/device/serialized_fill.py OUTDIR [--tries 3]
        [--parallel 4] [--timeout 150]
Writes OUTDIR/serialized_fill.jsonl (one line per process) and prints a summary;
``SERIALIZED_FILL_SMOKE='--preset tiny ...'`` swaps the drafter's size (a CPU check).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from envbisect.run import probed  # noqa: E402

RACE = [
    "--preset", "h200", "--layers", "1", "--seq-len", "1024", "--anchors", "64",
    "--compile-unit", "flex", "--drafter-threads", "3", "--warmup", "3", "--steps", "8",
]  # fmt: skip
if os.environ.get("SERIALIZED_FILL_SMOKE"):
    RACE = shlex.split(os.environ["SERIALIZED_FILL_SMOKE"])


def one(kind: str, index: int, timeout: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"fill-{kind}-{index}-"))
    argv = list(probed.wrap([sys.executable, "-m", "envbisect.agent.drafter", *RACE]).argv)
    config = {"result": str(work / "facts.json"), "serialize_compiles": kind == "serialized"}
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
        "TRITON_CACHE_DIR": str(work / "triton"),
        "ENVBISECT_RESULT": str(work / "result.json"),
        "ENVBISECT_PROBE": json.dumps(config),
    }
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        rc: int | str = proc.returncode
        tail = proc.stderr[-400:]
    except subprocess.TimeoutExpired:
        rc, tail = "timeout", ""
    wall = time.monotonic() - t0
    res = _json(work / "result.json")
    facts = _json(work / "facts.json")
    shutil.rmtree(work, ignore_errors=True)  # the caches it compiled: hundreds of MB on a GPU
    threads = (res.get("threads") or {}).get("per_thread") or []
    died = [i for i, t in enumerate(threads) if not t.get("ok")]
    crash = (facts.get("crash") or {}).get("message") or next(
        (str(t.get("error")) for t in threads if t.get("error")), None
    )
    return {
        "kind": kind, "try": index, "rc": rc, "ok": bool(res.get("ok")) and rc == 0,
        "died": died, "error": crash, "tok_per_s": res.get("tok_per_s"),
        "serialized": facts.get("serialized"), "wall_s": round(wall, 1),
        "stderr_tail": tail if rc not in (0, "timeout") else "",
    }  # fmt: skip


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=150)
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    jobs = [(k, i) for i in range(1, ns.tries + 1) for k in ("serialized", "plain")]
    rows = []
    with ThreadPoolExecutor(ns.parallel) as pool:
        for row in pool.map(lambda j: one(j[0], j[1], ns.timeout), jobs):
            print(json.dumps(row), flush=True)
            rows.append(row)
    (ns.out / "serialized_fill.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for kind in ("serialized", "plain"):
        mine = [r for r in rows if r["kind"] == kind]
        crashed = sum(1 for r in mine if not r["ok"])
        print(f"{kind}: {crashed} of {len(mine)} crashed or failed (cold cache, 3 threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
