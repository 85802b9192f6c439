"""What the probe costs: per training step and at start-up, against the same command
without it, in the same run (issue 22; goals ≤ 1% of step time, ≤ 0.3 s at start).

Usage (from the repo root; any python3 runs this script, ``--python`` is the one measured,
it needs torch; nothing else is needed in it):

    python3 benchmarks/bench_probe.py --python .venv/bin/python --out /tmp/probe.json
    python3 benchmarks/bench_probe.py --python /venv/bin/python --device cuda \\
        --out results/probe-h200.json            # on a GPU box: compiled flex_attention

Three programs, each run ``--runs`` times plain and under the probe, interleaved (plain,
probed, plain, ...) so that a machine whose speed drifts affects both alike:

- ``empty``: a script that does nothing (the bootstrap: decompress, exec, hooks);
- ``import torch``: a script that imports torch (the post-import hooks on torch's modules);
- ``train``: a small attention block trained for ``--steps`` steps, attention through
  ``torch.compile(flex_attention)`` with inductor on CUDA (on CPU, where flex_attention has
  no backward, a ``torch.compile``'d sdpa with the eager backend), the
  step timed inside the program (synchronized on CUDA). Its per-step figure is the median
  step after the first third (compile and warm-up), and the ratio probed/plain of the
  median of those over the runs. The program also times 2,000 calls of a compiled
  function (what the probe wraps per call).

Start-up is the whole-process wall time of ``empty`` and ``import torch``; the difference
of medians is the probe's cost at start. Results: a markdown table on stdout and JSON at
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from envbisect.run.probed import CONFIG_ENV, wrap  # noqa: E402 - after the path insert

TRAIN = r"""
import json, sys, time
import torch
from torch.nn.attention.flex_attention import flex_attention

device, backend, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
B, L, H, D = (4, 256, 4, 32) if device == "cpu" else (16, 1024, 16, 64)
dim = H * D
torch.manual_seed(0)
if device == "cpu":
    torch.set_num_threads(1)  # so that the process's CPU time is the step's own
if device == "cpu":  # flex_attention has no backward on CPU: compiled sdpa there

    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

else:
    attention = flex_attention
flex = torch.compile(attention, backend=backend)
qkv = torch.nn.Linear(dim, 3 * dim).to(device)
out = torch.nn.Linear(dim, dim).to(device)
params = list(qkv.parameters()) + list(out.parameters())
opt = torch.optim.SGD(params, lr=1e-3)
x = torch.randn(B, L, dim, device=device)


def sync():
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def step():
    q, k, v = qkv(x).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
    y = flex(q, k, v).transpose(1, 2).reshape(B, L, dim)
    loss = out(y).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


times, cpu = [], []
for i in range(steps):
    sync()
    t, c = time.perf_counter(), time.process_time()
    step()
    sync()
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)

f = torch.compile(lambda a: a + 1, backend="eager")
a = torch.ones(2)
f(a)
t = time.perf_counter()
for _ in range(2000):
    f(a)
call_us = (time.perf_counter() - t) / 2000 * 1e6
print("BENCH " + json.dumps({"steps": times, "cpu": cpu, "compiled_call_us": call_us}))
"""

# Under the probe only: the exact per-call cost of what it wraps, in one process, A/B
# against the unwrapped callable (``__wrapped__``), best of 15 rounds each.
PER_CALL = r"""
import json, sys, time
import torch
from torch.nn.attention.flex_attention import flex_attention

assert "_envbisect_probe" in sys.modules, "run under the probe"
f = torch.compile(lambda a: a + 1, backend="eager")
a = torch.ones(2)
f(a)
q = torch.randn(1, 1, 16, 8)
flex_attention(q, q, q)


def best(fn, args, n, reps=15):
    out = []
    for _ in range(reps):
        t = time.thread_time()  # CPU time: a round preempted by other load costs nothing
        for _ in range(n):
            fn(*args)
        out.append((time.thread_time() - t) / n)
    return min(out) * 1e6


res = {}
for name, fn, args, n in (
    ("compiled call", f, (a,), 2000),
    ("eager flex_attention call", flex_attention, (q, q, q), 20),
):
    raw = fn.__wrapped__
    pairs = []
    for i in range(4):  # which goes first alternates
        if i % 2:
            r, p = best(raw, args, n), best(fn, args, n)
        else:
            p, r = best(fn, args, n), best(raw, args, n)
        pairs.append((p, r))
    res[name] = {"probed_us": min(p for p, _ in pairs), "plain_us": min(r for _, r in pairs)}
