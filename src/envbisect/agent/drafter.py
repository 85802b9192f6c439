"""The built-in smoke test: training steps of a DFlash block-diffusion drafter.

Self-contained (stdlib + torch, Python 3.8+ syntax) so that it can be shipped on stdin to the
*target* Python, where envbisect is not installed: this entry module and the ``drafter_*``
modules it names in ``AGENT_REQUIRES`` (parameters, model, training, facts) travel together.
Three ways to run it:

* as an agent: ``Transport().run_agent(python, "envbisect.agent.drafter", params)``;
* ``python -m envbisect.agent.drafter [flags]``;
* ``python path/to/drafter.py [flags]`` (with its ``envbisect`` package tree beside it).

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
import json
import math
import os
import sys
import time

if __name__ == "__main__" and not __package__:  # pragma: no cover - run by path
    # ``python path/to/drafter.py``: the drafter_* modules are found in the tree it sits in.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from envbisect.agent.drafter_facts import CpuWindow, device_facts, loadavg, set_cpu_threads
from envbisect.agent.drafter_params import (
    COMPILE_UNITS,
    ENV_REPORTED,
    FLEX_DECODING,
    MASK_BUILDS,
    NESTED_FX,
    PRESETS,
    RESULT_ENV,
    RESULT_KEYS,
    RESULT_PREFIX,
    SCHEMA,
    error_dict,
    log,
    read_lengths,
    resolve_params,
)
from envbisect.agent.drafter_train import (
    finish,
    record_compile_facts,
    record_setup,
    record_threads,
    record_versions,
    throughput,
    train_drafters,
)

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = (
    "envbisect.agent.drafter_facts",
    "envbisect.agent.drafter_params",
    "envbisect.agent.drafter_train",
)


def run(params):
    """Run the smoke test described by ``params``; always returns a result dict."""
    t_start = time.perf_counter()
    result = {key: None for key in RESULT_KEYS}
    result.update({"schema": SCHEMA, "ok": False, "flex_fallback": False})
    result["env"] = {k: os.environ[k] for k in ENV_REPORTED if k in os.environ}
    try:
        import torch
    except Exception as exc:
        result["error"] = error_dict(exc)
        return finish(result, t_start)
    record_versions(result, torch)
    try:
        p = resolve_params(params, torch.cuda.is_available())
        lengths = read_lengths(p["data"]) if p["data"] else None
    except (ValueError, OSError) as exc:
        result["error"] = error_dict(exc)
        result["error"]["stage"] = "params"
        return finish(result, t_start)
    record_setup(result, p, lengths)
    result["cpu"] = set_cpu_threads(torch, p)
    during = CpuWindow()
    try:
        dev_facts = device_facts(torch, p["device"])
    except Exception as exc:
        result["error"] = error_dict(exc)
        return finish(result, t_start)
    result["device"] = dev_facts
    outs, per_thread, recorded = train_drafters(torch, p, lengths, result)
    busy = during.others_busy_cores()
    result["cpu"].update(
        load_end=loadavg(), busy_cores_during=None if busy is None else round(busy, 2)
    )
    record_compile_facts(result, torch, p, outs, recorded)
    errors = record_threads(result, outs, per_thread)
    losses = outs[0].get("losses") or []
    result["loss"] = {"first": losses[0], "last": losses[-1]} if losses else None
    warm = [o["warmup_s"] for o in outs if o.get("warmup_s") is not None]
    result["warmup_s"] = max(warm) if warm else None
    first = outs[0].get("warmup_steps_s") or []
    result["first_step_s"] = first[0] if first else None
    if errors:
        result["error"] = errors[0]
        return finish(result, t_start)
    throughput(result, p, outs, dev_facts)
    result["ok"] = all(math.isfinite(x) for x in losses)
    if not result["ok"]:
        result["error"] = {
            "class": "NonFiniteLoss",
            "message": f"loss became {losses[-1]!r}",
        }
    return finish(result, t_start)


def deliver(result, *, framed):
    """Write the stdout line and the $ENVBISECT_RESULT file."""
    line = RESULT_PREFIX + json.dumps(result, sort_keys=True, default=str)
    target = os.environ.get(RESULT_ENV)
    if target:
        tmp = target + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
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
    ap.add_argument("--flex-decoding", choices=FLEX_DECODING, default=None)
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
