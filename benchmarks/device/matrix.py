"""Run the smoke test under named configurations on a GPU machine; one JSONL of results.

Usage: python3 benchmarks/device/matrix.py OUTDIR NAME [NAME ...]   (run from the repo root)

Each configuration is a fresh process (``python3 -m envbisect.smoke.drafter``) with its own
flags and environment, so env knobs (TORCH_COMPILE_DISABLE, PYTORCH_CUDA_ALLOC_CONF, a cold
TORCHINDUCTOR_CACHE_DIR) act as they do in the field. Results are appended to
OUTDIR/results.jsonl (one object per run, with the name, argv, env and wall time); stderr of
every run goes to OUTDIR/runs.log. A short table is printed last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

WARM = "/tmp/envbisect-inductor-warm"
SMALL = ["--batch", "1", "--anchors", "128"]  # a size at which the unfused path fits

CONFIGS = {
    "baseline-cold": ([], {"TORCHINDUCTOR_CACHE_DIR": "/tmp/envbisect-inductor-cold"}),
    "baseline": ([], {}),
    "baseline-b4": (["--batch", "4"], {}),
    "baseline-b1": (["--batch", "1"], {}),
    "baseline-b1-warm": (["--batch", "1"], {}),
    "vary-shapes-b1": (["--batch", "1", "--vary-shapes"], {}),
    "threads-2-b1": (["--batch", "1", "--drafter-threads", "2"], {}),
    "alloc-expandable-b1": (
        ["--batch", "1"],
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    ),
    "sdpa": (["--attn", "sdpa"], {}),
    "no-compile": (["--no-compile"], {}),
    "flex-eager": (["--attn", "flex-eager"], {}),
    "compile-disable-env": ([], {"TORCH_COMPILE_DISABLE": "1"}),
    "vary-shapes": (["--vary-shapes"], {}),
    "alloc-expandable": ([], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    "alloc-split": ([], {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}),
    "threads-2": (["--drafter-threads", "2"], {}),
    "small-baseline": (SMALL, {}),
    "small-flex-eager": (SMALL + ["--attn", "flex-eager"], {}),
    "small-no-compile": (SMALL + ["--no-compile"], {}),
    "small-sdpa-eager": (SMALL + ["--attn", "sdpa", "--no-compile"], {}),
    "small-compile-disable-env": (SMALL, {"TORCH_COMPILE_DISABLE": "1"}),
    "tiny-gpu": (["--preset", "tiny"], {}),
}


def main(argv: list[str]) -> int:
    out_dir, names = argv[0], argv[1:]
    timeout = float(os.environ.get("MATRIX_TIMEOUT", "240"))
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for name in names:
        args, env_over = CONFIGS[name]
        env = dict(os.environ, PYTHONPATH="src", PYTHONUNBUFFERED="1")
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", WARM)
        env.update(env_over)
        env["ENVBISECT_RESULT"] = os.path.join("/tmp", f"smoke-{name}.json")
        argv_run = [sys.executable, "-m", "envbisect.smoke.drafter", *args]
        t0 = time.time()
        with open(os.path.join(out_dir, "runs.log"), "a") as log:
            log.write(f"\n===== {name}: {env_over} {args}\n")
            log.flush()
            argv_run.insert(1, "-Xfaulthandler")
            proc = subprocess.Popen(argv_run, env=env, stdout=subprocess.PIPE, stderr=log)
            try:
                stdout, _ = proc.communicate(timeout=timeout)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)  # faulthandler dumps every thread's stack
                stdout, _ = proc.communicate()
                rc = "timeout"
            lines = [
                ln for ln in stdout.decode().splitlines() if ln.startswith("ENVBISECT_RESULT ")
            ]
            res = json.loads(lines[-1][len("ENVBISECT_RESULT ") :]) if lines else None
        wall = time.time() - t0
        rec = {"name": name, "args": args, "env": env_over, "rc": rc, "wall_s": wall, "result": res}
        with open(os.path.join(out_dir, "results.jsonl"), "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        r = res or {}
        err = r.get("error") or {}
        row = (
            name,
            rc,
            "{:.0f}".format(r["tok_per_s"]) if r.get("tok_per_s") else "-",
            "%.1f%%" % (100 * r["mfu"]) if r.get("mfu") else "-",
            "{:.1f}".format(r["warmup_s"]) if r.get("warmup_s") else "-",
            "{:.3f}".format(r["step_s"]["median"]) if r.get("step_s") else "-",
            "%.1f" % ((r.get("memory") or {}).get("peak_allocated_bytes", 0) / 2**30),
            (r.get("dynamo") or {}).get("recompiles"),
            r.get("flex_fallback"),
            f"{wall:.0f}",
            (err.get("class", "") + ": " + err.get("message", ""))[:70],
        )
        rows.append(row)
        print("\t".join(str(x) for x in row), flush=True)
    print("\nname\trc\ttok/s\tMFU\twarmup_s\tstep_s\tpeakGiB\trecompiles\tfallback\twall\terror")
    for row in rows:
        print("\t".join(str(x) for x in row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
