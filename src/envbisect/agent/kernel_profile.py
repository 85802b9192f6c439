"""torch.profiler around a few training steps of the probed program (stdlib only at import,
Python 3.8+ syntax; run beside ``envbisect.agent.probe`` in the probed program, torch used
only once the program itself imported ``torch.optim``).

Asked for by the probe's config (``$ENVBISECT_PROBE``)::

    "profile": {"steps": 3, "skip": 3, "trace": "/path/probe.trace.json", "top": 300}

The step rule (the probe's step timing uses the same one): **a training step ends when an
optimizer's ``step()`` returns**, seen through torch.optim's global post-hook
(``register_optimizer_step_post_hook``, called for every optimizer). Each call counts: a
program whose iteration steps two optimizers counts two. Steps ``1..skip`` are warm-up
(compiles, autotuning, the allocator growing); the profiler starts when step ``skip`` ends
and stops when step ``skip + steps`` ends, so it holds ``steps`` whole steps: data, forward,
backward and update (the ``Optimizer.step`` ranges at the window's two edges are as the
profiler recorded them; the work inside is in). On CUDA the device is synchronized at the
start and before the stop, so the window's wall time is the steps' own. The profiler's
library (Kineto) may note its start and stop on the program's stderr. A program that ends
first is stopped at exit with the steps it saw; one that never steps an optimizer is not
profiled, and its facts say so.

Overhead is bounded: ``steps`` at most ``MAX_STEPS``, no shapes, stacks or memory recorded.
What comes back (``facts()["profile"]``): the window (steps, wall time per step, device),
the Chrome trace's path (``export_chrome_trace``: opens in Perfetto) and ``key_averages``
reduced to the ``top`` rows by self time: name, kind (``op``: a CPU-side operator or
runtime call; ``kernel``: device work), count, self/total CPU and device microseconds.
"""

from __future__ import annotations

import contextlib
import os
import time

MAX_STEPS = 20
TOP = 300
STATE = {
    "config": None,  # the "profile" config, when asked for
    "seen": 0,  # optimizer steps seen so far
    "prof": None,  # the running torch.profiler.profile
    "t0": None,
    "cuda": False,
    "result": None,  # what facts() reports, once stopped
}


def configure(config):
    """Keep the probe config's ``profile`` part (a dict), or nothing when it has none."""
    wanted = config.get("profile") if isinstance(config, dict) else None
    if not isinstance(wanted, dict):
        return
    steps = min(MAX_STEPS, max(1, int(wanted.get("steps") or 3)))
    skip = max(1, int(wanted.get("skip") or 3))
    trace = wanted.get("trace")
    rank = os.environ.get("RANK")
    if trace and rank not in (None, "", "0"):
        trace = f"{trace}.rank{rank}"
    top = max(1, int(wanted.get("top") or TOP))
    STATE["config"] = {"steps": steps, "skip": skip, "trace": trace, "top": top}


def with_hooks(hooks):
    """The probe's post-import hooks with the profiler's added (when asked for); a hook on
    the same module as another runs after it."""
    if STATE["config"] is None:
        return dict(hooks)
    out = dict(hooks)
    before = out.get("torch.optim")

    def hook(mod):
        if before is not None:
            with contextlib.suppress(Exception):
                before(mod)
        _hook_optim(mod)

    out["torch.optim"] = hook
    return out


def _hook_optim(mod):
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_after_step)


def _after_step(optimizer, args, kwargs):
    config = STATE["config"]
    STATE["seen"] += 1
    seen = STATE["seen"]
    try:
        if seen == config["skip"] and STATE["prof"] is None and STATE["result"] is None:
            _start()
        elif seen == config["skip"] + config["steps"] and STATE["prof"] is not None:
            _stop(f"after step {seen}")
    except Exception as exc:  # the program goes on; the fact says why there is no table
        STATE["prof"] = None
        STATE["result"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}


def _start():
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    cuda = bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    if cuda:
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    prof = profile(
        activities=activities, record_shapes=False, with_stack=False, profile_memory=False
    )
    prof.start()
    STATE.update(prof=prof, cuda=cuda, t0=time.perf_counter())


def _stop(when):
    import torch

    prof = STATE["prof"]
    STATE["prof"] = None
    if STATE["cuda"]:
        torch.cuda.synchronize()
    wall = time.perf_counter() - STATE["t0"]
    prof.stop()
    config = STATE["config"]
    steps = STATE["seen"] - config["skip"]
    result = {
        "steps": steps,
        "skip": config["skip"],
        "stopped": when,
        "device": "cuda" if STATE["cuda"] else "cpu",
        "window_s": round(wall, 6),
        "step_us": round(wall * 1e6 / steps, 3) if steps else None,
        "trace": None,
    }
    rows = _rows(prof.key_averages())
    result["rows_total"] = len(rows)
    result["rows"] = rows[: config["top"]]
    if config["trace"]:
        try:
            prof.export_chrome_trace(config["trace"])
            os.chmod(config["trace"], 0o600)  # what the program ran: its owner's alone
            result["trace"] = config["trace"]
        except Exception as exc:
            result["trace_error"] = f"{type(exc).__name__}: {exc}"[:300]
    STATE["result"] = result


def _rows(averages):
    rows = []
    for e in averages:
        device = str(getattr(e, "device_type", "")).rsplit(".", 1)[-1].lower()
        self_dev = float(getattr(e, "self_device_time_total", 0) or 0)
        row = {
            "name": str(e.key),
            "kind": "op" if device in ("", "cpu") else "kernel",
            "count": int(e.count),
            "self_cpu_us": round(float(e.self_cpu_time_total), 3),
            "cpu_us": round(float(e.cpu_time_total), 3),
            "self_device_us": round(self_dev, 3),
            "device_us": round(float(getattr(e, "device_time_total", 0) or 0), 3),
        }
        if getattr(e, "is_user_annotation", False):
            row["kind"] = "annotation"
        rows.append(row)
    rows.sort(key=lambda r: (-max(r["self_cpu_us"], r["self_device_us"]), r["name"]))
    return rows


def facts():
    """The profile fact (see the module doc), stopping a profiler still running at exit;
    None when no profile was asked for."""
    config = STATE["config"]
    if config is None:
        return None
    if STATE["prof"] is not None:
        try:
            _stop("at exit")
        except Exception as exc:
            STATE["result"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if STATE["result"] is not None:
        return dict(STATE["result"], optimizer_steps=STATE["seen"])
    return {
        "steps": 0,
        "skip": config["skip"],
        "optimizer_steps": STATE["seen"],
        "note": (
            "no optimizer step seen: nothing profiled (the window starts when "
            f"optimizer step {config['skip']} ends)"
        ),
    }
