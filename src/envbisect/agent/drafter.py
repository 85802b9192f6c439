"""The built-in smoke test: training steps of a DFlash block-diffusion drafter.

Self-contained (stdlib + torch, Python 3.8+ syntax) so that it can be shipped on stdin to the
*target* Python, where envbisect is not installed. Three ways to run it:

* as an agent: ``Transport().run_agent(python, "envbisect.agent.drafter", params)``;
* ``python -m envbisect.agent.drafter [flags]``;
* ``python path/to/drafter.py [flags]``.

Each run yields one JSON result (see ``RESULT_KEYS``), delivered as the agent frame, as one
stdout line ``ENVBISECT_RESULT {json}`` and into the file named by ``$ENVBISECT_RESULT``.
Progress goes to stderr. A crash (OOM, compile error, the FX-flag RuntimeError) is a result
with ``ok: false``, never only a traceback.

The workload follows the published DFlash recipe: Qwen3-style decoder layers (RMSNorm,
q/k-norm, RoPE, grouped-query attention, SwiGLU) with non-causal attention; hidden states of
several target layers (random stand-ins) are concatenated, projected by ``fc`` and normalised;
in every layer K/V = cat(context, noise block) and Q comes from the noise block only. Each
anchor opens a block of ``block_size`` slots (slot 0 the anchor token, the rest MASK); a block
sees context strictly before its anchor and its own block bidirectionally. Slot k predicts
token anchor+k with weight exp(-(k-1)/gamma). Embedding and lm_head are frozen.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import sys
import threading
import time
import traceback
import warnings

RESULT_PREFIX = "ENVBISECT_RESULT "
RESULT_ENV = "ENVBISECT_RESULT"
SAMPLES_ENV = "ENVBISECT_SAMPLES"
SCHEMA = "envbisect/smoke@1"

# Keys every result carries (values may be null when a run failed before knowing them).
RESULT_KEYS = (
    "schema",
    "ok",
    "error",
    "tok_per_s",
    "warmup_s",
    "step_s",
    "mfu",
    "tflops",
    "device",
    "attn",
    "compile",
    "torch",
    "triton",
    "preset",
    "dims",
    "dynamo",
    "flex_fallback",
    "fx_tracing",
    "memory",
    "env",
    "inductor_cache",
    "threads",
    "data",
    "loss",
    "samples",
    "race",
    "compile_times",
    "cpu",
    "elapsed_s",
)

# Dense bf16 tensor-core peaks (no sparsity), by device-name substring.
BF16_PEAK_TFLOPS = (("H200", 989.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0))

PRESETS = {
    # CPU: a couple of small layers, seconds end to end.
    "tiny": {
        "hidden": 256,
        "layers": 2,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 64,
        "intermediate": 768,
        "vocab": 4096,
        "target_layers": 3,
        "seq_len": 256,
        "anchors": 16,
        "batch": 2,
        "warmup": 3,
        "steps": 20,
        "loss_chunk": 512,
    },
    # Drafter of a Qwen3-8B target: H=4096, 32/8 heads of 128, 5 layers, 5 target layers.
    "h200": {
        "hidden": 4096,
        "layers": 5,
        "heads": 32,
        "kv_heads": 8,
        "head_dim": 128,
        "intermediate": 12288,
        "vocab": 151936,
        "target_layers": 5,
        "seq_len": 3072,
        "anchors": 512,
        "batch": 1,  # measured: 52% MFU on an H200 (benchmarks/RESULTS.md)
        "warmup": 3,
        "steps": 8,
        "loss_chunk": 4096,
    },
}

DEFAULTS = {
    "preset": "auto",
    "device": "auto",
    "attn": "auto",
    "compile": None,  # None: on for CUDA, off for CPU
    "compile_backend": "inductor",
    "compile_mode": None,
    "vary_shapes": False,
    "data": None,
    "drafter_threads": 1,
    "seed": 0,
    "block_size": 16,
    "gamma": 7.0,
    "lr": 3e-4,
    "dtype": "auto",
    "peak_tflops": None,
    "cuda_graphs": False,
    # how torch.compile is applied: "model" (the whole drafter, one graph), "layer" (each
    # decoder layer: regional compilation, one graph reused by every layer), "flex" (only
    # flex_attention and the loss, the rest eager: a model file's
    # ``flex_attention = torch.compile(flex_attention)``)
    # "auto": "flex" with two or more drafter threads (the field's pattern, the one measured
    # to reproduce its race on the H200), else "layer"
    "compile_unit": "auto",
    # when block masks are built: "step" (every step, in the drafter's own thread, as a data
    # loader with per-batch anchors does), "locked" (every step, under one process-wide
    # lock), "once" (once per drafter, before the threads start; batches reuse its anchors)
    "mask_build": "step",
    # build block masks with create_block_mask(..., _compile=True): "auto" = only with two
    # or more drafter threads (the field's data-loader pattern). Measured on the H200: the
    # compiled mask of the h200 preset alone takes over 200 s to compile cold, the eager
    # one milliseconds (benchmarks/RESULTS.md)
    "mask_compile": "auto",
    # dynamo's check for a call made while some thread FX-traces: "error" (torch's default,
    # the field's RuntimeError), "unoptimized" (error_on_nested_fx_trace = False: the call
    # runs without dynamo), "force" (force_compile_during_fx_trace = True, torch >= 2.11)
    "nested_fx": "error",
    "patch_module": None,  # a .py file imported before the drafters are built
    "samples": 1,  # timed windows of `steps` steps each, after one warm-up
    # CPU threads of torch's intra-op pool on a CPU device: None sizes them to the cores
    # this process may use (affinity) minus those busy at start; the tiny preset takes one
    # (its ops are too small to share: with two threads every barrier waits on a thread
    # another process descheduled). $OMP_NUM_THREADS, when set, is left as torch read it.
    "cpu_threads": None,
}

COMPILE_UNITS = ("model", "layer", "flex")
MASK_BUILDS = ("step", "locked", "once")
NESTED_FX = ("error", "unoptimized", "force")

ENV_REPORTED = (
    "TORCH_COMPILE_DISABLE",
    "TORCHDYNAMO_DISABLE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
    "TRITON_CACHE_DIR",
    "OMP_NUM_THREADS",
    "MKL_ENABLE_INSTRUCTIONS",
    "ATEN_CPU_CAPABILITY",
    "CUDA_VISIBLE_DEVICES",
)

_FLEX_EAGER_CALLS = [0]  # flex_attention calls that ran outside a compiled graph
_MASK_LOCK = threading.Lock()  # mask_build "locked"
_TL = threading.local()  # per drafter thread: attention calls that ran outside a graph
# compile kwargs -> torch.compile(flex_attention), shared by all drafters
_COMPILED_FLEX: dict[str, object] = {}
_COMPILED_FLEX_LOCK = threading.Lock()


def _count_eager_attention():
    _TL.eager_attn = getattr(_TL, "eager_attn", 0) + 1


def compile_kwargs(p):
    kw = {"backend": p["compile_backend"]}
    if p["compile_mode"]:
        kw["mode"] = p["compile_mode"]
    return kw


def _compiled_flex(torch, flex_attention, kw):
    """One compiled flex_attention per process, as a model file's module-level
    ``flex_attention = torch.compile(flex_attention)`` gives every thread."""
    key = tuple(sorted(kw.items()))

    def flex_call(q, k, v, block_mask=None, enable_gqa=False):
        if not torch.compiler.is_compiling():  # dynamo ran it unoptimized: scores materialized
            _FLEX_EAGER_CALLS[0] += 1
            _count_eager_attention()
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)

    with _COMPILED_FLEX_LOCK:
        if key not in _COMPILED_FLEX:
            _COMPILED_FLEX[key] = torch.compile(flex_call, **kw)
        return _COMPILED_FLEX[key]


def log(msg):
    sys.stderr.write(f"[smoke] {msg}\n")
    sys.stderr.flush()


# ----------------------------------------------------------------------------- parameters


def resolve_params(params, cuda_available):
    """Merge defaults, the preset and explicit params; fill the 'auto' choices."""
    p = dict(DEFAULTS)
    if os.environ.get(SAMPLES_ENV):  # asked by envbisect run/check for a user smoke command
        try:
            p["samples"] = int(os.environ[SAMPLES_ENV])
        except ValueError:
            raise ValueError(f"${SAMPLES_ENV}={os.environ[SAMPLES_ENV]!r}: not a count") from None
    p.update({k: v for k, v in params.items() if v is not None})
    on_gpu = _resolve_device(p, cuda_available)
    _apply_preset(p, params, on_gpu)
    _resolve_backend(p, on_gpu)
    _check_sizes(p)
    _resolve_race_knobs(p)
    return p


def _check_choice(value, what, choices):
    if value not in choices:
        raise ValueError("unknown {} {!r} ({})".format(what, value, ", ".join(choices)))


def _resolve_device(p, cuda_available):
    """Settle ``device`` ("auto": cuda when torch sees one); whether it is a GPU."""
    device = p["device"]
    if device == "auto":
        device = "cuda" if cuda_available else "cpu"
    if device.startswith("cuda") and not cuda_available:
        raise ValueError(f"device {device!r} asked for but torch sees no CUDA device")
    p["device"] = device
    return device.startswith("cuda")


def _apply_preset(p, params, on_gpu):
    """Settle ``preset`` ("auto": h200 on a GPU, tiny on CPU) and fill every dimension the
    params leave unset from it."""
    preset = p["preset"]
    if preset == "auto":
        preset = "h200" if on_gpu else "tiny"
    if preset not in PRESETS:
        raise ValueError(
            "unknown preset {!r} (choose from auto, {})".format(preset, ", ".join(PRESETS))
        )
    p["preset"] = preset
    for key, value in PRESETS[preset].items():
        if params.get(key) is None:
            p[key] = value


def _resolve_backend(p, on_gpu):
    """Settle attention backend, compile and dtype: the fast path on a GPU, plain on CPU."""
    if p["attn"] == "auto":
        p["attn"] = "flex" if on_gpu else "sdpa"
    _check_choice(p["attn"], "attention backend", ("flex", "sdpa", "flex-eager"))
    if p["compile"] is None:
        p["compile"] = on_gpu
    if p["attn"] == "flex-eager":
        p["compile"] = False
    if p["dtype"] == "auto":
        p["dtype"] = "bfloat16" if on_gpu else "float32"


def _check_sizes(p):
    for key in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
        if int(p[key]) < 1:
            raise ValueError(f"{key} must be >= 1")
    if p["heads"] % p["kv_heads"]:
        raise ValueError(f"heads ({p['heads']}) must be a multiple of kv_heads ({p['kv_heads']})")
    if p["seq_len"] < 2 * p["block_size"]:
        raise ValueError("seq_len must be at least 2 * block_size")
    if int(p["drafter_threads"]) < 1:
        raise ValueError("drafter_threads must be >= 1")
    if int(p["samples"]) < 1:
        raise ValueError("samples must be >= 1")


def _resolve_race_knobs(p):
    """Settle compile unit, mask building, nested_fx and the patch module; the "auto"
    choices follow the drafter thread count (the field's pattern)."""
    threaded = int(p["drafter_threads"]) > 1
    if p["compile_unit"] == "auto":
        p["compile_unit"] = "flex" if threaded else "layer"
    _check_choice(p["compile_unit"], "compile unit", COMPILE_UNITS)
    _check_choice(p["mask_build"], "mask build", MASK_BUILDS)
    if p["mask_compile"] == "auto":
        p["mask_compile"] = bool(p["compile"]) and threaded
    elif p["mask_compile"] in ("on", "off"):
        p["mask_compile"] = p["mask_compile"] == "on"
    p["mask_compile"] = bool(p["mask_compile"])
    _check_choice(p["nested_fx"], "nested_fx", NESTED_FX)
    if p["patch_module"] and not os.path.isfile(p["patch_module"]):
        raise ValueError("patch module {!r}: no such file".format(p["patch_module"]))


def read_lengths(path):
    """Sequence lengths of a JSONL dataset: ``length``/``num_tokens``, or the size of
    ``input_ids``/``tokens``, or the word count of ``text``."""
    lengths = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{lineno}: not a JSON object") from None
            n = _record_length(rec) if isinstance(rec, dict) else None
            if n is None:
                raise ValueError(
                    f"{path}:{lineno}: no length, num_tokens, input_ids, tokens or text"
                )
            lengths.append(int(n))
    if not lengths:
        raise ValueError(f"{path}: no records")
    return lengths


def _record_length(rec):
    """One record's length, from the first field that gives one; None when none does."""
    for key in ("length", "num_tokens"):
        if isinstance(rec.get(key), int):
            return rec[key]
    for key in ("input_ids", "tokens"):
        if isinstance(rec.get(key), list):
            return len(rec[key])
    if isinstance(rec.get("text"), str):
        return len(rec["text"].split())
    return None


class ShapePlan:
    """Per-step sequence length and anchor count: fixed, varied, or driven by a dataset."""

    def __init__(self, p, lengths=None):
        self.p = p
        self.rng = random.Random(p["seed"] + 1)
        self.lengths = lengths
        self.pos = 0
        bs = p["block_size"]
        self.density = float(p["anchors"]) / p["seq_len"]
        lo = max(2 * bs, (p["seq_len"] // 2) // bs * bs)
        self.choices = list(range(lo, p["seq_len"] + 1, bs))

    def anchors_for(self, length):
        bs = self.p["block_size"]
        n = int(round(length * self.density))
        return max(1, min(n, length - bs))

    def next(self):
        """(padded length, anchors, real tokens in the batch) for the next step."""
        p, bs = self.p, self.p["block_size"]
        if self.lengths is not None:
            batch = []
            for _ in range(p["batch"]):
                batch.append(self.lengths[self.pos % len(self.lengths)])
                self.pos += 1
            batch = [max(2 * bs, n) for n in batch]
            length = max(batch)
            return length, self.anchors_for(length), sum(batch)
        if p["vary_shapes"]:
            length = self.rng.choice(self.choices)
            return length, self.anchors_for(length), length * p["batch"]
        return p["seq_len"], p["anchors"], p["seq_len"] * p["batch"]


# ----------------------------------------------------------------------------- the model


def build_model_classes(torch):
    """The Drafter module class, built on ``torch`` (imported by the caller, so this module
    imports without it)."""
    nn = torch.nn
    RMSNorm, rope = _norm_and_rope(torch)
    DecoderLayer = _decoder_layer_class(torch, RMSNorm, rope)

    class Drafter(nn.Module):
        """Trainable part: fc + hidden_norm, the decoder layers and the final norm."""

        def __init__(self, p):
            super().__init__()
            h = p["hidden"]
            self.fc = nn.Linear(p["target_layers"] * h, h, bias=False)
            self.hidden_norm = RMSNorm(h)
            self.layers = nn.ModuleList([DecoderLayer(p) for _ in range(p["layers"])])
            self.norm = RMSNorm(h)
            hd = p["head_dim"]
            inv = 1.0 / (1000000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, noise_emb, target_hidden, q_pos, k_pos, attend):
            ctx = self.hidden_norm(self.fc(target_hidden))
            x = noise_emb
            for layer in self.layers:
                x = layer(x, ctx, q_pos, k_pos, self.inv_freq, attend)
            return self.norm(x)

    return Drafter


def _norm_and_rope(torch):
    """(RMSNorm module class, rope function): the Qwen3 pieces every layer uses."""

    class RMSNorm(torch.nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (xf * self.weight.float()).to(x.dtype)

    def rope(x, pos, inv_freq):
        # x: (B, L, h, d); pos: (B, L)
        freqs = pos.unsqueeze(-1).float() * inv_freq  # (B, L, d/2)
        cos = torch.cos(freqs).unsqueeze(2)
        sin = torch.sin(freqs).unsqueeze(2)
        x1, x2 = x.float().chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.to(x.dtype)

    return RMSNorm, rope


def _decoder_layer_class(torch, RMSNorm, rope):
    """One decoder layer: q/k-normed GQA attention over cat(context, noise), then SwiGLU."""
    nn = torch.nn
    F = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self, p):
            super().__init__()
            h, nh, nkv, hd = p["hidden"], p["heads"], p["kv_heads"], p["head_dim"]
            self.nh, self.nkv, self.hd = nh, nkv, hd
            self.q_proj = nn.Linear(h, nh * hd, bias=False)
            self.k_proj = nn.Linear(h, nkv * hd, bias=False)
            self.v_proj = nn.Linear(h, nkv * hd, bias=False)
            self.o_proj = nn.Linear(nh * hd, h, bias=False)
            self.q_norm = RMSNorm(hd)
            self.k_norm = RMSNorm(hd)

        def forward(self, x, ctx, q_pos, k_pos, inv_freq, attend):
            b, t, _ = x.shape
            s = ctx.shape[1]
            q = self.q_norm(self.q_proj(x).view(b, t, self.nh, self.hd))
            kv_in = torch.cat([ctx, x], dim=1)  # KV injection: context, then the noise blocks
            k = self.k_norm(self.k_proj(kv_in).view(b, s + t, self.nkv, self.hd))
            v = self.v_proj(kv_in).view(b, s + t, self.nkv, self.hd)
            q = rope(q, q_pos, inv_freq).transpose(1, 2)
            k = rope(k, k_pos, inv_freq).transpose(1, 2)
            v = v.transpose(1, 2)
            o = attend(q, k, v)  # (b, nh, t, hd)
            return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))

    class MLP(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.gate_proj = nn.Linear(p["hidden"], p["intermediate"], bias=False)
            self.up_proj = nn.Linear(p["hidden"], p["intermediate"], bias=False)
            self.down_proj = nn.Linear(p["intermediate"], p["hidden"], bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class DecoderLayer(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.input_layernorm = RMSNorm(p["hidden"])
            self.self_attn = Attention(p)
            self.post_attention_layernorm = RMSNorm(p["hidden"])
            self.mlp = MLP(p)

        def forward(self, x, ctx, q_pos, k_pos, inv_freq, attend):
            x = x + self.self_attn(self.input_layernorm(x), ctx, q_pos, k_pos, inv_freq, attend)
            return x + self.mlp(self.post_attention_layernorm(x))

    return DecoderLayer


# ----------------------------------------------------------------------------- masks


def dflash_mask_dense(torch, anchors, ctx_len, block_size):
    """Boolean (B, T, S+T) mask, True = may attend. T = anchors * block_size.

    Query slot q belongs to block q // block_size; it sees context positions strictly
    before that block's anchor and every slot of its own block, nothing of other blocks.
    """
    b, n = anchors.shape
    t = n * block_size
    q_block = torch.arange(t, device=anchors.device) // block_size  # (T,)
    kv = torch.arange(ctx_len + t, device=anchors.device)  # (S+T,)
    anchor_of_q = anchors[:, q_block]  # (B, T)
    ctx_ok = (kv[None, None, :] < ctx_len) & (kv[None, None, :] < anchor_of_q[:, :, None])
    kv_block = (kv - ctx_len).clamp(min=0) // block_size
    own = (kv[None, :] >= ctx_len) & (kv_block[None, :] == q_block[:, None])  # (T, S+T)
    return ctx_ok | own[None]


def dflash_mask_mod(anchors, ctx_len, block_size):
    """The same mask as a flex_attention mask_mod."""

    def mask_mod(b, h, q_idx, kv_idx):
        blk = q_idx // block_size
        in_ctx = kv_idx < ctx_len
        before_anchor = kv_idx < anchors[b, blk]
        own = (kv_idx - ctx_len) // block_size == blk
        return (in_ctx & before_anchor) | (~in_ctx & own)

    return mask_mod


def attended_pairs(anchors, block_size):
    """Number of (query, key) pairs the mask lets through, summed over the batch."""
    # a block with anchor a: block_size queries x (a context keys + block_size own keys)
    return int((anchors.sum().item() + anchors.numel() * block_size) * block_size)


def _block_mask(create_block_mask, anchors, ctx_len, block_size, compiled):
    """The DFlash mask of one batch as a flex_attention BlockMask (``create_block_mask`` is
    passed in: this module imports without torch)."""
    b, n = anchors.shape
    t = n * block_size
    mod = dflash_mask_mod(anchors, ctx_len, block_size)
    kw = {"device": anchors.device}
    if compiled:
        kw["_compile"] = True
    try:
        return create_block_mask(mod, b, None, t, ctx_len + t, **kw)
    except TypeError:  # older torch without _compile
        kw.pop("_compile", None)
        return create_block_mask(mod, b, None, t, ctx_len + t, **kw)


# ----------------------------------------------------------------------------- loss


def make_chunk_loss(torch):
    def chunk_loss(h, weight, labels, wts):
        """Weighted CE of one chunk and its gradient w.r.t. h (lm_head is frozen)."""
        logits = (h @ weight.t()).float()
        lse = torch.logsumexp(logits, dim=-1)
        tgt = logits.gather(1, labels.unsqueeze(1)).squeeze(1)
        loss = ((lse - tgt) * wts).sum()
        probs = torch.exp(logits - lse.unsqueeze(1))
        onehot = torch.zeros_like(probs).scatter_(1, labels.unsqueeze(1), 1.0)
        grad_logits = ((probs - onehot) * wts.unsqueeze(1)).to(h.dtype)
        return loss, grad_logits @ weight

    return chunk_loss


def equal_chunks(n, chunk):
    """(chunk size, padded rows): the fewest chunks of at most ``chunk`` rows, all equal."""
    count = max(1, -(-n // chunk))
    size = -(-n // count)
    return size, size * count


def make_linear_ce(torch, chunk_fn, chunk):
    """Chunked, fused lm_head + weighted cross-entropy: never holds all logits at once.

    The gradient w.r.t. the hidden states is computed chunk by chunk in the forward pass
    (the lm_head weight needs none), so the FLOPs are exactly fwd + input-grad matmuls.
    """

    class LinearCE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, weight, labels, wts):
            n = h.shape[0]
            # equal chunks, the last one padded with zero-weight rows: one shape, so the
            # compiled chunk function compiles once instead of again for a shorter tail
            size, padded = equal_chunks(n, chunk)
            norm = wts.sum()
            if padded > n:
                extra = padded - n
                h = torch.cat([h, h.new_zeros(extra, h.shape[1])])
                labels = torch.cat([labels, labels.new_zeros(extra)])
                wts = torch.cat([wts, wts.new_zeros(extra)])
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            grad = torch.empty_like(h)
            for i in range(0, padded, size):
                loss_i, grad_i = chunk_fn(
                    h[i : i + size], weight, labels[i : i + size], wts[i : i + size]
                )
                total = total + loss_i
                grad[i : i + size] = grad_i
            ctx.save_for_backward(grad[:n], norm)
            return total / norm

        @staticmethod
        def backward(ctx, g):
            grad, norm = ctx.saved_tensors
            return grad * (g / norm).to(grad.dtype), None, None, None

    return LinearCE.apply


# ----------------------------------------------------------------------------- one drafter


class Trainer:
    """One drafter with its optimizer, batches and step function."""

    def __init__(self, torch, p, index=0, lengths=None):
        self.torch = torch
        self.p = p
        self.index = index
        self.device = torch.device(p["device"])
        self.on_gpu = self.device.type == "cuda"
        self.dtype = getattr(torch, p["dtype"])
        torch.manual_seed(p["seed"] + index)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(p["seed"] * 1000 + index)
        Drafter = build_model_classes(torch)
        self.model = Drafter(p).to(self.device)
        # Frozen embedding and lm_head of the target, kept in the compute dtype.
        h, v = p["hidden"], p["vocab"]
        self.embed = (torch.randn(v, h, generator=self.gen, device=self.device) * 0.02).to(
            self.dtype
        )
        self.lm_head = (torch.randn(v, h, generator=self.gen, device=self.device) * 0.02).to(
            self.dtype
        )
        self.mask_token = v - 1
        opt_kw = {"lr": p["lr"], "weight_decay": 0.0}
        if self.on_gpu:
            opt_kw["fused"] = True
        self.opt = torch.optim.AdamW(self.model.parameters(), **opt_kw)
        self.shapes = ShapePlan(dict(p, seed=p["seed"] + index), lengths)
        bs, gamma = p["block_size"], p["gamma"]
        self.slot_w = torch.tensor(
            [math.exp(-(k - 1) / gamma) for k in range(1, bs)],
            dtype=torch.float32,
            device=self.device,
        )
        chunk_fn = make_chunk_loss(torch)
        self.forward = self.model
        self.flex = None  # the flex_attention this drafter calls
        if p["compile"]:
            kw = compile_kwargs(p)
            unit = p["compile_unit"]
            if unit == "model":
                self.forward = torch.compile(self.model, **kw)
            elif unit == "layer":
                for layer in self.model.layers:
                    layer.compile(**kw)  # regional: one graph, reused by every layer
            chunk_fn = torch.compile(chunk_fn, **kw)
        self.linear_ce = make_linear_ce(torch, chunk_fn, int(p["loss_chunk"]))
        self.attend_factory = self._attention_factory()
        self.fixed_batch = None  # mask_build "once": the batch whose mask every step reuses
        self.fixed_attend = None
        self.mask_builds = 0
        self.steps_done = 0

    # -- attention backends
    def _attention_factory(self):
        """``factory(anchors, ctx_len) -> attend(q, k, v)`` for the configured backend."""
        if self.p["attn"] == "sdpa":
            return self._sdpa_factory()
        return self._flex_factory()

    def _sdpa_factory(self):
        """Dense-mask scaled_dot_product_attention (K/V heads repeated for GQA)."""
        torch, p = self.torch, self.p
        F = torch.nn.functional
        bs = p["block_size"]
        gqa = p["heads"] != p["kv_heads"]
        rep = p["heads"] // p["kv_heads"]
        # the "flex" compile unit leaves sdpa eager by design: not a fallback
        sdpa_compiled = p["compile_unit"] != "flex"

        def factory(anchors, ctx_len):
            mask = dflash_mask_dense(torch, anchors, ctx_len, bs).unsqueeze(1)

            def attend(q, k, v):
                if not torch.compiler.is_compiling() and sdpa_compiled:
                    _count_eager_attention()
                if gqa:
                    k = k.repeat_interleave(rep, dim=1)
                    v = v.repeat_interleave(rep, dim=1)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

            return attend

        return factory

    def _flex_factory(self):
        """flex_attention with a block mask built per batch (compiled per ``mask_compile``)."""
        torch, p = self.torch, self.p
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        bs = p["block_size"]
        gqa = p["heads"] != p["kv_heads"]
        compiled_mask = bool(p["mask_compile"])
        flex = flex_attention
        if p["compile"] and p["compile_unit"] == "flex":
            flex = _compiled_flex(torch, flex_attention, compile_kwargs(p))

        def factory(anchors, ctx_len):
            block_mask = _block_mask(create_block_mask, anchors, ctx_len, bs, compiled_mask)

            def attend(q, k, v):
                if not torch.compiler.is_compiling() and flex is flex_attention:
                    _FLEX_EAGER_CALLS[0] += 1  # the unfused path: scores materialized
                    _count_eager_attention()
                if gqa:
                    return flex(q, k, v, block_mask=block_mask, enable_gqa=True)
                return flex(q, k, v, block_mask=block_mask)

            return attend

        return factory

    def build_attend(self, batch):
        """The step's attention (its mask built now, as the mask_build knob says)."""
        if self.fixed_attend is not None:
            return self.fixed_attend
        self.mask_builds += 1
        if self.p["mask_build"] == "locked":
            with _MASK_LOCK:
                return self.attend_factory(batch["anchors"], batch["length"])
        return self.attend_factory(batch["anchors"], batch["length"])

    def prebuild_mask(self):
        """mask_build "once": build one batch and its mask now; every step reuses both."""
        length, n, _ = self.shapes.next()
        self.fixed_batch = self.make_batch(length, n)
        self.fixed_attend = None
        self.fixed_attend = self.build_attend(self.fixed_batch)

    def next_batch(self):
        """(batch, real tokens) of the next step."""
        if self.fixed_batch is not None:
            p = self.p
            return self.fixed_batch, self.fixed_batch["length"] * p["batch"]
        length, n, real = self.shapes.next()
        return self.make_batch(length, n), real

    # -- batches
    def make_batch(self, length, n_anchors):
        """Random tokens, target hidden states and sampled anchors for one step."""
        torch, p, dev, g = self.torch, self.p, self.device, self.gen
        b, bs, v = p["batch"], p["block_size"], p["vocab"]
        tokens = torch.randint(0, v - 1, (b, length), device=dev, generator=g)
        hidden = torch.randn(
            b, length, p["target_layers"] * p["hidden"], device=dev, generator=g, dtype=self.dtype
        )
        # anchors among valid positions 1 .. length-bs (a full block must fit), sorted
        scores = torch.rand(b, length - bs, device=dev, generator=g)
        anchors = scores.topk(n_anchors, dim=1).indices.sort(dim=1).values + 1
        slots = torch.arange(bs, device=dev)
        pos = anchors.unsqueeze(-1) + slots  # (b, n, bs)
        noise_ids = torch.full((b, n_anchors, bs), self.mask_token, device=dev, dtype=torch.long)
        noise_ids[:, :, 0] = tokens.gather(1, anchors)
        labels = tokens.gather(1, pos[:, :, 1:].reshape(b, -1)).reshape(b, n_anchors, bs - 1)
        return {
            "length": length,
            "anchors": anchors,
            "hidden": hidden,
            "noise_ids": noise_ids.reshape(b, -1),
            "q_pos": pos.reshape(b, -1),
            "k_pos": torch.cat(
                [torch.arange(length, device=dev).expand(b, length), pos.reshape(b, -1)], dim=1
            ),
            "labels": labels,
        }

    def step(self, batch):
        """One optimizer step; returns the loss tensor (not synchronized)."""
        torch, p = self.torch, self.p
        b, bs = p["batch"], p["block_size"]
        attend = self.build_attend(batch)
        noise_emb = self.embed[batch["noise_ids"]]
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if self.on_gpu else _null_ctx()
        with ctx:
            out = self.forward(noise_emb, batch["hidden"], batch["q_pos"], batch["k_pos"], attend)
        n = batch["anchors"].shape[1]
        h = out.view(b, n, bs, -1)[:, :, 1:, :].reshape(-1, out.shape[-1]).to(self.dtype)
        wts = self.slot_w.repeat(b * n)
        loss = self.linear_ce(h, self.lm_head, batch["labels"].reshape(-1), wts)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def flops(self, batch):
        """Counted training FLOPs of one step (matmuls and attention; see module notes)."""
        p = self.p
        b, length, bs = p["batch"], batch["length"], p["block_size"]
        n = batch["anchors"].shape[1]
        t = n * bs
        h, nh, nkv, hd, inter = (
            p["hidden"],
            p["heads"],
            p["kv_heads"],
            p["head_dim"],
            p["intermediate"],
        )
        fc = 2.0 * b * length * p["target_layers"] * h * h
        per_layer = 2.0 * b * t * h * nh * hd * 2  # q_proj, o_proj
        per_layer += 2.0 * b * (length + t) * h * nkv * hd * 2  # k_proj, v_proj on ctx + noise
        per_layer += 2.0 * b * t * h * inter * 3  # SwiGLU
        attn = 4.0 * hd * nh * attended_pairs(batch["anchors"], bs)
        lm = 2.0 * b * n * (bs - 1) * h * p["vocab"]
        # trainable matmuls: fwd + 2x bwd; fc sees no input grad; lm_head frozen: input grad only
        return 3.0 * p["layers"] * (per_layer + attn) + 2.0 * fc + 2.0 * lm


class _null_ctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ----------------------------------------------------------------------------- running


def _sync(torch, device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _percentile(values, q):
    s = sorted(values)
    if not s:
        return None
    k = (len(s) - 1) * q
    lo, hi = int(math.floor(k)), int(math.ceil(k))
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _error_dict(exc):
    msg = str(exc).strip().splitlines()
    return {"class": type(exc).__name__, "message": (msg[0] if msg else "")[:500]}


def _wait(barrier):
    """Wait for the other drafters; a barrier broken by a drafter that died is no error for
    the survivors: they go on stepping alone, as the field's surviving threads did."""
    if barrier is None:
        return
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()


def _run_trainer(torch, tr, p, barrier, out):
    """Warm-up, then ``samples`` timed windows of ``steps`` steps; fills ``out`` (also on
    error: class, message, stage and how many steps the drafter had finished)."""
    out.update({"warmup_s": None, "windows": [], "losses": [], "warmup_steps_s": []})
    _TL.eager_attn = 0
    stage = "warmup"
    knobs = _dynamo_config(torch, _dynamo_overrides(p))
    try:
        knobs.__enter__()
        _warm_up(torch, tr, p, out)
        for _w in range(int(p["samples"])):
            stage = "barrier"
            _wait(barrier)
            stage = "timed"
            out["windows"].append(_timed_window(torch, tr, p, out["losses"]))
    except BaseException as exc:  # a crash is a result: keep class, message and stage
        out["error"] = _error_dict(exc)
        out["error"]["stage"] = stage
        out["error"]["thread"] = tr.index
        out["error"]["after_steps"] = tr.steps_done
        out["traceback"] = traceback.format_exc()
        if barrier is not None:
            barrier.abort()  # never leave the others waiting for a dead drafter
        if isinstance(exc, KeyboardInterrupt):
            raise
    finally:
        knobs.__exit__(None, None, None)
        out["eager_attention_calls"] = getattr(_TL, "eager_attn", 0)


def _warm_up(torch, tr, p, out):
    """The untimed warm-up steps (compiles happen here); records each step's time, its
    loss and the frames compiled by the first step."""
    t0 = time.perf_counter()
    for i in range(int(p["warmup"])):
        batch, _real = tr.next_batch()
        s0 = time.perf_counter()
        loss = tr.step(batch)
        out["losses"].append(float(loss.item()))
        tr.steps_done += 1
        out["warmup_steps_s"].append(time.perf_counter() - s0)
        log(f"drafter {tr.index} warm-up step {i} done at {time.perf_counter() - t0:.1f}s")
        if i == 0:
            out["frames_after_first"] = _frames_ok(torch)
    _sync(torch, p["device"])
    out["warmup_s"] = time.perf_counter() - t0


def _timed_window(torch, tr, p, losses):
    """One timed window of ``steps`` steps: step times, tokens, FLOPs and its wall time;
    each step's loss is appended to ``losses``."""
    dev = p["device"]
    window = {"step_times": [], "tokens": 0, "flops": 0.0}
    w0 = time.perf_counter()
    for _ in range(int(p["steps"])):
        batch, real = tr.next_batch()
        _sync(torch, dev)
        s0 = time.perf_counter()
        loss = tr.step(batch)
        _sync(torch, dev)
        window["step_times"].append(time.perf_counter() - s0)
        window["tokens"] += real
        window["flops"] += tr.flops(batch)
        losses.append(float(loss.item()))
        tr.steps_done += 1
    window["window_s"] = time.perf_counter() - w0
    return window


def _reset_dynamo(torch):
    try:
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        from torch._dynamo.utils import compilation_time_metrics

        compilation_time_metrics.clear()
    except Exception:
        pass


def _frames_ok(torch):
    try:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["ok"])
    except Exception:
        return 0


def _dynamo_facts(torch, frames_after_first):
    try:
        from torch._dynamo.utils import counters
    except Exception as exc:
        return {"error": _error_dict(exc)}
    frames_ok = int(counters["frames"]["ok"])
    return {
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "frames_compiled": frames_ok,
        "graph_breaks": int(sum(counters["graph_break"].values())),
        # the first line of each reason, as the probe keeps them (one fact schema)
        "graph_break_reasons": {
            (str(k).strip().splitlines() or ["?"])[0][:200]: int(v)
            for k, v in counters["graph_break"].items()
        },
        # compiles after the first step: shape changes or guard failures
        "recompiles": max(0, frames_ok - int(frames_after_first or 0)),
        "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
    }


def _fx_facts(torch):
    try:
        import torch.fx._symbolic_trace as st

        fn = st.is_fx_symbolic_tracing
        code = getattr(fn, "__code__", None)
        return {
            "flag": bool(getattr(st, "_is_fx_tracing_flag", False)),
            "is_fx_symbolic_tracing": "{}.{}".format(
                getattr(fn, "__module__", "?"), getattr(fn, "__qualname__", "?")
            ),
            "defined_in": code.co_filename if code else None,
            "module_file": getattr(st, "__file__", None),
        }
    except Exception as exc:
        return {"error": _error_dict(exc)}


def _cache_dir_facts(torch):
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    source = "env"
    if not path:
        source = "default"
        try:
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            path = cache_dir()
        except Exception:
            path = None
    files = 0
    if path and os.path.isdir(path):
        for _root, _dirs, names in os.walk(path):
            files += len(names)
    return {
        "path": path,
        "source": source,
        "files_before": files,
        "state": "warm" if files else "cold",
    }


def _memory_facts(torch, device):
    if device.startswith("cuda"):
        try:
            stats = torch.cuda.memory_stats()
            return {
                "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
                "alloc_retries": int(stats.get("num_alloc_retries", 0)),
                "ooms": int(stats.get("num_ooms", 0)),
            }
        except Exception as exc:
            return {"error": _error_dict(exc)}
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:
        rss = None
    return {"peak_rss_bytes": rss}


def _device_facts(torch, device):
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return {
            "type": "cuda",
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_bytes": int(props.total_memory),
            "sms": int(props.multi_processor_count),
        }
    return {"type": "cpu", "name": _cpu_name(), "threads": int(torch.get_num_threads())}


def _cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _peak_tflops(p, dev_facts):
    if p.get("peak_tflops"):
        return float(p["peak_tflops"])
    name = dev_facts.get("name") or ""
    if dev_facts.get("type") != "cuda":
        return None
    for key, value in BF16_PEAK_TFLOPS:
        if key in name:
            return value
    return None


def run(params):
    """Run the smoke test described by ``params``; always returns a result dict."""
    t_start = time.perf_counter()
    result = {key: None for key in RESULT_KEYS}
    result.update({"schema": SCHEMA, "ok": False, "flex_fallback": False})
    result["env"] = {k: os.environ[k] for k in ENV_REPORTED if k in os.environ}
    try:
        import torch
    except Exception as exc:
        result["error"] = _error_dict(exc)
        return _finish(result, t_start)
    _record_versions(result, torch)
    try:
        p = resolve_params(params, torch.cuda.is_available())
        lengths = read_lengths(p["data"]) if p["data"] else None
    except (ValueError, OSError) as exc:
        result["error"] = _error_dict(exc)
        result["error"]["stage"] = "params"
        return _finish(result, t_start)
    _record_setup(result, p, lengths)
    result["cpu"] = _set_cpu_threads(torch, p)
    during = CpuWindow()
    try:
        dev_facts = _device_facts(torch, p["device"])
    except Exception as exc:
        result["error"] = _error_dict(exc)
        return _finish(result, t_start)
    result["device"] = dev_facts
    outs, per_thread, recorded = _train_drafters(torch, p, lengths, result)
    busy = during.others_busy_cores()
    result["cpu"].update(
        load_end=_loadavg(), busy_cores_during=None if busy is None else round(busy, 2)
    )
    _record_compile_facts(result, torch, p, outs, recorded)
    errors = _record_threads(result, outs, per_thread)
    losses = outs[0].get("losses") or []
    result["loss"] = {"first": losses[0], "last": losses[-1]} if losses else None
    warm = [o["warmup_s"] for o in outs if o.get("warmup_s") is not None]
    result["warmup_s"] = max(warm) if warm else None
    first = outs[0].get("warmup_steps_s") or []
    result["first_step_s"] = first[0] if first else None
    if errors:
        result["error"] = errors[0]
        return _finish(result, t_start)
    _throughput(result, p, outs, dev_facts)
    result["ok"] = all(math.isfinite(x) for x in losses)
    if not result["ok"]:
        result["error"] = {
            "class": "NonFiniteLoss",
            "message": f"loss became {losses[-1]!r}",
        }
    return _finish(result, t_start)


# ----------------------------------------------------------------------------- CPU threads


def _cpu_jiffies():
    """(busy, total) jiffies of all CPUs from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def _own_cpu_s():
    """CPU seconds used by this process so far (all its threads)."""
    t = os.times()
    return t.user + t.system


class CpuWindow:
    """The CPU time other processes used while this one ran: /proc/stat's busy time minus
    this process's own, in cores (1.0: one core busy all along)."""

    def __init__(self):
        self.start = _cpu_jiffies()
        self.own = _own_cpu_s()
        self.t0 = time.monotonic()

    def others_busy_cores(self):
        end = _cpu_jiffies()
        wall = time.monotonic() - self.t0
        if self.start is None or end is None or wall <= 0:
            return None
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        busy_s = (end[0] - self.start[0]) / float(hz)
        others = busy_s - (_own_cpu_s() - self.own)
        return max(0.0, others / wall)


def _affinity():
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _loadavg():
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def size_cpu_threads(p, usable, busy_cores, omp_env):
    """(threads, why) for torch's CPU pool: asked for, $OMP_NUM_THREADS, one for the tiny
    preset, else the usable cores minus those other processes keep busy (at least one)."""
    if p.get("cpu_threads"):
        return int(p["cpu_threads"]), "asked (--cpu-threads)"
    if omp_env:
        return None, "OMP_NUM_THREADS=" + omp_env
    if p["preset"] == "tiny":
        return 1, "tiny preset: one thread (its ops are too small to share)"
    busy = int(round(busy_cores or 0.0))
    free = max(1, usable - busy)
    return free, f"{usable} usable cores, {busy} busy at start"


def _set_cpu_threads(torch, p):
    """Size torch's CPU threads before anything runs; what was seen and chosen."""
    window = CpuWindow()
    time.sleep(0.2)  # a short look at /proc/stat: what other processes are doing now
    busy = window.others_busy_cores()
    affinity = _affinity()
    threads, why = size_cpu_threads(p, len(affinity), busy, os.environ.get("OMP_NUM_THREADS"))
    if threads is not None and p["device"] == "cpu":
        torch.set_num_threads(threads)
    return {
        "threads": int(torch.get_num_threads()),
        "why": why,
        "affinity": affinity,
        "cores": os.cpu_count(),
        "load_start": _loadavg(),
        "busy_cores_start": None if busy is None else round(busy, 2),
    }


def _record_versions(result, torch):
    """torch's and triton's versions, and the inductor cache as the run finds it."""
    result["torch"] = torch.__version__
    try:
        import triton

        result["triton"] = triton.__version__
    except Exception:
        result["triton"] = None
    result["inductor_cache"] = _cache_dir_facts(torch)


def _compile_disabled_by_env():
    return os.environ.get("TORCH_COMPILE_DISABLE", "") not in ("", "0") or os.environ.get(
        "TORCHDYNAMO_DISABLE", ""
    ) not in ("", "0")


def _record_setup(result, p, lengths):
    """What the resolved params ask for: preset, attention, compile, dimensions, data."""
    result["preset"] = p["preset"]
    result["attn"] = p["attn"]
    result["compile"] = {
        "requested": bool(p["compile"]),
        "backend": p["compile_backend"] if p["compile"] else None,
        "mode": p["compile_mode"],
        "disabled_by_env": _compile_disabled_by_env(),
    }
    result["dims"] = {
        k: p[k]
        for k in (
            "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab",
            "target_layers", "seq_len", "anchors", "block_size", "batch", "warmup", "steps",
            "loss_chunk", "vary_shapes", "dtype",
        )
    }  # fmt: skip
    result["data"] = {"path": p["data"], "records": len(lengths)} if lengths else None


class _recorded_warnings:
    """Keep the message of every warning shown inside the block (and still show it)."""

    def __enter__(self):
        self.messages = []
        self.old_show = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            self.messages.append(str(message))
            self.old_show(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        return self.messages

    def __exit__(self, *exc):
        warnings.showwarning = self.old_show
        return False


def _train_drafters(torch, p, lengths, result):
    """Build and train ``drafter_threads`` drafters (``result["race"]`` says which knobs
    were applied); returns each drafter's outcome, its facts and the warnings shown.
    A failure is recorded in the first drafter's outcome, never raised."""
    n_threads = int(p["drafter_threads"])
    outs = [{} for _ in range(n_threads)]
    trainers = [None] * n_threads
    with _recorded_warnings() as recorded:
        try:
            _FLEX_EAGER_CALLS[0] = 0
            _reset_dynamo(torch)  # counters and caches are per process: make them per run
            result["race"] = _apply_race_knobs(torch, p)
            if p["device"].startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            log(
                f"preset {p['preset']} on {result['device'].get('name')}: attn={p['attn']} "
                f"compile={p['compile']} ({p['compile_unit']}) threads={n_threads} "
                f"masks={p['mask_build']} samples={p['samples']} "
                f"cpu threads={(result.get('cpu') or {}).get('threads')}"
            )
            _build_and_train(torch, p, lengths, trainers, outs)
        except BaseException as exc:  # a patch module that fails to import, say
            outs[0].setdefault("error", _error_dict(exc))
            outs[0]["error"].setdefault("stage", "setup")
            outs[0]["traceback"] = traceback.format_exc()
    per_thread = [
        _thread_facts(p, i, tr, out)
        for i, (tr, out) in enumerate(zip(trainers, outs))  # noqa: B905
    ]
    trainers.clear()  # free the drafters before the memory facts
    return outs, per_thread, recorded


def _build_and_train(torch, p, lengths, trainers, outs):
    """Fill ``trainers`` and train them: one in this thread, several in threads of their own."""
    n_threads = len(trainers)
    # The field's drafters each built their own model in their own thread, so their
    # compiles start out of step: one thread traces while another enters a compiled
    # function. "once" builds everything here, before any thread starts.
    in_thread = n_threads > 1 and p["mask_build"] != "once"
    if not in_thread:
        try:
            for i in range(n_threads):
                trainers[i] = Trainer(torch, p, index=i, lengths=lengths)
            if p["mask_build"] == "once":
                for tr in trainers:  # here, in the main thread, before any drafter thread
                    tr.prebuild_mask()
        except BaseException as exc:
            outs[0]["error"] = _error_dict(exc)
            outs[0]["error"]["stage"] = "build"
            outs[0]["traceback"] = traceback.format_exc()
    if n_threads == 1:
        if trainers[0] is not None:
            _run_trainer(torch, trainers[0], p, None, outs[0])
    elif in_thread or all(tr is not None for tr in trainers):
        _train_in_threads(torch, p, lengths, trainers, outs)


def _train_in_threads(torch, p, lengths, trainers, outs):
    """One thread per drafter, in step at a barrier; a drafter not built yet is built in
    its own thread."""
    barrier = threading.Barrier(len(trainers))

    def drafter(i):
        if trainers[i] is None:
            try:
                trainers[i] = Trainer(torch, p, index=i, lengths=lengths)
            except BaseException as exc:
                outs[i]["error"] = dict(_error_dict(exc), stage="build", thread=i)
                outs[i]["error"]["after_steps"] = 0
                outs[i]["traceback"] = traceback.format_exc()
                barrier.abort()
                return
        _run_trainer(torch, trainers[i], p, barrier, outs[i])

    threads = [
        threading.Thread(target=drafter, args=(i,), daemon=True) for i in range(len(trainers))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _record_compile_facts(result, torch, p, outs, recorded):
    """What compiling did: fallbacks to eager attention, warnings, FX flag, dynamo's
    counters, compile times, memory, and whether compile was in effect at all."""
    fallback_warned = any("without torch.compile" in m for m in recorded)
    result["flex_fallback"] = bool(_FLEX_EAGER_CALLS[0] > 0 or fallback_warned)
    result["flex_eager_calls"] = _FLEX_EAGER_CALLS[0]
    result["warnings"] = sorted(set(m.splitlines()[0][:200] for m in recorded))[:10]
    result["fx_tracing"] = _fx_facts(torch)
    result["dynamo"] = _dynamo_facts(torch, outs[0].get("frames_after_first"))
    result["compile_times"] = _compile_times(torch)
    result["memory"] = _memory_facts(torch, p["device"])
    result["compile"]["effective"] = (
        bool(p["compile"])
        and not result["compile"]["disabled_by_env"]
        and (result["dynamo"].get("frames_compiled", 0) > 0)
    )
    result["compile"]["unit"] = p["compile_unit"]


def _record_threads(result, outs, per_thread):
    """Each drafter's outcome (tracebacks go to stderr); returns the errors, first first."""
    errors = [o["error"] for o in outs if o.get("error")]
    for o in outs:
        if o.get("traceback"):
            sys.stderr.write(o["traceback"])
    result["threads"] = {
        "count": len(outs),
        "errors": errors,
        "crashed": sum(1 for o in outs if o.get("error")),
        "died": [o["error"].get("thread", 0) for o in outs if o.get("error")],
        "per_thread": per_thread,
    }
    return errors


def _throughput(result, p, outs, dev_facts):
    """tok/s over all timed windows, one figure per window (``samples``), step times, MFU.

    Drafters step concurrently: a window's rate is the tokens of all drafters over the
    longest drafter's time for that window."""
    n_windows = min(len(o["windows"]) for o in outs)
    samples = []
    total_tokens, total_flops, total_s = 0, 0.0, 0.0
    for w in range(n_windows):
        ws = [o["windows"][w] for o in outs]
        span = max(x["window_s"] for x in ws)
        tokens = sum(x["tokens"] for x in ws)
        total_tokens += tokens
        total_flops += sum(x["flops"] for x in ws)
        total_s += span
        samples.append(tokens / span if span > 0 else None)
    steps = [t for o in outs for x in o["windows"] for t in x["step_times"]]
    per_drafter = sum(len(x["step_times"]) for x in outs[0]["windows"])
    result["samples"] = samples
    result["step_s"] = {
        "median": statistics.median(steps),
        "p10": _percentile(steps, 0.1),
        "p90": _percentile(steps, 0.9),
        "n": per_drafter,
    }
    result["timed_tokens"] = total_tokens
    # tokens over (steps per drafter x median step; drafters step concurrently): a burst of
    # load from elsewhere moves this far less than the window figure
    med = result["step_s"]["median"]
    result["tok_per_s_steady"] = total_tokens / (per_drafter * med) if med else None
    result["tok_per_s"] = total_tokens / total_s if total_s > 0 else None
    result["tflops"] = total_flops / total_s / 1e12 if total_s > 0 else None
    peak = _peak_tflops(p, dev_facts)
    result["mfu"] = result["tflops"] / peak if peak and result["tflops"] else None
    result["peak_tflops"] = peak


def _dynamo_overrides(p):
    """The dynamo options the nested_fx knob sets, in every drafter thread."""
    if p["nested_fx"] == "unoptimized":
        return {"error_on_nested_fx_trace": False}
    if p["nested_fx"] == "force":
        return {"force_compile_during_fx_trace": True}
    return {}


class _dynamo_config:
    """Set dynamo options for the current thread and restore them on exit (torch's config
    can be thread-local, so each drafter thread sets its own)."""

    def __init__(self, torch, overrides):
        self.config = torch._dynamo.config
        self.overrides = overrides
        self.saved = {}

    def __enter__(self):
        for name, value in self.overrides.items():
            self.saved[name] = getattr(self.config, name)
            setattr(self.config, name, value)
        return self

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            setattr(self.config, name, value)
        return False


def _apply_race_knobs(torch, p):
    """The field's workarounds, each through the real mechanism; returns what is done
    (the dynamo options are set per drafter thread, in ``_run_trainer``)."""
    facts = {
        "compile_unit": p["compile_unit"],
        "mask_build": p["mask_build"],
        "mask_compile": p["mask_compile"],
        "nested_fx": p["nested_fx"],
        "patch_module": None,
    }
    config = torch._dynamo.config
    if p["nested_fx"] == "force" and not hasattr(config, "force_compile_during_fx_trace"):
        raise ValueError(
            f"nested_fx 'force' needs torch >= 2.11 (this is {torch.__version__}): "
            "torch._dynamo.config has no force_compile_during_fx_trace"
        )
    for name in ("error_on_nested_fx_trace", "force_compile_during_fx_trace"):
        facts[name] = getattr(config, name, None)  # torch's value, before the overrides
    facts.update(_dynamo_overrides(p))
    if p["patch_module"]:
        facts["patch_module"] = _import_patch_module(p["patch_module"])
    facts["is_fx_symbolic_tracing"] = _fx_check_functions(torch)
    return facts


def _import_patch_module(path):
    """Import a model file by path, as a training script imports its model: whatever it
    patches at import time (``is_fx_symbolic_tracing = lambda: False``) is then in effect."""
    import hashlib
    import importlib.util

    with open(path, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    name = "envbisect_patch_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return {"path": os.path.abspath(path), "sha256": digest}


def _fx_check_functions(torch):
    """Which ``is_fx_symbolic_tracing`` the FX module and dynamo's wrapper each call: a
    patch of the module attribute reaches dynamo only where dynamo looks it up there."""
    out = {}
    for label, modname in (
        ("torch.fx._symbolic_trace", "torch.fx._symbolic_trace"),
        ("torch._dynamo.eval_frame", "torch._dynamo.eval_frame"),
    ):
        mod = sys.modules.get(modname)
        fn = getattr(mod, "is_fx_symbolic_tracing", None) if mod is not None else None
        if fn is None:
            out[label] = None
            continue
        code = getattr(fn, "__code__", None)
        out[label] = {
            "qualname": getattr(fn, "__qualname__", "?"),
            "defined_in": code.co_filename if code else None,
            "patched": getattr(fn, "__qualname__", "") == "<lambda>"
            or (code is not None and not code.co_filename.endswith("_symbolic_trace.py")),
        }
    return out


def _thread_facts(p, index, tr, out):
    """One drafter's outcome: finished or died (where, after how many steps), and the
    path its attention took (compiled, or run unoptimized by dynamo)."""
    err = out.get("error")
    eager = int(out.get("eager_attention_calls") or 0)
    steps = tr.steps_done if tr is not None else 0
    if err is not None and steps == 0 and eager == 0:
        path = "none (died before its first step)"
    elif not p["compile"]:
        path = "eager (compile off)"
    elif eager == 0:
        path = "compiled"
    else:
        path = f"unoptimized: {eager} attention calls ran outside a compiled graph"
    return {
        "index": index,
        "ok": err is None and tr is not None,
        "steps_done": tr.steps_done if tr is not None else 0,
        "error": None if err is None else {k: err.get(k) for k in ("class", "message", "stage")},
        "path": path,
        "eager_attention_calls": eager,
        "mask_builds": tr.mask_builds if tr is not None else 0,
    }


def _compile_times(torch):
    """Seconds spent per compile phase (dynamo's own counters), largest first."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except Exception:
        return None
    totals = {k: float(sum(v)) for k, v in compilation_time_metrics.items() if v}
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:12]
    return {k: round(v, 3) for k, v in top}


def _finish(result, t_start):
    result["elapsed_s"] = time.perf_counter() - t_start
    return result


def deliver(result, *, framed):
    """Write the stdout line and the $ENVBISECT_RESULT file."""
    line = RESULT_PREFIX + json.dumps(result, sort_keys=True, default=str)
    target = os.environ.get(RESULT_ENV)
    if target:
        tmp = target + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(result, fh, sort_keys=True, default=str)
            fh.write("\n")
        os.replace(tmp, target)
    if framed:
        from envbisect.agent.channel import write_stdout_line

        write_stdout_line(line)
    else:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _in_agent():
    ch = sys.modules.get("envbisect.agent.channel")
    return ch is not None and getattr(ch, "_state", {}).get("fd") is not None


def main(params):
    """Agent entry point: run, deliver the line and file, return the result for the frame."""
    result = run(dict(params or {}))
    deliver(result, framed=_in_agent())
    _summary(result)
    return result


def _summary(result):
    if result.get("ok"):
        log(
            "ok: {:.0f} tok/s, step median {:.3f}s, warm-up {:.1f}s{}".format(
                result["tok_per_s"],
                result["step_s"]["median"],
                result["warmup_s"] or 0.0,
                ", MFU %.1f%%" % (100 * result["mfu"]) if result.get("mfu") else "",
            )
        )
    else:
        err = result.get("error") or {}
        log("FAILED: {}: {}".format(err.get("class"), err.get("message")))


# ----------------------------------------------------------------------------- CLI


def build_arg_parser():
    ap = argparse.ArgumentParser(
        prog="drafter", description="DFlash drafter training smoke test (envbisect)."
    )
    ap.add_argument("--preset", choices=["auto"] + sorted(PRESETS), default=None)
    ap.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N")
    ap.add_argument("--attn", choices=["auto", "flex", "sdpa", "flex-eager"], default=None)
    ap.add_argument("--compile", dest="compile", action="store_true", default=None)
    ap.add_argument("--no-compile", dest="compile", action="store_false", default=None)
    ap.add_argument("--compile-backend", default=None)
    ap.add_argument("--compile-mode", default=None)
    ap.add_argument("--vary-shapes", action="store_true", default=None)
    ap.add_argument("--data", default=None, help="JSONL dataset whose lengths drive the batches")
    ap.add_argument("--drafter-threads", type=int, default=None)
    ap.add_argument("--compile-unit", choices=("auto",) + COMPILE_UNITS, default=None)
    ap.add_argument("--mask-build", choices=MASK_BUILDS, default=None)
    ap.add_argument("--nested-fx", choices=NESTED_FX, default=None)
    ap.add_argument("--mask-compile", choices=["auto", "on", "off"], default=None)
    ap.add_argument("--patch-module", default=None, help="a .py file imported first")
    ap.add_argument("--samples", type=int, default=None, help="timed windows after warm-up")
    ap.add_argument("--cpu-threads", type=int, default=None, help="torch CPU threads (CPU runs)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--peak-tflops", type=float, default=None)
    for key in PRESETS["tiny"]:
        ap.add_argument("--" + key.replace("_", "-"), type=int, default=None)
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--gamma", type=float, default=None)
    ap.add_argument("--lr", type=float, default=None)
    return ap


def params_from_argv(argv):
    ns = build_arg_parser().parse_args(argv)
    return {k: v for k, v in vars(ns).items() if v is not None}


def cli(argv=None):
    result = main(params_from_argv(sys.argv[1:] if argv is None else argv))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(cli())
