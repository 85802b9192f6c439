"""On a multi-GPU host: ``envbisect run --workers auto`` against ``--workers 1`` (issue 15).

The drift is the single-GPU end-to-end one (run_env_culprit.py) widened to seven env units:
``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (every allocation goes to cudaMalloc/cudaFree, a field
mechanism) genuinely slows drafter training; the six others do not. The smoke test is the
built-in drafter (no command after ``--``; ``--preset`` picks its size). NVLink multicast
stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1
are set for every run (no trial of ours needs it).

Usage (repo root, envbisect importable, e.g. PYTHONPATH=src):
    python3 benchmarks/device/run_parallel.py OUTDIR [--workers auto] [--also-one]
        [--repeats 3] [--timeout 300]
Writes OUTDIR/k<N>/{run.json,report.md,stderr.txt,log.txt,session-log.jsonl} per side and
OUTDIR/summary.json: the culprit, rounds, trials and wall time per side, the per-worker
calibration on the good state and the ratio of wall times. Exit code: 0 when every side
named the culprit.
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

import yaml

SCHEMA = "envbisect/manifest@1"
CULPRIT = "env:PYTORCH_NO_CUDA_MEMORY_CACHING"
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def manifests(work: Path) -> tuple[Path, Path]:
    good_env = {"EB_NOTE": "before", "EB_RUN": "1", "EB_TAG": "a", "OMP_NUM_THREADS": "8"}
    bad_env = {
        "EB_NOTE": "after",
        "EB_RUN": "2",
        "EB_TAG": "b",
        "EB_NEW": "1",
        "OMP_NUM_THREADS": "8",
        "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
    }
    paths = []
    for label, env in (("good", good_env), ("bad", bad_env)):
        doc = {"schema": SCHEMA, "meta": {"label": label}, "env": env}
        path = work / f"{label}.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def side(workers: str, out: Path, good: Path, bad: Path, args: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    out.mkdir(parents=True, exist_ok=True)
    session = out / "session"
    shutil.rmtree(session, ignore_errors=True)
    argv = [
        sys.executable, "-m", "envbisect", "run",
        "--good", str(good), "--bad", str(bad),
        "--python", sys.executable, "--session", str(session),
        "--repeats", args.repeats, "--timeout", args.timeout, "--workers", workers,
        "--json", str(out / "run.json"), "--report", str(out / "report.md"),
    ]  # fmt: skip
    bad_keys = set(yaml.safe_load(bad.read_text())["env"])
    env = {k: v for k, v in os.environ.items() if k not in bad_keys}
    env.update(NO_MULTICAST)
    start = time.monotonic()
    with open(out / "stderr.txt", "wb") as err:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, env=env, check=False)
    wall = time.monotonic() - start
    (out / "stdout.txt").write_bytes(proc.stdout)
    log = subprocess.run(
        [sys.executable, "-m", "envbisect", "log", "--session", str(session)],
        capture_output=True,
        env=env,
        check=False,
    )
    (out / "log.txt").write_bytes(log.stdout + log.stderr)
    if (session / "log.jsonl").exists():
        shutil.copy(session / "log.jsonl", out / "session-log.jsonl")
    doc = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    events = []
    if (session / "log.jsonl").exists():
        events = [json.loads(x) for x in (session / "log.jsonl").read_text().splitlines() if x]
    trials = doc.get("trials") or []
    return {
        "workers": workers,
        "exit": proc.returncode,
        "wall_s": round(wall, 2),
        "culprits": [c["unit"] for c in doc.get("culprits") or []],
        "rounds": max((t.get("round") or 0 for t in trials), default=0),
        "trials": len(trials),
        "workers_used": sorted({t["worker"] for t in trials if t.get("worker")}),
        "calibration": [e for e in events if e.get("type") == "calibration"],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--workers", default="auto")
    ap.add_argument("--also-one", action="store_true", help="run --workers 1 after it")
    ap.add_argument("--repeats", default="3")
    ap.add_argument("--timeout", default="300")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="envbisect-gpus-"))
    good, bad = manifests(work)
    results = [side(args.workers, args.out / f"k-{args.workers}", good, bad, args)]
    if args.also_one:
        results.append(side("1", args.out / "k-1", good, bad, args))
    summary = {"culprit_expected": CULPRIT, "sides": results}
    if len(results) == 2 and results[1]["wall_s"]:
        summary["wall_ratio_k_over_1"] = round(results[0]["wall_s"] / results[1]["wall_s"], 3)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if all(r["culprits"] == [CULPRIT] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
