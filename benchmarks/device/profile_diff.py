"""Issue 34 on a device: the kernel diff of a culprit, from ``envbisect probe --profile``.

The user repo of ``user_repo.py`` (a small flex-attention transformer, trained with AdamW;
``model.py`` compiles flex_attention) is written to a temporary workspace, and each case is
run under the probe with a profile (``--profile-skip 4 --profile-steps 3``: the three
training steps after four warm-up steps, a step ending when ``optimizer.step()`` returns),
then its good and bad facts compared with ``envbisect profile-diff``:

- ``flex``: the good state against the repo with the culprit commit applied ("model: call
  flex_attention directly"): the fused flex kernel should vanish, the unfused ops (bmm,
  softmax, …) appear, each with its share of the step time;
- ``nocache``: the good state against the same with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (an
  allocator setting that turns every allocation into cudaMalloc/cudaFree);
- ``expandable``: the good state against ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.

Exact command (repo root, on the CUDA machine, its torch in ``python3``; < 5 min on an H200,
most of it the good run's first inductor compile)::

    PYTHONPATH=src python3 benchmarks/device/profile_diff.py OUTDIR

CPU plumbing mode (the same flow with the CPU sizes of ``user_repo.py``: a forward pass per
step, as flex has no backward on the CPU, with ``optimizer.step()`` still called so the step
boundary is there; one thread, OMP_NUM_THREADS=1, on a shared CPU; the allocator settings
change nothing real on a CPU: what their diffs show there is the machine's noise)::

    PYTHONPATH=src python3 benchmarks/device/profile_diff.py OUTDIR --size cpu

Writes OUTDIR/summary.md (each run's top table, each diff's top lines, the traces checked as
Chrome trace JSON), OUTDIR/<case>.json (the full ``profile-diff --format json``),
OUTDIR/transcript.txt (every command and its time, and the stderr of any that failed) and
OUTDIR/good.trace.json.gz, flex.trace.json.gz (the flex case's two traces, for Perfetto,
when each fits in 15 MB): seven files.

The same culprit through a whole bisection, ``run --profile`` (the kernel diff in the
report's ``### Kernels and ops`` section and under ``kernels`` in run.json)::

    PYTHONPATH=src python3 benchmarks/device/user_repo.py OUTDIR2 -- --profile
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from user_repo import SIZES, edit, good_state  # noqa: E402  # the user repo's own files

SRC = Path(__file__).resolve().parents[2] / "src"
CASES = {
    "nocache": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
}


def envbisect(args: list[str], log: Any, env: dict[str, str] | None = None) -> str:
    """``python -m envbisect ARGS`` from this checkout; its stdout."""
    full = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", *args],
        capture_output=True,
        text=True,
        env=full,
        check=False,
    )
    shown = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    log.write(f"$ {shown} envbisect {' '.join(args)}  # {time.monotonic() - t0:.1f} s\n")
    if proc.returncode not in (0, 1):
        log.write(proc.stderr[-4000:] + "\n")
        raise SystemExit(f"envbisect {args[0]} failed ({proc.returncode}): see transcript.txt")
    log.flush()
    return proc.stdout


def profiled(ws: Path, name: str, steps: int, log: Any, env: dict[str, str] | None) -> Path:
    """One run of the repo's training under the probe with a profile; its facts file."""
    logs = ws / "logs" / name
    out = envbisect(
        [
            "probe",
            "--profile",
            "--profile-skip",
            "4",
            "--profile-steps",
            "3",
            "--log-dir",
            str(logs),
            "--python",
            sys.executable,
            "--",
            sys.executable,
            "repo/train.py",
            "--data",
            "data/prompts.jsonl",
            "--steps",
            str(steps),
        ],
        log,
        env,
    )
    log.write(out + "\n")
    return logs / "probe.facts.json"


