"""A training-like workload that races an FX trace against a compiled step (CPU).

One thread traces a small function with ``make_fx`` over and over, the way a
drafter-building thread traces its mask function; the main thread trains a
small MLP language model whose forward + loss is ``torch.compile``d, and prints
one throughput line per step::

    step 12: 7412 tok/s compiled=1

On a torch whose FX tracing flag is one process-wide global (2.13 and earlier,
see docs/fx-race.md) the trainer's compiled step sees the other thread's flag:
with ``--nested-fx eager`` (``error_on_nested_fx_trace = False``) dynamo runs
the step's original code, eager, whenever the tracer is mid-trace; with
``--nested-fx error`` (torch's default) the step raises the field's
``RuntimeError: Detected that you are using FX to symbolically trace a
dynamo-optimized function``. From 2.14.0 the flag is thread-local and the step
stays compiled.

``compiled=`` is the fraction of the step's forward calls that ran inside
dynamo's graph (read from a marker the compiled graph does not contain).
Stdlib + torch only; runs in any venv that has torch.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

# One OpenMP thread unless the caller says otherwise, set before torch loads: with more, the
# compiled kernels' OpenMP workers spin on this 2-core box against the tracing thread and
# the compiled step's speed swings by 10x with other processes' load.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402 - after OMP_NUM_THREADS, which torch reads when it loads
import torch.nn.functional as F  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

# Counts calls of the forward that ran as Python (eager). Inside dynamo's graph
# `is_compiling()` is True at trace time, so the compiled step never counts.
_EAGER_CALLS = [0]


def _count_eager() -> None:
    _EAGER_CALLS[0] += 1


class TinyLM(torch.nn.Module):
    """Embedding, a few pre-norm GELU MLP blocks, a tied output head."""

    def __init__(self, vocab: int, dim: int, blocks: int) -> None:
        super().__init__()
        self.scale = dim**-0.5
        self.emb = torch.nn.Embedding(vocab, dim)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(dim) for _ in range(blocks))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(dim, 2 * dim) for _ in range(blocks))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(2 * dim, dim) for _ in range(blocks))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        for i, norm in enumerate(self.norms):
            x = self.ups[i](norm(h))
            # Many small elementwise ops: what inductor fuses into one loop and
            # eager runs (and differentiates) one by one.
            x = F.gelu(x) * torch.sigmoid(x) + 0.1 * torch.tanh(x)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            x = torch.clamp(x, -4.0, 4.0) * torch.exp(-0.5 * x * x) + F.silu(x)
            h = h + self.downs[i](x)
        return (h @ self.emb.weight.t()) * self.scale


def mask_fn(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """What the tracing thread traces: a causal block-mask-like function.

    The sleep runs while the trace is on (the flag is up) with the GIL released, like a
    drafter thread waiting on I/O mid-trace: the flag is up most of the time, yet the
    trainer is not starved of the GIL, so the two releases differ by the flag alone.
    """
    time.sleep(0.01)
    causal = q[:, None] >= k[None, :]
    window = (q[:, None] - k[None, :]) < 64
    return (causal & window).float().cumsum(-1)


def tracer_loop(stop: threading.Event, traces: list[int]) -> None:
    q = torch.arange(128)
    k = torch.arange(128)
    while not stop.is_set():
        make_fx(mask_fn)(q, k)
        traces[0] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument(
        "--nested-fx",
        choices=("eager", "error"),
        default="eager",
        help="eager: error_on_nested_fx_trace=False (the step runs eager while the "
        "other thread traces); error: torch's default (the step raises)",
    )
    parser.add_argument("--no-tracer", action="store_true", help="train without the tracing thread")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    torch._dynamo.config.error_on_nested_fx_trace = args.nested_fx == "error"
    model = TinyLM(args.vocab, args.dim, args.blocks)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def forward_loss(tokens: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            _count_eager()
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))

    step_fn = torch.compile(forward_loss)
    data = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    # Compile before the race starts: the race is about entering a compiled
    # function, not about compiling one.
    t_compile = time.perf_counter()
    step_fn(data).backward()
    opt.zero_grad()
    print(
        f"torch {torch.__version__}: compiled in {time.perf_counter() - t_compile:.1f} s, "
        f"racing={not args.no_tracer}",
        flush=True,
    )

    stop = threading.Event()
    traces = [0]
    tracer = threading.Thread(target=tracer_loop, args=(stop, traces), daemon=True)
    if not args.no_tracer:
        tracer.start()
    tokens_per_step = args.batch * args.seq
    try:
        for step in range(args.steps):
            before = _EAGER_CALLS[0]
            t0 = time.perf_counter()
            loss = step_fn(data)
            loss.backward()
            opt.step()
            opt.zero_grad()
            elapsed = time.perf_counter() - t0
            compiled = 0 if _EAGER_CALLS[0] > before else 1
            print(
                f"step {step}: {tokens_per_step / elapsed:.0f} tok/s compiled={compiled} "
                f"loss={loss.item():.3f}",
                flush=True,
            )
    finally:
        stop.set()
        # A tracer still inside make_fx at interpreter exit aborts the process
        # ("terminate called without an active exception").
        if tracer.is_alive():
            tracer.join()
    print(f"tracer: {traces[0]} traces, {_EAGER_CALLS[0]} eager steps", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
