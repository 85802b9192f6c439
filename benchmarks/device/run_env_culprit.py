"""On a GPU machine: ``envbisect run`` finds a real env regression of the drafter smoke test.

The good and bad manifests differ in three env vars; one of them,
``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (every tensor allocation goes to cudaMalloc/cudaFree),
genuinely slows drafter training; the other two do not. The smoke command is the built-in
drafter run as a module in the target python (no compile, to keep each run short).

Usage (repo root, envbisect importable, e.g. PYTHONPATH=src):
    python3 benchmarks/device/run_env_culprit.py OUTDIR [--preset h200] [--steps 6]
Writes OUTDIR/run.json, OUTDIR/report.md, OUTDIR/stderr.txt; exit code is envbisect's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SCHEMA = "envbisect/manifest@1"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", default="h200")
    ap.add_argument("--steps", default="6")
    ap.add_argument("--repeats", default="3")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="envbisect-gpu-"))
    good_env = {"EB_NOTE": "before", "OMP_NUM_THREADS": "8"}
    bad_env = {
        "EB_NOTE": "after",
        "OMP_NUM_THREADS": "8",
        "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
    }
    for label, env in (("good", good_env), ("bad", bad_env)):
        doc = {"schema": SCHEMA, "meta": {"label": label}, "env": env}
        (work / f"{label}.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    argv = [
        sys.executable, "-m", "envbisect", "run",
        "--good", str(work / "good.yaml"), "--bad", str(work / "bad.yaml"),
        "--python", sys.executable, "--session", str(work / "session"),
        "--repeats", args.repeats, "--timeout", "300",
        "--json", str(args.out / "run.json"), "--report", str(args.out / "report.md"),
        "--", sys.executable, "-m", "envbisect.agent.drafter", "--preset", args.preset,
        "--no-compile", "--steps", args.steps, "--warmup", "2",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in bad_env}
    start = time.monotonic()
    with open(args.out / "stderr.txt", "wb") as err:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, env=env, check=False)
    sys.stdout.write(proc.stdout.decode())
    print(f"exit {proc.returncode}; wall {time.monotonic() - start:.0f}s")
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