print("BENCH " + json.dumps(res))
"""

EMPTY = "pass\n"
IMPORT_TORCH = "import torch\n"


def run(argv: list[str], env: dict[str, str], timeout: float) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + sys, the process and its children) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:3]}... failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, cpu, proc.stdout


def bench(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="envbisect-bench-probe-"))
    try:
        return _bench(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bench(args: argparse.Namespace, tmp: Path) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"))
    scripts = {}
    for name, text in (("empty", EMPTY), ("import torch", IMPORT_TORCH), ("train", TRAIN)):
        path = tmp / (name.replace(" ", "_") + ".py")
        path.write_text(text)
        scripts[name] = path
    per_call = tmp / "per_call.py"
    per_call.write_text(PER_CALL)
    probed_env = dict(env, **{CONFIG_ENV: json.dumps({"result": str(tmp / "facts-pc.json")})})
    _wall, _cpu, stdout = run(
        list(wrap([args.python, str(per_call)]).argv), probed_env, args.timeout
    )
    backend = "eager" if args.device == "cpu" else "inductor"
    train_args = [args.device, backend, str(args.steps)]
    out: dict = {
        "python": args.python,
        "device": args.device,
        "backend": backend,
        "steps": args.steps,
        "runs": args.runs,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "results": {},
        "per_call": json.loads(stdout.split("BENCH ", 1)[1]),
    }
    for name, path in scripts.items():
        extra = train_args if name == "train" else []
        plain = [args.python, str(path), *extra]
        probed = list(wrap(plain, args.python).argv)
        rows: dict[str, list] = {"plain": [], "probed": []}
        for i in range(args.runs):
            for kind in ("plain", "probed") if i % 2 == 0 else ("probed", "plain"):
                run_env = dict(env)
                if kind == "probed":
                    run_env[CONFIG_ENV] = json.dumps({"result": str(tmp / f"facts-{i}.json")})
                argv = plain if kind == "plain" else probed
                wall, cpu, stdout = run(argv, run_env, args.timeout)
                row: dict = {"wall_s": wall, "cpu_s": cpu}
                if name == "train":
                    data = json.loads(stdout.split("BENCH ", 1)[1])
                    skip = len(data["steps"]) // 3
                    row.update(
                        step_s=statistics.median(data["steps"][skip:]),
                        step_cpu_s=statistics.median(data["cpu"][skip:]),
                        compiled_call_us=data["compiled_call_us"],
                    )
                rows[kind].append(row)
        out["results"][name] = rows
    return out


def summarize(out: dict) -> list[str]:
    def med(name: str, kind: str, key: str) -> float:
        return statistics.median(r[key] for r in out["results"][name][kind])

    lines = [
        f"probe overhead: {out['python']} on {out['device']} ({out['host']}, {out['cpus']} CPUs), "
        f"{out['runs']} runs each, {out['steps']} steps, flex backend {out['backend']}",
        "",
        "| program | plain | probed | probe's cost |",
        "|---|---|---|---|",
    ]
    for name in ("empty", "import torch", "train"):
        for key, what in (("wall_s", "wall"), ("cpu_s", "CPU")):
            a, b = med(name, "plain", key), med(name, "probed", key)
            lines.append(
                f"| `{name}` process {what} (median) | {a:.3f} s | {b:.3f} s | {b - a:+.3f} s |"
            )
    for key, what in (("step_s", "wall"), ("step_cpu_s", "CPU")):
        a, b = med("train", "plain", key), med("train", "probed", key)
        lines.append(
            f"| `train` step {what} (median of run medians) | {a * 1e3:.3f} ms | "
            f"{b * 1e3:.3f} ms | {(b / a - 1) * 100:+.2f}% |"
        )
    a, b = med("train", "plain", "compiled_call_us"), med("train", "probed", "compiled_call_us")
    lines.append(
        f"| compiled-function call, across processes | {a:.2f} µs | {b:.2f} µs | {b - a:+.2f} µs |"
    )
    step = med("train", "plain", "step_s") * 1e6
    for name, r in out["per_call"].items():
        d = r["probed_us"] - r["plain_us"]
        lines.append(
            f"| {name}, one process, CPU time, best of 60 rounds | {r['plain_us']:.2f} µs | "
            f"{r['probed_us']:.2f} µs | {d:+.2f} µs ({d / step * 100:+.4f}% of a `train` step) |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter measured")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON goes")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    out = bench(args)
    out["summary"] = summarize(out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print("\n".join(out["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
