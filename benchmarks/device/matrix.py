"""Run the smoke test under named configurations on a GPU machine; one JSONL of results.

Usage: python3 benchmarks/device/matrix.py OUTDIR NAME [NAME ...]   (run from the repo root)

Each configuration is a fresh process (``python3 -m envbisect.agent.drafter``) with its own
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

# The field's race at the size the issue measured it (1 layer, S=1024, 64 anchors): drafters
# in threads, each building its block mask every step, per compile unit and workaround.
RACE = ["--layers", "1", "--seq-len", "1024", "--anchors", "64"]
FIELD_PATCH_FILE = "/tmp/envbisect-field-patch/dflash_model.py"  # written by main()
COLD = {
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/envbisect-inductor-cold2",
    "TRITON_CACHE_DIR": "/tmp/envbisect-triton-cold2",
}
COLD3 = {
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/envbisect-inductor-cold3",
    "TRITON_CACHE_DIR": "/tmp/envbisect-triton-cold3",
}
RACE_KNOBS = (
    ("patch", ["--patch-module", FIELD_PATCH_FILE]),
    ("unoptimized", ["--nested-fx", "unoptimized"]),
    ("force", ["--nested-fx", "force"]),
    ("locked", ["--mask-build", "locked"]),
    ("once", ["--mask-build", "once"]),
)
# race-*: fixed shapes; race-vary-*: shapes that change every step (recompiles in one
# drafter while the others step). Tags a/b are repeated tries of the same configuration.
for prefix, shapes in (("race", []), ("race-vary", ["--vary-shapes"])):
    for unit in ("flex", "layer", "model"):
        base = RACE + shapes + ["--compile-unit", unit, "--drafter-threads"]
        CONFIGS[f"{prefix}-{unit}-t1"] = (base + ["1"], {})
        for n in (1, 3, 6):
            for tag in ("a", "b"):
                CONFIGS[f"{prefix}-{unit}-t{n}-{tag}"] = (base + [str(n)], {})
        for knob, flags in RACE_KNOBS:
            CONFIGS[f"{prefix}-{unit}-t3-{knob}"] = (base + ["3", *flags], {})
CONFIGS["h200-eagermask-cold"] = (["--mask-compile", "off"], dict(COLD3))
CONFIGS["h200-eagermask-s5-a"] = (["--mask-compile", "off", "--samples", "5"], dict(COLD3))
CONFIGS["h200-eagermask-s5-b"] = (["--mask-compile", "off", "--samples", "5"], dict(COLD3))
for unit in ("layer", "model"):
    CONFIGS[f"h200-{unit}-cold"] = (["--compile-unit", unit], dict(COLD))
    CONFIGS[f"h200-{unit}-s5-a"] = (["--compile-unit", unit, "--samples", "5"], dict(COLD))
    CONFIGS[f"h200-{unit}-s5-b"] = (["--compile-unit", unit, "--samples", "5"], dict(COLD))


def _write_field_patch() -> None:
    """The demo's model file with the field's hand patch appended (the demo's bad state)."""
    sys.path.insert(0, "src")
    from envbisect.run.demo import FIELD_PATCH

    os.makedirs(os.path.dirname(FIELD_PATCH_FILE), exist_ok=True)
    with open("fixtures/demo/repo/dflash_model.py") as fh:
        text = fh.read()
    with open(FIELD_PATCH_FILE, "w") as fh:
        fh.write(text + FIELD_PATCH)


def _threads_cell(r: dict) -> str:
    per = (r.get("threads") or {}).get("per_thread") or []
    if len(per) < 2:
        return "-"
    cells = []
    for t in per:
        if t.get("ok"):
            cells.append(f"{t['index']}:ok({t['path'][:11]})")
        else:
            cells.append(f"{t['index']}:died@{t['steps_done']}")
    return " ".join(cells)


def main(argv: list[str]) -> int:
    out_dir, names = argv[0], argv[1:]
    timeout = float(os.environ.get("MATRIX_TIMEOUT", "240"))
    budget = float(os.environ.get("MATRIX_BUDGET", "1e9"))  # seconds for the whole matrix
    os.makedirs(out_dir, exist_ok=True)
    _write_field_patch()
    rows = []
    started = time.time()
    for name in names:
        left = budget - (time.time() - started)
        if left < 20:
            print(f"{name}\tskipped: matrix budget spent", flush=True)
            continue
        args, env_over = CONFIGS[name]
        t0 = time.time()
        rc, res = _run_config(name, out_dir, min(timeout, left))
        wall = time.time() - t0
        rec = {"name": name, "args": args, "env": env_over, "rc": rc, "wall_s": wall, "result": res}
        with open(os.path.join(out_dir, "results.jsonl"), "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        row = _row(name, rc, res or {}, wall)
        rows.append(row)
        print("\t".join(str(x) for x in row), flush=True)
    print(
        "\nname\trc\ttok/s\tMFU\twarmup_s\tstep_s\tpeakGiB\trecompiles\tfallback\twall\terror\tthreads\tsamples"
    )
    for row in rows:
        print("\t".join(str(x) for x in row))
    return 0


def _run_config(name: str, out_dir: str, timeout: float) -> tuple[int | str, dict | None]:
    """Run the drafter with configuration ``name`` (its stderr into runs.log); its exit code
    (or "timeout") and its result line, None when it printed none."""
    args, env_over = CONFIGS[name]
    env = dict(os.environ, PYTHONPATH="src", PYTHONUNBUFFERED="1")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", WARM)
    env.update(env_over)
    env["ENVBISECT_RESULT"] = os.path.join("/tmp", f"smoke-{name}.json")
    argv_run = [sys.executable, "-Xfaulthandler", "-m", "envbisect.agent.drafter", *args]
    with open(os.path.join(out_dir, "runs.log"), "a") as log:
        log.write(f"\n===== {name}: {env_over} {args}\n")
        log.flush()
        proc = subprocess.Popen(argv_run, env=env, stdout=subprocess.PIPE, stderr=log)
        rc: int | str
        try:
            stdout, _ = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler dumps every thread's stack
            try:
                stdout, _ = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, _ = proc.communicate()
            rc = "timeout"
    lines = [ln for ln in stdout.decode().splitlines() if ln.startswith("ENVBISECT_RESULT ")]
    return rc, json.loads(lines[-1][len("ENVBISECT_RESULT ") :]) if lines else None


def _row(name: str, rc: int | str, r: dict, wall: float) -> tuple:
    """One configuration's line of the matrix table."""
    err = r.get("error") or {}
    return (
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
        _threads_cell(r),
        ",".join(f"{x:.0f}" for x in (r.get("samples") or []) if x),
    )


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
