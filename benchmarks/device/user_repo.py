"""A user's own drafter-training repo, bisected the way a user types it (GPU or CPU).

Not envbisect's built-in smoke test: a workspace of the user's shape, written here --
``repo/train.py`` and ``repo/model.py`` (a small transformer whose attention is
``flex_attention``, compiled), ``data/prompts.jsonl`` -- with five commits since the good
state, one of which ("model: call flex_attention directly") stops compiling flex attention,
plus an uncommitted hand patch in the same ``model.py`` that changes nothing measurable.

The script snapshots the good state, applies the commits and the patch, snapshots the bad
state, then runs, from the workspace root, exactly what the README tells a user to type:

    envbisect run --good manifests/good.yaml --bad manifests/bad.yaml --until 70% \
        -- python3 repo/train.py --data data/prompts.jsonl

Usage (repo root, envbisect importable, e.g. PYTHONPATH=src):
    python3 benchmarks/device/user_repo.py OUTDIR [--size gpu|cpu] [-- extra run flags]
Writes OUTDIR/transcript.txt, run.json, report.md, good.yaml, bad.yaml, diff.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

TRAIN = '''\
"""Train the drafter on a JSONL of prompts; prints one throughput line per step."""
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
for step in range(args.steps):
    idx = torch.randint(0, len(tokens) - args.seq - 1, (args.batch,), generator=gen)
    x = torch.stack([tokens[i : i + args.seq] for i in idx]).to(device)
    t0 = time.perf_counter()
    # flex attention has no backward on the CPU: there the step is a forward pass.
    with torch.set_grad_enabled(device == "cuda"):
        logits = model(x, mask)
        flat = logits[:, :-1].flatten(0, 1).float()
        loss = torch.nn.functional.cross_entropy(flat, x[:, 1:].flatten())
    if device == "cuda":
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    ktoks = args.batch * args.seq / dt / 1000
    print(f"step {step} | loss {loss.item():.3f} | {ktoks:.1f} Ktok/s", flush=True)
'''

MODEL = '''\
"""The drafter: byte embeddings, DIM-wide blocks of flex attention and an MLP."""
import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

DIM, HEADS, LAYERS = DIM_, HEADS_, LAYERS_
EPS = 1e-6

_flex = torch.compile(flex_attention, dynamic=False)


def causal_mask(seq, device):
    return create_block_mask(lambda b, h, q, kv: q >= kv, None, None, seq, seq, device=device)


def attend(q, k, v, mask):
    return _flex(q, k, v, block_mask=mask)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.RMSNorm(DIM, eps=EPS)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.proj = nn.Linear(DIM, DIM, bias=False)
        self.norm2 = nn.RMSNorm(DIM, eps=EPS)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x, mask):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        a = attend(q, k, v, mask).transpose(1, 2).reshape(b, s, DIM)
        x = x + self.proj(a)
        return x + self.mlp(self.norm2(x))


class Drafter(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, 256, bias=False)

    def forward(self, x, mask):
        h = self.embed(x)
        for blk in self.blocks:
            h = blk(h, mask)
        return self.head(h)
'''

SIZES = {
    # H200: attention dominates at S=4096 with 8 heads of 128; compiled flex is fused.
    "gpu": dict(DIM_=1024, HEADS_=8, LAYERS_=2, STEPS=40, BATCH=4, SEQ=4096),
    "cpu": dict(DIM_=64, HEADS_=2, LAYERS_=1, STEPS=12, BATCH=2, SEQ=256),
}


def _fill(text: str, values: dict[str, int]) -> str:
    for name, value in values.items():
        text = text.replace(name, str(value))
    return text


class Transcript:
    def __init__(self, path: Path) -> None:
        self.fh = path.open("w", encoding="utf-8")
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {text}"
        print(line, flush=True)
        self.fh.write(line + "\n")
        self.fh.flush()

    def run(self, argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
        self.say(f"$ (cd {cwd.name}) " + shlex.join(argv))
        t = time.monotonic()
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
        for stream in (proc.stdout, proc.stderr):
            if stream.strip():
                self.fh.write(stream if stream.endswith("\n") else stream + "\n")
        self.say(f"exit {proc.returncode} in {time.monotonic() - t:.1f}s")
        return proc


def git(repo: Path, *args: str, when: str = "2026-11-02T09:00:00Z") -> None:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="Dana Drafter",
        GIT_AUTHOR_EMAIL="dana@example.com",
        GIT_COMMITTER_NAME="Dana Drafter",
        GIT_COMMITTER_EMAIL="dana@example.com",
        GIT_AUTHOR_DATE=when,
        GIT_COMMITTER_DATE=when,
    )
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        raise SystemExit(f"edit of {path.name}: {old!r} not found")
    path.write_text(text.replace(old, new, 1))


def good_state(ws: Path, size: str, scenario: str = "flex") -> None:
    repo = ws / "repo"
    repo.mkdir(parents=True)
    train, model = _fill(TRAIN, SIZES[size]), _fill(MODEL, SIZES[size])
    if scenario == "recompile":
        # A grown dataset's many lengths: a new length (and mask) every step, 40 in a
        # cycle; flex compiled with automatic dynamic shapes (one recompile, then dynamic).
        train = (
            train.replace("mask = causal_mask(args.seq, device)\n", "")
            .replace(
                "    x = torch.stack([tokens[i : i + args.seq] for i in idx]).to(device)\n",
                "    seq = args.seq - 64 * (step % 40)\n"
                "    mask = causal_mask(seq, device)\n"
                "    x = torch.stack([tokens[i : i + seq] for i in idx]).to(device)\n",
            )
            .replace("ktoks = args.batch * args.seq /", "ktoks = x.numel() /")
        )
        model = model.replace("dynamic=False", "dynamic=None")
        train = train.replace(f"default={SIZES[size]['STEPS']}", "default=24")  # 24 lengths
    (repo / "train.py").write_text(train)
    (repo / "model.py").write_text(model)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "drafter: first training run")
    (ws / "data").mkdir()
    words = ["draft", "token", "block", "anchor", "mask", "layer", "query", "value"]
    with (ws / "data" / "prompts.jsonl").open("w") as fh:
        for i in range(4000):
            text = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8 + i % 90))
            fh.write(json.dumps({"id": i, "text": text}) + "\n")
    (ws / "envbisect.yaml").write_text(
        "repos: [repo]\nfiles: ['repo/*.py']\ndata: [data/prompts.jsonl]\n"
        "keep_blobs: true\nmanifests_dir: manifests\nmetric_regex: '([0-9.]+) Ktok/s'\n"
    )


def drift(ws: Path, scenario: str = "flex") -> None:
    """Five commits (the third is the culprit) and an unrelated uncommitted patch."""
    repo = ws / "repo"
    model, train = repo / "model.py", repo / "train.py"
    edit(model, '"""The drafter:', '"""The DFlash drafter:')
    git(repo, "commit", "-qam", "model: say what the drafter is", when="2026-11-10T10:00:00Z")
    edit(train, "lr=1e-4", "lr=2e-4")
    git(repo, "commit", "-qam", "train: raise the learning rate", when="2026-11-12T11:00:00Z")
    if scenario == "recompile":  # static shapes: a recompile per new length, then eager
        edit(model, "dynamic=None", "dynamic=False")
        subject = "model: compile flex_attention with static shapes"
    else:
        edit(model, "return _flex(q, k, v,", "return flex_attention(q, k, v,")
        subject = "model: call flex_attention directly"
    git(repo, "commit", "-qam", subject, when="2026-11-14T12:00:00Z")
    edit(model, "nn.GELU()", "nn.GELU(approximate='tanh')")
    git(repo, "commit", "-qam", "model: tanh GELU", when="2026-11-16T13:00:00Z")
    edit(train, "manual_seed(0)", "manual_seed(42)")
    git(repo, "commit", "-qam", "train: seed 42", when="2026-11-18T14:00:00Z")
    edit(model, "EPS = 1e-6", "EPS = 1e-5  # hand patch: match the checkpoint's norm eps")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--keep", action="store_true", help="keep the workspace (its path is said)")
    ap.add_argument("--scenario", choices=["flex", "recompile"], default="flex")
    ap.add_argument(
        "--absolute", action="store_true", help="absolute paths in the command (older envbisect)"
    )
    ap.add_argument("run_flags", nargs="*", help="extra flags for envbisect run (after --)")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    ws = Path(tempfile.mkdtemp(prefix="envbisect-user-")) / "ws"
    ws.mkdir()
    tr = Transcript(out / "transcript.txt")
    env = dict(os.environ, PYTHONPATH=str(SRC), PYTHONUNBUFFERED="1")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(ws.parent / "inductor")
    eb = [sys.executable, "-m", "envbisect"]
    # The interpreter a user's `python3` means: the one running this script (an activated
    # venv here, the image's python3 on the GPU box).
    py = sys.executable
    env["PATH"] = f"{Path(py).parent}:{env.get('PATH', '')}"
    try:
        good_state(ws, args.size, args.scenario)
        snap = [*eb, "snapshot", "--python", py]
        tr.run([*snap, "--label", "good", "-o", "manifests/good.yaml"], ws, env)
        drift(ws, args.scenario)
        tr.run([*snap, "--label", "bad", "-o", "manifests/bad.yaml"], ws, env)
        d = tr.run([*eb, "diff", "manifests/good.yaml", "manifests/bad.yaml"], ws, env)
        (out / "diff.txt").write_text(d.stdout + d.stderr)
        command = ["repo/train.py", "--data", "data/prompts.jsonl"]
        if args.absolute:
            command = [str(ws / "repo/train.py"), "--data", str(ws / "data/prompts.jsonl")]
        t = time.monotonic()
        run = tr.run(
            [
                *eb, "run", "--good", "manifests/good.yaml", "--bad", "manifests/bad.yaml",
                "--until", "70%", "--session", "sess", "--json", str(out / "run.json"),
                "--report", str(out / "report.md"), *args.run_flags,
                "--", "python3", *command,
            ],
            ws,
            env,
        )  # fmt: skip
        tr.say(f"run: exit {run.returncode}, wall {time.monotonic() - t:.1f}s")
        tr.say("run stdout:\n" + run.stdout + "\nrun stderr (tail):\n" + run.stderr[-6000:])
        for name in ("good.yaml", "bad.yaml"):
            shutil.copy(ws / "manifests" / name, out / name)
        return run.returncode
    finally:
        if args.keep:
            tr.say(f"workspace kept: {ws}")
        else:
            shutil.rmtree(ws.parent, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
