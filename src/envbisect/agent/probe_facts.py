"""What the probe has seen, and the facts it reports (stdlib only, Python 3.8+ syntax; run
beside ``envbisect.agent.probe`` in the probed program): the shared record the hooks write,
and ``facts()``, read at exit: torch.compile counters, CUDA memory and the FX flag."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

CONFIG_ENV = "ENVBISECT_PROBE"
SCHEMA = "envbisect/facts@1"
MAX_REASONS = 20  # distinct reasons kept per kind (recompiles, graph breaks, warnings)

SEEN_LOCK = threading.Lock()
tls = threading.local()
SEEN = {
    "t0": time.time(),
    "flex_eager": 0,
    "flex_graphs": 0,
    "graphs_seen": 0,
    "recompiles": {},  # reason -> count
    "warnings": {},  # (category, message) -> count
    "compiled_threads": {},  # thread ident -> name
    "thread_no": {},  # thread ident -> 1, 2, ... in order of first sight
    "tracing": {},  # thread ident -> FX traces in flight
    "flag_outside": {},  # thread number -> times the flag was seen set outside a trace
    "flag_crossed": {},  # thread number -> times it saw the global flag of another's trace
    "pid": os.getpid(),  # a forked child does not deliver (it would overwrite the facts)
    "fx_original": None,  # (function, its file) of is_fx_symbolic_tracing at import
    "thread_errors": [],
    "crash": None,
    "exit_code": None,
    "quick_exit": False,  # the probe ended the process after the program (probe.QUICK)
    "done": False,
    "serial": None,  # the lock that keeps compiles apart, in a run that asks for it
    "serial_waits": 0,  # times a thread waited for another's compile or trace
}


def serialized():
    """A context in which no other thread traces, compiles or enters a compiled function,
    when the run asked for compiles one at a time (``serialize_compiles`` in the probe's
    config: the run that makes a warm cache); else nothing. Re-entrant; a thread that waits
    longer than ``SERIAL_WAIT_S`` goes on without the lock rather than hang the run."""
    lock = SEEN["serial"]
    return contextlib.nullcontext() if lock is None else _Held(lock)


SERIAL_WAIT_S = 600


class _Held:
    def __init__(self, lock):
        self.lock = lock
        self.held = False

    def __enter__(self):
        self.held = self.lock.acquire(blocking=False)
        if not self.held:
            with SEEN_LOCK:
                SEEN["serial_waits"] += 1
            self.held = self.lock.acquire(timeout=SERIAL_WAIT_S)
        return self

    def __exit__(self, *exc):
        if self.held:
            self.lock.release()
        return False


def thread_no(ident):
    with SEEN_LOCK:
        known = SEEN["thread_no"]
        if ident not in known:
            known[ident] = len(known) + 1
        return known[ident]


def _flag(st):
    """The FX tracing flag as this thread sees it (torch ≥ 2.14: thread-local)."""
    getter = getattr(st, "_get_is_fx_tracing", None)
    if getter is not None:
        return bool(getter()), "thread-local"
    return bool(getattr(st, "_is_fx_tracing_flag", False)), "global"


def check_flag():
    """The sentinel: the flag set while no FX trace is in flight where it could come from
    (this thread for a thread-local flag, any thread for a global one)."""
    st = sys.modules.get("torch.fx._symbolic_trace")
    if st is None:
        return
    try:
        value, storage = _flag(st)
    except Exception:
        return
    if not value:
        return
    me = threading.get_ident()
    with SEEN_LOCK:
        tracing = SEEN["tracing"]
        mine = tracing.get(me, 0)
        busy = mine if storage == "thread-local" else sum(tracing.values())
    if mine:
        return
    n = thread_no(me)
    # A global flag set by another thread's trace: the field's race (torch <= 2.13).
    table = "flag_crossed" if busy else "flag_outside"
    with SEEN_LOCK:
        SEEN[table][n] = SEEN[table].get(n, 0) + 1


# ----------------------------------------------------------------------------- facts


def facts():
    """What the probe knows now, in the shared fact schema (see ``envbisect.model.facts``)."""
    out = {"schema": SCHEMA, "source": "probe", "torch": None}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = str(getattr(torch, "__version__", None))
        for key, fn in (("compile", _compile_facts), ("memory", _memory_facts)):
            try:
                out[key] = fn(torch)
            except Exception as exc:
                out[key] = {"error": f"{type(exc).__name__}: {exc}"}
    out["flex"] = {
        "eager_calls": SEEN["flex_eager"],
        "compiled_graphs": SEEN["flex_graphs"],
        "imported": "torch.nn.attention.flex_attention" in sys.modules,
    }
    out["fx"] = _fx_facts()
    alive = {t.ident for t in threading.enumerate()}
    compiled = SEEN["compiled_threads"]
    out["threads"] = {
        "called_compiled": len(compiled),
        "alive_at_exit": sorted(
            f"thread {SEEN['thread_no'].get(i, 0)} ({name})"
            for i, name in compiled.items()
            if i in alive and i != threading.main_thread().ident
        ),
        "errors": list(SEEN["thread_errors"][:MAX_REASONS]),
    }
    out["warnings"] = [
        {"category": c, "message": m, "count": n}
        for (c, m), n in sorted(SEEN["warnings"].items(), key=lambda kv: -kv[1])
    ]
    if SEEN["serial"] is not None:
        out["serialized"] = {"compiles": True, "waits": SEEN["serial_waits"]}
    out["crash"] = SEEN["crash"]
    out["exit_code"] = SEEN["exit_code"]
    if SEEN["quick_exit"]:
        out["quick_exit"] = True
    out["elapsed_s"] = round(time.time() - SEEN["t0"], 3)
    return out


def _compile_facts(torch):
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:  # torch.compile never ran
        zero = ("frames_compiled", "unique_graphs", "recompiles", "graph_breaks")
        return dict(
            dict.fromkeys(zero, 0),
            recompile_reasons={},
            graph_break_reasons={},
            compile_s=0.0,
            fxgraph_cache_hit=0,
            fxgraph_cache_miss=0,
        )
    counters = utils.counters
    breaks = {}
    for reason, n in counters["graph_break"].items():
        first = _reason(reason)
        breaks[first] = breaks.get(first, 0) + int(n)
    times = getattr(utils, "compilation_time_metrics", {}) or {}
    recompiles = dict(SEEN["recompiles"].values())
    return {
        "frames_compiled": int(counters["frames"]["ok"]),
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "recompiles": sum(recompiles.values()),
        "recompile_reasons": recompiles,
        "graph_breaks": sum(breaks.values()),
        "graph_break_reasons": dict(sorted(breaks.items(), key=lambda kv: -kv[1])[:MAX_REASONS]),
        "compile_s": round(sum(times.get("_compile.compile_inner", [])), 3),
        "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
    }


def _reason(text):
    """A graph break's reason in one line: its first, and its explanation when it has one."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    first = lines[0] if lines else "?"
    for line in lines[1:]:
        if line.startswith("Explanation:"):
            first += " (" + line[len("Explanation:") :].strip() + ")"
            break
    return first[:240]


