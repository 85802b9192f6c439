"""A user's own threaded drafter training script (not envbisect's built-in smoke): N threads
each train their own attention block, flex attention compiled, a block mask built for every
batch with ``create_block_mask(..., _compile=True)`` (the field's data-loader pattern), the
sequence lengths read from the dataset. Prints ``throughput: X tok/s`` once, at the end.

    python3 train_threads.py --data data/prompts.jsonl [--threads 3] [--steps 8]
        [--warmup-main | --eager-backward]

``--warmup-main``: one training step in the main thread, on the dataset's first length,
before the threads start, so that they find forward and backward compiled. Without it the
threads compile at once, and on the H100 (torch 2.11) that deadlocked even with a warm
cache: a thread tracing flex attention's backward waits on the autograd engine, whose
device thread compiles another thread's backward and waits on Dynamo's compile lock.

``--eager-backward``: the threads still compile at once, but each graph's backward is
compiled with its forward (``torch._functorch.config.force_non_lazy_backward_lowering``),
so the autograd engine's device thread never compiles, which the deadlock above needs.

Both flags together, on a dataset whose prompts come in a few length buckets: the main
thread compiles the first bucket, then each thread compiles the buckets it meets while the
others already train. On a warm cache such a compile loads its graphs and never FX-traces;
on an empty one it does, while another thread calls a compiled function: torch up to 2.13
keeps "FX is tracing" in a module global, and that call raises.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import traceback

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def causal(b, h, q, kv):
    return q >= kv


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x, mask, attend):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = attend(q, k, v, block_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def train_step(model: Block, opt: torch.optim.Optimizer, attend, s: int, dtype) -> None:
    """One step at sequence length ``s``: its block mask built, forward, backward, update."""
    dev = model.qkv.weight.device
    mask = create_block_mask(causal, 1, 1, s, s, device=dev, _compile=True)
    x = torch.randn(1, s, model.qkv.in_features, device=dev, dtype=dtype)
    loss = model(x, mask, attend).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if dev.type == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--warmup-main", action="store_true", help="compile in the main thread first")
    ap.add_argument("--eager-backward", action="store_true", help="backward compiled with forward")
    a = ap.parse_args()
    if a.eager_backward:
        import torch._functorch.config as functorch_config

        functorch_config.force_non_lazy_backward_lowering = True
    with open(a.data, encoding="utf-8") as fh:
        lengths = [int(json.loads(line)["length"]) for line in fh if line.strip()]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    attend = torch.compile(flex_attention)
    results: list[tuple[int, float]] = []
    errors: list[str] = []

    def step(model: Block, opt: torch.optim.Optimizer, s: int) -> None:
        train_step(model, opt, attend, s, dtype)

    if a.warmup_main:
        first = Block(a.dim, a.heads).to(dev, dtype)
        step(first, torch.optim.AdamW(first.parameters(), lr=1e-4), lengths[0])

    def worker(i: int) -> None:
        try:
            torch.manual_seed(i)
            model = Block(a.dim, a.heads).to(dev, dtype)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            tokens, elapsed = 0, 0.0
            for i_step in range(a.warmup + a.steps):
                s = lengths[(i + i_step * a.threads) % len(lengths)]
                t0 = time.perf_counter()
                step(model, opt, s)
                if i_step >= a.warmup:
                    tokens += s
                    elapsed += time.perf_counter() - t0
            results.append((tokens, elapsed))
        except Exception:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print(errors[0], flush=True)
        raise SystemExit(f"{len(errors)} of {a.threads} training threads died")
    rate = sum(tok / el for tok, el in results)
    print(f"throughput: {rate:.1f} tok/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
