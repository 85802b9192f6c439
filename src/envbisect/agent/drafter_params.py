"""The drafter's parameters: result keys, presets, defaults, their checks, and the shape plan
that dataset lengths drive (stdlib only, Python 3.8+ syntax; shipped with
``envbisect.agent.drafter``)."""

from __future__ import annotations

import json
import os
import random
import sys

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
    # inductor's kernel for a flex_attention query shorter than 128 rows: "off" (the main
    # flex kernel always; see drafter_model.flex_kernel_options: with varying data lengths
    # torch 2.11 cannot compile the decoding kernel for the symbolic length), "auto" (torch's
    # own choice, the decoding kernel)
    "flex_decoding": "off",
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
FLEX_DECODING = ("off", "auto")

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
    _check_choice(p["flex_decoding"], "flex decoding", FLEX_DECODING)
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


def error_dict(exc):
    msg = str(exc).strip().splitlines()
    return {"class": type(exc).__name__, "message": (msg[0] if msg else "")[:500]}
