"""Training the drafters (torch, Python 3.8+ syntax; shipped with ``envbisect.agent.drafter``):
warm-up and timed windows, drafters in threads (the field's race), and what the result
records of them."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import threading
import time
import traceback
import warnings

from envbisect.agent.drafter_facts import (
    cache_dir_facts,
    dynamo_facts,
    frames_ok,
    fx_facts,
    memory_facts,
    peak_tflops,
    reset_dynamo,
)
from envbisect.agent.drafter_model import FLEX_EAGER_CALLS, TL, Trainer
from envbisect.agent.drafter_params import error_dict, log

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = (
    "envbisect.agent.drafter_facts",
    "envbisect.agent.drafter_model",
    "envbisect.agent.drafter_params",
)

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
    TL.eager_attn = 0
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
        out["error"] = error_dict(exc)
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
        out["eager_attention_calls"] = getattr(TL, "eager_attn", 0)


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
            out["frames_after_first"] = frames_ok(torch)
    _sync(torch, p["device"])
    out["warmup_s"] = time.perf_counter() - t0


def _timed_window(torch, tr, p, losses):
    """One timed window of ``steps`` steps: step times, tokens, FLOPs, its wall time and the
    frames torch compiled meanwhile (by any drafter); each step's loss is appended to
    ``losses``."""
    dev = p["device"]
    window = {"step_times": [], "tokens": 0, "flops": 0.0}
    f0 = frames_ok(torch)
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
    window["compiled"] = max(0, frames_ok(torch) - f0)
    return window


def record_versions(result, torch):
    """torch's and triton's versions, and the inductor cache as the run finds it."""
    result["torch"] = torch.__version__
    try:
        import triton

        result["triton"] = triton.__version__
    except Exception:
        result["triton"] = None
    result["inductor_cache"] = cache_dir_facts(torch)


def _compile_disabled_by_env():
    return os.environ.get("TORCH_COMPILE_DISABLE", "") not in ("", "0") or os.environ.get(
        "TORCHDYNAMO_DISABLE", ""
    ) not in ("", "0")


def record_setup(result, p, lengths):
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


def train_drafters(torch, p, lengths, result):
    """Build and train ``drafter_threads`` drafters (``result["race"]`` says which knobs
    were applied); returns each drafter's outcome, its facts and the warnings shown.
    A failure is recorded in the first drafter's outcome, never raised."""
    n_threads = int(p["drafter_threads"])
    outs = [{} for _ in range(n_threads)]
    trainers = [None] * n_threads
    with _recorded_warnings() as recorded:
        try:
            FLEX_EAGER_CALLS[0] = 0
            reset_dynamo(torch)  # counters and caches are per process: make them per run
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
            outs[0].setdefault("error", error_dict(exc))
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
            outs[0]["error"] = error_dict(exc)
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
                outs[i]["error"] = dict(error_dict(exc), stage="build", thread=i)
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


def record_compile_facts(result, torch, p, outs, recorded):
    """What compiling did: fallbacks to eager attention, warnings, FX flag, dynamo's
    counters, compile times, memory, and whether compile was in effect at all."""
    fallback_warned = any("without torch.compile" in m for m in recorded)
    result["flex_fallback"] = bool(FLEX_EAGER_CALLS[0] > 0 or fallback_warned)
    result["flex_eager_calls"] = FLEX_EAGER_CALLS[0]
    result["warnings"] = sorted(set(m.splitlines()[0][:200] for m in recorded))[:10]
    result["fx_tracing"] = fx_facts(torch)
    result["dynamo"] = dynamo_facts(torch, outs[0].get("frames_after_first"))
    result["compile_times"] = _compile_times(torch)
    result["memory"] = memory_facts(torch, p["device"])
    result["compile"]["effective"] = (
        bool(p["compile"])
        and not result["compile"]["disabled_by_env"]
        and (result["dynamo"].get("frames_compiled", 0) > 0)
    )
    result["compile"]["unit"] = p["compile_unit"]


def record_threads(result, outs, per_thread):
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


def throughput(result, p, outs, dev_facts):
    """tok/s over all timed windows, one figure per window (``samples``), step times, MFU.

    Drafters step concurrently: a window's rate is the tokens of all drafters over the
    longest drafter's time for that window. Compiling inside a timed window (new shapes
    recompiled after the warm-up: the field's grown data) is the program's own cost, not
    the machine's noise: then the one sample is tok/s over all timed windows, the figure a
    user's own log shows, and ``compiled_in_windows`` says which windows compiled (the
    per-window rates stay in ``window_samples``)."""
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
    hot = [w for w in range(n_windows) if any(o["windows"][w].get("compiled") for o in outs)]
    if hot and result["tok_per_s"]:
        frames = sum(o["windows"][w].get("compiled", 0) for o in outs[:1] for w in hot)
        result["compiled_in_windows"] = {"windows": [w + 1 for w in hot], "frames": frames}
        result["window_samples"] = samples
        result["samples"] = [result["tok_per_s"]]
    result["tflops"] = total_flops / total_s / 1e12 if total_s > 0 else None
    peak = peak_tflops(p, dev_facts)
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
        self.config = torch._dynamo.config  # private: dynamo's options live only there
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
        "flex_decoding": p["flex_decoding"],
        "patch_module": None,
    }
    config = torch._dynamo.config  # private: dynamo's options live only there
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


def finish(result, t_start):
    result["elapsed_s"] = time.perf_counter() - t_start
    return result
