"""Shared pieces of the smoke tests: the smallest drafter that still has every part."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"

# One layer, GQA (2 query heads over 1 KV head), 4 blocks of 16 over a 64-token context.
MICRO: dict[str, Any] = {
    "preset": "tiny",
    "device": "cpu",
    "hidden": 64,
    "layers": 1,
    "heads": 2,
    "kv_heads": 1,
    "head_dim": 32,
    "intermediate": 128,
    "vocab": 256,
    "target_layers": 2,
    "seq_len": 64,
    "anchors": 4,
    "batch": 1,
    "warmup": 1,
    "steps": 2,
    "loss_chunk": 32,
}

MICRO_FLAGS = [
    f"--{key.replace('_', '-')}={value}" for key, value in MICRO.items() if key != "preset"
] + ["--preset=tiny"]


def run_drafter_process(
    flags: list[str], env: dict[str, str] | None = None, result_file: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``python -m envbisect.agent.drafter`` for real; return the process and its line."""
    full_env = dict(os.environ, PYTHONPATH=str(SRC), **(env or {}))
    if result_file is not None:
        full_env["ENVBISECT_RESULT"] = str(result_file)
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect.agent.drafter", *flags],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ENVBISECT_RESULT ")]
    assert len(lines) == 1, (proc.stdout, proc.stderr[-2000:])
    return proc, json.loads(lines[0][len("ENVBISECT_RESULT ") :])
