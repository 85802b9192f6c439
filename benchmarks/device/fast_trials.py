"""Issue 32: time to culprit on a user's own drafter repo whose log has one final figure.

The scenario of the issue, written here (the shapes of ``user_repo.py``): ``repo/train.py``
and ``repo/model.py`` (a small transformer whose attention is compiled ``flex_attention``),
``data/prompts.jsonl`` with 11,000 prompts, five commits since the good state (the third,
"model: call flex_attention directly", stops compiling flex) and an uncommitted hand patch
in that same ``model.py``. The training script prints **one** line at the end,
``throughput: N Ktok/s`` (no per-step figure), and the config's metric regex matches only
that line, so before issue 32 every sample cost a process.

What it measures, from one workspace (snapshots taken once):

1. plain runs of the command as the user types it, in the good and in the bad state, each
   run twice with the user's own inductor cache and the second (warm) one timed: what "try
   the commit by hand" costs;
2. ``--runs`` (default 3) runs of exactly the README's command, each in a fresh session:

       envbisect run --good manifests/good.yaml --bad manifests/bad.yaml --until 70% \\
           --json ... -- python3 repo/train.py --data data/prompts.jsonl

   each: the wall time to the culprit, whether it named the right commit and hunk, every
   trial's breakdown (realize, start-up, compile, steps; processes; samples used; the
   compile cache it used) and its wall time against the plain run of the state it behaved
   like (a good trial against the good state's plain run, a bad one against the bad's).

Writes OUTDIR/results.json, OUTDIR/results.md (the table for RESULTS.md), and per run
OUTDIR/run-K/{run.json,report.md,transcript.txt}.

The lead's command on the H200 (one device call, < 9 min; the repo root, envbisect
importable):

    PYTHONPATH=src python3 benchmarks/device/fast_trials.py "$OUT/fast-trials" --size gpu \\
        --runs 3 --budget-s 450

CPU plumbing mode (tiny sizes, the same steps; what CI-less checking here runs):

    PYTHONPATH=src .venv/bin/python benchmarks/device/fast_trials.py /tmp/ft --size cpu --runs 1

``--budget-s`` (default 450) starts no further run that would end past that many seconds
(judged by the run before; said in the results) and interrupts a run still going 60 s
past it (Ctrl-C: envbisect saves its session and restores the repo), so the whole call
ends within about budget + 90 s and a slow box still leaves its results under OUTDIR.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from user_repo import MODEL, SIZES, Transcript, drift, git  # noqa: E402 - the module beside us

SRC = Path(__file__).resolve().parents[2] / "src"
PROMPTS = 11_000
CULPRIT = "model: call flex_attention directly"
CULPRIT_LINE = "return flex_attention(q, k, v,"
REGEX = r"throughput: ([0-9.]+) Ktok/s"

TRAIN = '''\
"""Train the drafter on a JSONL of prompts; prints one throughput line at the end."""
import argparse
import json
import time

import torch

from model import Drafter, causal_mask

p = argparse.ArgumentParser()
p.add_argument("--data", required=True)
p.add_argument("--steps", type=int, default=STEPS)
p.add_argument("--batch", type=int, default=BATCH)
p.add_argument("--seq", type=int, default=SEQ)
args = p.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32
with open(args.data, encoding="utf-8") as fh:
    prompts = [json.loads(line)["text"] for line in fh if line.strip()]
tokens = torch.tensor([b for t in prompts for b in t.encode()][: 1 << 22], dtype=torch.long)
torch.manual_seed(0)
model = Drafter().to(device=device, dtype=dtype)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
mask = causal_mask(args.seq, device)
gen = torch.Generator().manual_seed(1)
timed, began = 0, None
for step in range(args.steps):
    if step == 1:  # the first step compiles: not counted
        began = time.perf_counter()
    idx = torch.randint(0, len(tokens) - args.seq - 1, (args.batch,), generator=gen)
    x = torch.stack([tokens[i : i + args.seq] for i in idx]).to(device)
    # flex attention has no backward on the CPU: there the step is a forward pass.
    with torch.set_grad_enabled(device == "cuda"):
        logits = model(x, mask)
        flat = logits[:, :-1].flatten(0, 1).float()
        loss = torch.nn.functional.cross_entropy(flat, x[:, 1:].flatten())
    if device == "cuda":
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()
    timed += args.batch * args.seq if step >= 1 else 0
print(f"throughput: {timed / (time.perf_counter() - began) / 1000:.1f} Ktok/s", flush=True)
'''

STEPS = {"gpu": 8, "cpu": 8}


def _fill(text: str, values: dict[str, int]) -> str:
    for name, value in values.items():
        text = text.replace(name, str(value))
    return text


def good_state(ws: Path, size: str) -> None:
    """The good state: first commit of the repo, 11k prompts, the user's config."""
    repo = ws / "repo"
    repo.mkdir(parents=True)
    values = {**SIZES[size], "STEPS": STEPS[size]}
    (repo / "train.py").write_text(_fill(TRAIN, values))
    (repo / "model.py").write_text(_fill(MODEL, values))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "drafter: first training run")
    (ws / "data").mkdir()
    words = ["draft", "token", "block", "anchor", "mask", "layer", "query", "value"]
    with (ws / "data" / "prompts.jsonl").open("w") as fh:
        for i in range(PROMPTS):
            text = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8 + i % 90))
            fh.write(json.dumps({"id": i, "text": text}) + "\n")
    (ws / "envbisect.yaml").write_text(
        "repos: [repo]\nfiles: ['repo/*.py']\ndata: [data/prompts.jsonl]\n"
        f"keep_blobs: true\nmanifests_dir: manifests\nmetric_regex: '{REGEX}'\n"
    )