def _memory_facts(torch):
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return {"cuda": False}
    peak, reserved, total, ooms = 0, 0, 0, 0
    for i in range(cuda.device_count()):
        peak = max(peak, int(cuda.max_memory_allocated(i)))
        reserved = max(reserved, int(cuda.max_memory_reserved(i)))
        total = max(total, int(cuda.get_device_properties(i).total_memory))
        ooms += int(cuda.memory_stats(i).get("num_ooms", 0))
    return {
        "cuda": True,
        "peak_allocated_bytes": peak,
        "peak_reserved_bytes": reserved,  # what runs at once must fit (run.together)
        "total_bytes": total,
        "ooms": ooms,
    }


def _fx_facts():
    st = sys.modules.get("torch.fx._symbolic_trace")
    if st is None:
        return {"is_fx_symbolic_tracing": None}
    check_flag()  # at exit, from the main thread
    fn = getattr(st, "is_fx_symbolic_tracing", None)
    original = SEEN["fx_original"]
    state = "original"
    where = None
    if original is None or fn is not original[0]:
        code = getattr(fn, "__code__", None)
        if original is not None or (code is not None and code.co_filename != st.__file__):
            state = "patched"
            if code is not None:
                where = f"{code.co_filename}:{code.co_firstlineno}"
    try:
        value, storage = _flag(st)
    except Exception:
        value, storage = None, None
    return {
        "is_fx_symbolic_tracing": state,
        "patched_at": where,
        "flag_storage": storage,
        "flag_at_exit": value,
        "flag_outside_trace": {str(k): v for k, v in sorted(SEEN["flag_outside"].items())},
        "flag_from_other_thread": {str(k): v for k, v in sorted(SEEN["flag_crossed"].items())},
    }
