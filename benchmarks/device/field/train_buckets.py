"""A user's own threaded training script (not envbisect's built-in smoke), the second of the
benchmark's: N threads each train their own small transformer on their own shard of the
dataset, the whole loss compiled once (automatic dynamic shapes off: one graph per sequence
length, as a user whose prompts come in a few length buckets compiles them), with
torch's fused attention (``scaled_dot_product_attention``, causal). Prints ``throughput: X
tok/s`` once, at the end, summed over the threads' timed steps; the first thread to die ends
the run (exit 1, its traceback printed).

    python3 train_buckets.py --data data/prompts.jsonl [--threads 3] [--steps 40]

Thread ``i`` takes prompts ``i, i + N, i + 2N, ...``; with the prompts' lengths cycling
through N buckets, each thread meets one length, so the threads compile at once, each its own
graph, while the others train. The backward is compiled with its forward
(``force_non_lazy_backward_lowering``): lazily, at the first backward, torch 2.11 deadlocked
on the GPU (a thread tracing its joint graph waits on the autograd engine, whose device thread
compiles another thread's backward and waits on Dynamo's compile lock).

What an empty compile cache does to it: each compile FX-traces its graph, and torch up to 2.13
keeps "FX is tracing" in a module global, so a thread that calls the compiled loss meanwhile
raises "Detected that you are using FX to symbolically trace a dynamo-optimized function". On
a warm cache a compile loads its graphs and traces nothing. New lengths (a grown dataset)
recompile while the others train: the same race, and the compiles inside the timed window.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import traceback

import torch
import torch._functorch.config as functorch_config
import torch.nn.functional as F
from torch import nn


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Drafter(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)


def loss_fn(model: Drafter, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token loss of ``tokens`` (batch, length)."""
    x = model.embed(tokens[:, :-1])
    for layer in model.layers:
        x = layer(x)
    logits = model.head(x).float()
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="JSON lines, each with a 'length'")
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per thread")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    return ap.parse_args()


def main() -> int:
    a = parse_args()
    functorch_config.force_non_lazy_backward_lowering = True
    with open(a.data, encoding="utf-8") as fh:
        lengths = [int(json.loads(line)["length"]) for line in fh if line.strip()]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    # One graph per length, set once for the process: torch.compile(dynamic=False) patches
    # Dynamo's config around each call, and threads entering and leaving at once undo one
    # another's patch, so a length compiled in a thread came out dynamic now and then.
    torch._dynamo.config.automatic_dynamic_shapes = False
    compiled = torch.compile(loss_fn)
    results: list[tuple[int, float]] = []
    errors: list[str] = []
    died = threading.Event()  # a drafter set with a hole in it is not worth training on

    def worker(i: int) -> None:
        try:
            torch.manual_seed(i)
            model = Drafter(a.vocab, a.dim, a.heads, a.layers).to(dev, dtype)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            shard = lengths[i :: a.threads]
            tokens, elapsed = 0, 0.0
            for k in range(a.warmup + a.steps):
                s = shard[k % len(shard)]
                batch = torch.randint(0, a.vocab, (a.batch, s + 1), device=dev)
                t0 = time.perf_counter()
                compiled(model, batch).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if dev == "cuda":
                    torch.cuda.synchronize()
                if k >= a.warmup:
                    tokens += a.batch * s
                    elapsed += time.perf_counter() - t0
            results.append((tokens, elapsed))
        except Exception:
            errors.append(traceback.format_exc())
            died.set()

    # Daemon threads, joined until one dies: the first dead thread ends the run at once,
    # where the others would go on compiling and training for nothing.
    threads = [
        threading.Thread(target=worker, args=(i,), name=f"drafter{i}", daemon=True)
        for i in range(a.threads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive() and not died.is_set():
            t.join(0.2)
    if errors:
        print(errors[0], flush=True)
        raise SystemExit(f"{len(errors)} of {a.threads} training threads died")
    rate = sum(tok / el for tok, el in results)
    print(f"throughput: {rate:.1f} tok/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
