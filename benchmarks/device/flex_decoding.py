"""Issue 51: the built-in drafter's single-thread crash on data of varying lengths, and its fix.

On an H100 (torch 2.11.0+cu130) the field's warm-up run (one drafter thread, flex compiled,
``--data`` of the field's prompts) crashed in its first timed window with ``LoweringException:
NoValidChoicesError`` raised from ``torch/_inductor/kernel/flex/flex_decoding.py``
(``create_flex_decoding_kernel`` -> ``autotune_select_algorithm``), the query length symbolic
(``size=[1, 32, s0, 128]``). Why: a second length makes dynamo recompile with the length
dynamic; inductor's ``_use_flex_decoding`` guards ``s0 < 128`` on the current length, and a
short prompt (fewer than 128 query rows: anchors x block size) sends the symbolic shape to the
flex-decoding template, whose autotune has no valid choice for it. ``kernel_options=
{"FORCE_USE_FLEX_ATTENTION": True}`` keeps the main flex kernel for every length; the drafter
now passes it by default (``--flex-decoding off``; ``auto`` is torch's own choice).

This runs the drafter as the field's warm-up did, on a dataset that mixes the field's long
prompts with short ones, ``RUNS`` times with ``--flex-decoding auto`` (expected on torch 2.11:
NoValidChoicesError) and with ``off`` (expected: clean), each in a fresh compile cache, and
writes OUTDIR/flex_decoding.json plus a table on stdout.

    PYTHONPATH=src python3 benchmarks/device/flex_decoding.py OUTDIR [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The field drift's race configuration (field_drift.RACE), one drafter thread: the warm-up.
DRAFTER = [
    "--preset", "h200", "--layers", "1", "--seq-len", "1024", "--anchors", "64",
    "--compile-unit", "flex", "--warmup", "3", "--steps", "8", "--drafter-threads", "1",
]  # fmt: skip
# Long prompts as the good data has them, then short ones (q rows = anchors x 16 < 128).
RUN_TIMEOUT_S = 150
LENGTHS = [1024, 1024, 1024, 1024, 96, 1024, 64, 1536, 112, 1024, 80, 2048]


def one(out: Path, data: Path, mode: str, i: int) -> dict[str, object]:
    name = f"{mode}-{i}"
    with tempfile.TemporaryDirectory(prefix="flexdec-cache-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=cache + "/triton")
        argv = [sys.executable, "-m", "envbisect.agent.drafter", *DRAFTER,
                "--data", str(data), "--flex-decoding", mode]  # fmt: skip
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                argv, env=env, capture_output=True, text=True, check=False, timeout=RUN_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            out_text = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            err_text = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
            proc = subprocess.CompletedProcess(argv, -9, out_text, err_text + "\n(timed out)")
        wall = round(time.monotonic() - t0, 1)
    (out / f"{name}.stdout").write_text(proc.stdout)
    (out / f"{name}.stderr").write_text(proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ENVBISECT_RESULT ")]
    result = json.loads(lines[-1].split(" ", 1)[1]) if lines else {}
    error = result.get("error") or {}
    return {
        "mode": mode,
        "run": i,
        "exit": proc.returncode,
        "wall_s": wall,
        "ok": bool(result.get("ok")),
        "tok_per_s": result.get("tok_per_s"),
        "error": f"{error.get('class')}: {str(error.get('message'))[:160]}" if error else None,
        "no_valid_choices": "NoValidChoicesError" in proc.stderr + json.dumps(error),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    data = args.outdir / "prompts.jsonl"
    data.write_text("".join(json.dumps({"length": n}) + "\n" for n in LENGTHS))
    rows = [one(args.outdir, data, mode, i) for mode in ("auto", "off") for i in range(args.runs)]
    (args.outdir / "flex_decoding.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"{'mode':<6} {'run':>3} {'ok':<5} {'wall_s':>7} {'tok/s':>10}  error")
    for r in rows:
        tps = f"{r['tok_per_s']:.0f}" if r["tok_per_s"] else "-"
        head = f"{r['mode']:<6} {r['run']:>3} {r['ok']!s:<5} {r['wall_s']:>7} {tps:>10}"
        print(f"{head}  {r['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