def trace_check(facts_file: Path) -> str:
    """``trace: PATH, N events (K device kernels), valid Chrome trace JSON`` or why not."""
    facts = json.loads(facts_file.read_text())
    trace = (facts.get("profile") or {}).get("trace")
    if not trace:
        return f"no trace ({(facts.get('profile') or {}).get('note', 'not profiled')})"
    try:
        events = json.loads(Path(trace).read_text())["traceEvents"]
    except (OSError, ValueError, KeyError) as exc:
        return f"trace {trace}: NOT valid Chrome trace JSON ({exc})"
    kernels = sum(1 for e in events if e.get("cat") == "kernel")
    mb = Path(trace).stat().st_size / 1e6
    return f"trace {trace}: {len(events)} events ({kernels} device kernels), {mb:.1f} MB, valid"


def keep_trace(facts_file: Path, dest: Path, limit: int = 15_000_000) -> str:
    """The run's trace, gzipped into ``dest`` when it fits ``limit`` bytes; what was done."""
    import gzip

    trace = (json.loads(facts_file.read_text()).get("profile") or {}).get("trace")
    if not trace or not Path(trace).exists():
        return f"- {dest.name}: no trace to keep"
    dest.write_bytes(gzip.compress(Path(trace).read_bytes(), 6))
    if dest.stat().st_size > limit:
        dest.unlink()
        return f"- {dest.name}: not kept ({Path(trace).stat().st_size / 1e6:.0f} MB unzipped)"
    return f"- kept {dest.name} ({dest.stat().st_size / 1e6:.1f} MB)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--steps", type=int, default=10, help="training steps per run")
    ap.add_argument("--keep", action="store_true", help="keep the workspace (its path is said)")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    ws = Path(tempfile.mkdtemp(prefix="envbisect-profile-")) / "ws"
    ws.mkdir()
    good_state(ws, args.size)
    if args.size == "cpu":  # no backward on the CPU: still end each step at optimizer.step()
        edit(
            ws / "repo" / "train.py",
            "        opt.zero_grad(set_to_none=True)\n",
            "        opt.zero_grad(set_to_none=True)\n    else:\n        opt.step()\n",
        )
    os.chdir(ws)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(ws / "inductor")}
    if args.size == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # a shared CPU: threads waiting on busy cores is noise
    summary = [f"# profile diffs ({args.size}, {args.steps} steps a run)", ""]
    t0 = time.monotonic()
    with (out / "transcript.txt").open("w", encoding="utf-8") as log:
        good = profiled(ws, "good", args.steps, log, env)
        runs = {}
        for case, extra in CASES.items():
            runs[case] = profiled(ws, case, args.steps, log, {**env, **extra})
        edit(ws / "repo" / "model.py", "return _flex(q, k, v,", "return flex_attention(q, k, v,")
        runs = {"flex": profiled(ws, "flex", args.steps, log, env), **runs}
        for case, bad in runs.items():
            text = envbisect(["profile-diff", str(good), str(bad), "--lines", "15"], log)
            doc = envbisect(["profile-diff", "--format", "json", str(good), str(bad)], log)
            (out / f"{case}.json").write_text(doc)
            said = " ".join(f"{k}={v}" for k, v in CASES.get(case, {}).items())
            summary += [f"## {case} {said or '(culprit commit: flex_attention called directly)'}"]
            summary += ["", "```", text.rstrip(), "```", ""]
        summary += ["## traces", ""]
        summary += [f"- {name}: {trace_check(f)}" for name, f in [("good", good), *runs.items()]]
        summary += [
            keep_trace(f, out / f"{name}.trace.json.gz")
            for name, f in [("good", good), ("flex", runs["flex"])]
        ]
        summary += ["", "## the good run's table", "", "```"]
        summary += [_table_text(good).rstrip(), "```", ""]
        summary.append(f"wall time: {time.monotonic() - t0:.0f} s")
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    print((out / "summary.md").read_text())
    if args.keep:
        print(f"workspace kept: {ws}")
    else:
        shutil.rmtree(ws.parent, ignore_errors=True)
    return 0


def _table_text(facts_file: Path) -> str:
    sys.path.insert(0, str(SRC))
    from envbisect.model.kernels import ProfileTable
    from envbisect.render.kernels import table_lines

    return "\n".join(table_lines(ProfileTable.from_facts(json.loads(facts_file.read_text()))))


if __name__ == "__main__":
    raise SystemExit(main())