def plain(tr: Transcript, ws: Path, env: dict[str, str], py: str) -> dict[str, float]:
    """The command as the user types it, twice (the user's cache warm), the second timed."""
    argv = [py, "repo/train.py", "--data", "data/prompts.jsonl"]
    walls = []
    for _ in range(2):
        t = time.monotonic()
        proc = tr.run(argv, ws, env)
        walls.append(time.monotonic() - t)
        if proc.returncode != 0:
            raise SystemExit(f"the plain run failed: exit {proc.returncode}")
    figure = proc.stdout.strip().splitlines()[-1]
    return {"cold_s": round(walls[0], 2), "warm_s": round(walls[1], 2), "figure": figure}


def interruptible(
    tr: Transcript, argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float
) -> tuple[int | None, str, str]:
    """``argv`` with a deadline: past it, Ctrl-C (envbisect saves the session and restores
    the repo), then a kill 30 s later. Returns (exit status, stdout, stderr)."""
    tr.say(f"$ (cd {cwd.name}) " + " ".join(argv) + f"  [deadline {timeout_s:.0f}s]")
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        err += f"\n[fast_trials: past the {timeout_s:.0f}s deadline, interrupted]\n"
    tr.say(f"exit {proc.returncode}")
    return proc.returncode, out, err


def one_run(
    tr: Transcript,
    ws: Path,
    env: dict[str, str],
    out: Path,
    k: int,
    culprit: str,
    deadline_s: float,
) -> dict[str, Any]:
    """One ``envbisect run`` in a fresh session: its wall time, answer and trials."""
    run_dir = out / f"run-{k}"
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable, "-m", "envbisect", "run",
        "--good", "manifests/good.yaml", "--bad", "manifests/bad.yaml", "--until", "70%",
        "--session", f"sess-{k}", "--json", str(run_dir / "run.json"),
        "--report", str(run_dir / "report.md"),
        "--", "python3", "repo/train.py", "--data", "data/prompts.jsonl",
    ]  # fmt: skip
    t = time.monotonic()
    code, stdout, stderr = interruptible(tr, argv, ws, env, deadline_s)
    wall = time.monotonic() - t
    (run_dir / "transcript.txt").write_text(stdout + "\n--- stderr\n" + stderr)
    try:
        doc = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        doc = {}
    culprits = doc.get("culprits") or []
    first = culprits[0] if culprits else {}
    hunk_text = json.dumps(first.get("hunk") or {})
    return {
        "run": k,
        "exit": code,
        "wall_s": round(wall, 1),
        "commit_right": first.get("commit") == culprit,
        "hunk_right": CULPRIT_LINE in hunk_text,
        "culprit": {"unit": first.get("unit"), "commit": first.get("commit")},
        "trials": [
            {
                "index": t.get("index"),
                "purpose": t.get("purpose"),
                "verdict": t.get("verdict"),
                "samples": len(t.get("samples") or []),
                "timing": t.get("timing"),
            }
            for t in doc.get("trials") or []
        ],
    }


def ratios(run: dict, plains: dict[str, dict[str, float]]) -> None:
    """Each trial's wall time against the plain (warm) run of the state it behaved like."""
    for t in run["trials"]:
        timing = t.get("timing") or {}
        ref = plains["bad" if t.get("verdict") == "bad" else "good"]["warm_s"]
        t["ratio_vs_plain"] = round(float(timing.get("wall_s") or 0) / ref, 2) if ref else None


