"""A user's training script that logs a throughput per step: a whole ``envbisect run``
before and after per-step samples (issue 21 item 4), same machine, same run of this script.

Usage (from the repo root, with the envbisect venv's python; ``--before-src`` is the
``src`` folder of the version to compare with, e.g. made by
``mkdir -p /tmp/before && git archive main src | tar -x -C /tmp/before``):

    .venv/bin/python benchmarks/bench_step_samples.py --python .venv/bin/python \\
        --before-src /tmp/before/src --out /tmp/step-samples.json

The scenario: ``train.py`` trains a tiny torch MLP on CPU and prints ``step i | loss x |
R Ktok/s`` per step (``--steps``); the good and bad manifests differ in three env vars,
one of which (``EB_SLOW``) makes every step slower. Each version runs ``envbisect run
--until 70% --repeats 3 --metric-regex ...`` on it: before, a run's log gave one number
(its last match), so each of a state's 3 samples was a process; after, every matched line
past the warm-up is a sample, so a state costs one process (an endpoint two). Reported:
the run's wall time, trials, processes started, the culprit; after is run with the probe
(default) and with ``--no-probe``.
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

ROOT = Path(__file__).resolve().parents[1]

TRAIN = r"""
import os, sys, time
import torch

steps = int(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(1)
work = 3 if os.environ.get("EB_SLOW") else 1
model = torch.nn.Sequential(
    torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
tokens = 2048
for i in range(steps):
    t = time.perf_counter()
    for _ in range(work):
        x = torch.randn(tokens, 256)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    rate = tokens / (time.perf_counter() - t) / 1000
    print(f"step {i} | loss {loss.item():.3f} | {rate:.1f} Ktok/s", flush=True)
"""

REGEX = r"loss [0-9.]+ \| ([0-9.]+) Ktok/s"


def manifest(path: Path, env: dict[str, str]) -> Path:
    doc = {"schema": "envbisect/manifest@1", "meta": {"label": path.stem}, "env": env}
    path.write_text(json.dumps(doc))
    return path


def one_run(args: argparse.Namespace, tmp: Path, name: str, src: Path, *extra: str) -> dict:
    work = tmp / name
    work.mkdir()
    script = tmp / "train.py"
    good = manifest(work / "good.yaml", {})
    bad = manifest(work / "bad.yaml", {"EB_A": "1", "EB_B": "1", "EB_SLOW": "1"})
    (work / "envbisect.yaml").write_text("{}\n")
    out = work / "result.json"
    argv = [
        sys.executable, "-m", "envbisect", "run", "--config", str(work / "envbisect.yaml"),
        "--python", args.python, "--good", str(good), "--bad", str(bad), "--until", "70%",
        "--repeats", "3", "--metric-regex", REGEX, "--session", str(work / "session"),
        "--json", str(out), *extra, "--", args.python, str(script), str(args.steps),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(src), TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"))
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=work)
    wall = time.perf_counter() - t
    doc = json.loads(out.read_text()) if out.exists() else {}
    processes = len(list((work / "session").rglob("run-*.stdout")))
    return {
        "version": name,
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "trials": len(doc.get("trials") or []),
        "processes": processes,
        "samples": sum(len(t["samples"]) for t in doc.get("trials") or []),
        "culprits": [c["unit"] for c in doc.get("culprits") or []],
        "outcome": doc.get("outcome"),
        "message": doc.get("message"),
        "good_median_ktok": round((doc.get("good_median_tok_per_s") or 0) / 1000, 1),
        "bad_median_ktok": round((doc.get("bad_median_tok_per_s") or 0) / 1000, 1),
        "why": [line for c in doc.get("culprits") or [] for line in c.get("why") or []],
        "stderr_tail": proc.stderr[-600:] if proc.returncode not in (0, 1) else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the target interpreter (with torch)")
    parser.add_argument("--before-src", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    args.python = os.path.abspath(args.python)  # the runs start in their own directories
    tmp = Path(tempfile.mkdtemp(prefix="envbisect-bench-steps-"))
    try:
        (tmp / "train.py").write_text(TRAIN)
        rows = [
            one_run(args, tmp, "before", args.before_src),
            one_run(args, tmp, "after", ROOT / "src"),
            one_run(args, tmp, "after-no-probe", ROOT / "src", "--no-probe"),
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [
        f"`envbisect run` on a per-step-logging CPU script ({args.steps} steps/process), "
        f"3 env units, --repeats 3, {os.cpu_count()} CPUs",
        "",
        "| version | exit | run wall | trials | processes | samples | good → bad Ktok/s "
        "| culprit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['version']} | {r['exit']} | {r['wall_s']} s | {r['trials']} | "
            f"{r['processes']} | {r['samples']} | {r['good_median_ktok']} → "
            f"{r['bad_median_ktok']} | {', '.join(r['culprits']) or r['outcome']} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "summary": lines}, indent=2))
    print("\n".join(lines))
    for r in rows:
        if r["stderr_tail"]:
            print(f"\n{r['version']} stderr:\n{r['stderr_tail']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
