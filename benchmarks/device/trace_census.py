"""Run a training script and count what its compiles did: each ``torch.fx.Tracer.trace`` call
(the window in which torch up to 2.13 reports "FX is tracing" to every thread), by thread and
by the torch function that asked for it, and Dynamo's cache counters (AOTAutograd cache hits,
misses, bypasses and why; inductor FX graph cache hits and misses).

    python3 benchmarks/device/trace_census.py SCRIPT [ARGS...]

The script runs as ``__main__`` with ``ARGS``; at exit one line goes to stderr:
``census: {json}``. Its exit status is the script's. ``CENSUS_STACK=1`` also prints the whole
stack of the first trace (to see which torch frame asked for it).
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import runpy
import sys
import threading
import traceback

import torch
import torch.fx

TRACES: collections.Counter[str] = collections.Counter()
BYPASS: collections.Counter[str] = collections.Counter()
_trace = torch.fx.Tracer.trace
PLUMBING = ("/torch/fx/", "/torch/_dynamo/eval_frame.py", "/torch/_compile.py", "/torch/utils/")
DEBUG_STACK = bool(os.environ.get("CENSUS_STACK"))


def _asker() -> str:
    """The innermost torch frame above fx and the compile wrappers: which part of the compile
    traced."""
    stack = traceback.extract_stack()[:-2]
    if DEBUG_STACK and not TRACES:
        print("".join(traceback.format_list(stack)), file=sys.stderr)
    for frame in reversed(stack):
        name = frame.filename.replace("\\", "/")
        if "/torch/" in name and not any(part in name for part in PLUMBING):
            return f"{name.split('/torch/', 1)[1]}:{frame.name}"
    return "?"


def traced(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    TRACES[f"{threading.current_thread().name} {_asker()}"] += 1
    return _trace(self, *args, **kwargs)


class _Bypass(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("Bypass"):
            BYPASS[text[:160]] += 1


def report() -> None:
    from torch._dynamo.utils import counters

    doc = {
        "traces": dict(TRACES),
        "aot": dict(counters.get("aot_autograd", {})),
        "inductor": {k: v for k, v in counters.get("inductor", {}).items() if "cache" in k},
        "bypass": dict(BYPASS),
    }
    print("census: " + json.dumps(doc, sort_keys=True), file=sys.stderr, flush=True)


def main() -> None:
    torch.fx.Tracer.trace = traced  # type: ignore[method-assign]
    for name in ("torch._functorch._aot_autograd.autograd_cache", "torch._inductor.codecache"):
        log = logging.getLogger(name)
        log.addHandler(_Bypass())
        log.setLevel(logging.DEBUG)
        log.propagate = False  # torch's own handler would print every cache line
    atexit.register(report)
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