def table(results: dict) -> str:
    lines = [
        f"fast_trials ({results['size']}): plain warm run good "
        f"{results['plain']['good']['warm_s']}s"
        f", bad {results['plain']['bad']['warm_s']}s; runs {len(results['runs'])}; "
        f"median time to culprit {results['median_wall_s']}s",
        "",
        "| run | wall s | right commit | right hunk | trials | processes |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        procs = sum((t.get("timing") or {}).get("processes") or 0 for t in r["trials"])
        lines.append(
            f"| {r['run']} | {r['wall_s']} | {r['commit_right']} | {r['hunk_right']} | "
            f"{len(r['trials'])} | {procs} |"
        )
    lines += [
        "",
        "| run | trial | purpose | verdict | samples | procs | realize | start-up | compile |"
        " steps | wall | × plain | cache |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        for t in r["trials"]:
            tm = t.get("timing") or {}
            cache = (tm.get("compile_cache") or [{}])[-1]
            name = Path(str(cache.get("dir", ""))).name
            how = f"{name} {'shared' if cache.get('shared') else 'new'}"
            lines.append(
                f"| {r['run']} | {t['index']} | {t['purpose']} | {t['verdict']} | {t['samples']}"
                f" | {tm.get('processes')} | {tm.get('realize_s')} | {tm.get('startup_s')} | "
                f"{tm.get('compile_s')} | {tm.get('steps_s')} | {tm.get('wall_s')} | "
                f"{t.get('ratio_vs_plain')} | {how if cache else '-'} |"
            )
    return "\n".join(lines) + "\n"


def prepare(
    tr: Transcript, ws: Path, env: dict[str, str], plain_env: dict[str, str]
) -> tuple[dict[str, dict[str, float]], str]:
    """Plain runs and snapshots of both states (the drift made between them); the
    culprit commit."""
    py = sys.executable
    plains = {"good": plain(tr, ws, plain_env, py)}
    snap = [py, "-m", "envbisect", "snapshot", "--python", py]
    if tr.run([*snap, "--label", "good", "-o", "manifests/good.yaml"], ws, env).returncode:
        raise SystemExit("snapshot of the good state failed (transcript.txt)")
    drift(ws)
    culprit = subprocess.run(
        ["git", "log", "--format=%H", f"--grep={CULPRIT}"],
        cwd=ws / "repo", capture_output=True, text=True, check=True,
    ).stdout.split()[0]  # fmt: skip
    if tr.run([*snap, "--label", "bad", "-o", "manifests/bad.yaml"], ws, env).returncode:
        raise SystemExit("snapshot of the bad state failed (transcript.txt)")
    plains["bad"] = plain(tr, ws, plain_env, py)
    return plains, culprit


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=450.0)
    args = ap.parse_args()
    began = time.monotonic()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="envbisect-fast-"))
    ws = tmp / "ws"
    ws.mkdir()
    tr = Transcript(out / "transcript.txt")
    py = sys.executable
    env = dict(os.environ, PYTHONPATH=str(SRC), PYTHONUNBUFFERED="1")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor")  # the user's own cache
    # The plain runs warm a cache of their own: the snapshots see the user's unchanged.
    plain_env = dict(env, TORCHINDUCTOR_CACHE_DIR=str(tmp / "plain-inductor"))
    env["PATH"] = f"{Path(py).parent}:{env.get('PATH', '')}"
    results: dict = {"size": args.size, "prompts": PROMPTS, "runs": [], "skipped": 0}
    try:
        good_state(ws, args.size)
        plains, culprit = prepare(tr, ws, env, plain_env)
        results["plain"] = plains
        results["setup_s"] = round(time.monotonic() - began, 1)
        for k in range(1, args.runs + 1):
            last = results["runs"][-1]["wall_s"] if results["runs"] else 0.0
            if k > 1 and time.monotonic() - began + last > args.budget_s:
                results["skipped"] = args.runs - k + 1
                tr.say(
                    f"budget of {args.budget_s:.0f}s spent: {results['skipped']} run(s) not made"
                )
                break
            # A run may not end past the budget and 60 s (the device call's own limit)
            left = max(60.0, args.budget_s + 60 - (time.monotonic() - began))
            run = one_run(tr, ws, env, out, k, culprit, left)
            ratios(run, plains)
            results["runs"].append(run)
            tr.say(
                f"run {k}: {run['wall_s']}s, commit right {run['commit_right']}, hunk right "
                f"{run['hunk_right']}, {len(run['trials'])} trials"
            )
        walls = [r["wall_s"] for r in results["runs"]]
        results["median_wall_s"] = statistics.median(walls) if walls else None
        results["all_right"] = all(r["commit_right"] and r["hunk_right"] for r in results["runs"])
        results["total_s"] = round(time.monotonic() - began, 1)
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "results.md").write_text(table(results))
        tr.say(table(results))
        return 0 if results["all_right"] else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
