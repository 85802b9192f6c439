"""The facts that explain a slowdown, one schema for the probe and the built-in drafter.

A run's facts (schema ``envbisect/facts@1``) are what torch.compile, flex_attention, the FX
tracing flag, threads, CUDA memory and warnings did in that process::

    torch      "2.13.0+cpu"
    compile    {frames_compiled, unique_graphs, recompiles, recompile_reasons {text: n},
                graph_breaks, graph_break_reasons {text: n}, compile_s,
                fxgraph_cache_hit, fxgraph_cache_miss}
    flex       {eager_calls, compiled_graphs, compiled}
    fx         {is_fx_symbolic_tracing: original|patched, patched_at, flag_storage,
                flag_at_exit, flag_outside_trace {thread number: times seen},
                flag_from_other_thread {thread number: times seen}}
    threads    {called_compiled, alive_at_exit [...], errors [...]}
    memory     {cuda, peak_allocated_bytes, peak_reserved_bytes, total_bytes, ooms}
    warnings   [{category, message, count}]
    crash      {class, message} | null

The probe (``agent/probe.py``) writes them as they are; ``from_drafter`` reads them out of
the drafter's result. ``explain`` compares a good trial's facts with a bad one's and says
only what differs; ``describe`` lists one run's. Pure functions: nothing prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SCHEMA = "envbisect/facts@1"
_ORIGINAL_FX = "torch.fx._symbolic_trace.is_fx_symbolic_tracing"


def from_drafter(result: Mapping[str, Any]) -> dict[str, Any]:
    """The drafter's result (``smoke/drafter.py``) in the fact schema."""
    dyn = _map(result.get("dynamo"))
    comp = _map(result.get("compile"))
    fx = _map(result.get("fx_tracing"))
    mem = _map(result.get("memory"))
    threads = _map(result.get("threads"))
    attn_flex = str(result.get("attn") or "").startswith("flex")
    eager = int(result.get("flex_eager_calls") or 0)
    compiled = attn_flex and bool(comp.get("effective")) and not result.get("flex_fallback")
    qualname = fx.get("is_fx_symbolic_tracing")
    patched = qualname is not None and qualname != _ORIGINAL_FX
    times = _map(result.get("compile_times"))
    error = _map(result.get("error"))
    return {
        "schema": SCHEMA,
        "source": "drafter",
        "torch": result.get("torch"),
        "compile": {
            "frames_compiled": dyn.get("frames_compiled"),
            "unique_graphs": dyn.get("unique_graphs"),
            "recompiles": dyn.get("recompiles"),
            "recompile_reasons": {},
            "graph_breaks": dyn.get("graph_breaks"),
            "graph_break_reasons": dict(_map(dyn.get("graph_break_reasons"))),
            "compile_s": times.get("_compile.compile_inner"),
            "fxgraph_cache_hit": dyn.get("fxgraph_cache_hit"),
            "fxgraph_cache_miss": dyn.get("fxgraph_cache_miss"),
        },
        "flex": {
            "eager_calls": eager if attn_flex else 0,
            "compiled_graphs": None,
            "compiled": compiled if attn_flex else None,
        },
        "fx": {
            "is_fx_symbolic_tracing": None
            if qualname is None
            else ("patched" if patched else "original"),
            "patched_at": fx.get("defined_in") if patched else None,
            "flag_storage": None,
            "flag_at_exit": fx.get("flag"),
            # read once the drafters are done: a flag still set is set outside any trace
            "flag_outside_trace": {"1": 1} if fx.get("flag") else {},
        },
        "threads": {
            "called_compiled": threads.get("count") if comp.get("effective") else 0,
            "alive_at_exit": [],
            "errors": list(threads.get("errors") or []),
        },
        "memory": {
            "cuda": "peak_allocated_bytes" in mem,
            "peak_allocated_bytes": mem.get("peak_allocated_bytes"),
            "peak_reserved_bytes": mem.get("peak_reserved_bytes"),
            "total_bytes": mem.get("total_bytes"),
            "ooms": mem.get("ooms"),
        },
        "warnings": [
            {"category": "warning", "message": str(m), "count": None}
            for m in result.get("warnings") or []
        ],
        "crash": (
            {"class": error.get("class"), "message": error.get("message")} if error else None
        ),
    }


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def flex_mode(facts: Mapping[str, Any]) -> str | None:
    """How flex_attention ran: ``compiled``, ``eagerly N×``, ``compiled and eagerly N×``,
    or None (not called, or not known)."""
    flex = _map(facts.get("flex"))
    eager = int(flex.get("eager_calls") or 0)
    compiled = flex.get("compiled")
    if compiled is None and flex.get("compiled_graphs") is not None:
        compiled = int(flex["compiled_graphs"]) > 0
    if eager and compiled:
        return f"compiled and eagerly {eager}×"
    if eager:
        return f"eagerly {eager}×"
    return "compiled" if compiled else None


def _top(reasons: Any) -> str | None:
    table = _map(reasons)
    if not table:
        return None
    return max(table.items(), key=lambda kv: kv[1])[0]


def _gib(n: Any) -> str:
    return f"{int(n) / 2**30:.1f} GiB"


def _threads_seen(fx: Mapping[str, Any], key: str = "flag_outside_trace") -> list[str]:
    return sorted(_map(fx.get(key)), key=lambda k: int(k) if k.isdigit() else 0)


def explain(good: Mapping[str, Any] | None, bad: Mapping[str, Any] | None) -> tuple[str, ...]:
    """What the bad run's facts say that the good run's do not, one line each:
    ``bad: 0 compiled frames (good: 2)``. Empty when either side has no facts."""
    if not good or not bad:
        return ()
    out: list[str] = []
    if good.get("torch") != bad.get("torch") and good.get("torch") and bad.get("torch"):
        out.append(f"bad: torch {bad['torch']} (good: {good['torch']})")
    out += _compile_lines(_map(good.get("compile")), _map(bad.get("compile")))
    g_flex, b_flex = flex_mode(good), flex_mode(bad)
    if g_flex != b_flex and b_flex is not None:
        out.append(f"bad: flex_attention ran {b_flex} (good: {g_flex or 'not called'})")
    elif g_flex != b_flex:
        out.append(f"bad: flex_attention not called (good: ran {g_flex})")
    out += _fx_lines(_map(good.get("fx")), _map(bad.get("fx")))
    out += _thread_lines(_map(good.get("threads")), _map(bad.get("threads")))
    out += _memory_lines(_map(good.get("memory")), _map(bad.get("memory")))
    out += _warning_lines(good.get("warnings") or [], bad.get("warnings") or [])
    g_crash, b_crash = _map(good.get("crash")), _map(bad.get("crash"))
    if b_crash and not g_crash:
        out.append(f"bad: crashed: {b_crash.get('class')}: {b_crash.get('message')}")
    return tuple(out)


def _compile_lines(g: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    out = []
    gf, bf = g.get("frames_compiled"), b.get("frames_compiled")
    gr, br = int(g.get("recompiles") or 0), int(b.get("recompiles") or 0)
    # More frames because of more recompiles is said once, by the recompile line.
    if gf is not None and bf is not None and gf != bf and (bf - gf) != (br - gr):
        out.append(f"bad: {bf} compiled frames (good: {gf})")
    if br != gr:
        line = f"bad: {br} recompiles (good: {gr})"
        reason = _top(b.get("recompile_reasons")) if br > gr else None
        out.append(line + (f" (reason: {reason})" if reason else ""))
    gb, bb = int(g.get("graph_breaks") or 0), int(b.get("graph_breaks") or 0)
    if gb != bb:
        line = f"bad: {bb} graph breaks (good: {gb})"
        reason = _top(b.get("graph_break_reasons")) if bb > gb else None
        out.append(line + (f" (reason: {reason})" if reason else ""))
    gs, bs = g.get("compile_s"), b.get("compile_s")
    if gs is not None and bs is not None and abs(bs - gs) > 1.0 and max(bs, gs) > 1.5 * min(bs, gs):
        out.append(f"bad: {bs:.1f} s compiling (good: {gs:.1f} s)")
    gh, bh = g.get("fxgraph_cache_hit"), b.get("fxgraph_cache_hit")
    gm, bm = g.get("fxgraph_cache_miss"), b.get("fxgraph_cache_miss")
    if (gh, gm) != (bh, bm) and None not in (gh, bh, gm, bm) and (bool(gh) != bool(bh)):
        out.append(f"bad: FX graph cache {bh} hits, {bm} misses (good: {gh} hits, {gm} misses)")
    return out


def _fx_lines(g: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    out = []
    gp, bp = g.get("is_fx_symbolic_tracing"), b.get("is_fx_symbolic_tracing")
    if bp == "patched" and gp != "patched":
        where = f" at {b['patched_at']}" if b.get("patched_at") else ""
        out.append(f"bad: is_fx_symbolic_tracing patched{where} (good: {gp or 'not imported'})")
    elif gp == "patched" and bp != "patched":
        out.append(f"bad: is_fx_symbolic_tracing {bp or 'not imported'} (good: patched)")
    seen_b, seen_g = _threads_seen(b), _threads_seen(g)
    if seen_b and not seen_g:
        which = ", ".join(seen_b)
        out.append(f"bad: FX tracing flag set outside a trace in thread {which}")
    elif seen_g and not seen_b:
        out.append("bad: FX tracing flag never seen set outside a trace (good: it was)")
    crossed_b = _threads_seen(b, "flag_from_other_thread")
    if crossed_b and not _threads_seen(g, "flag_from_other_thread"):
        which = ", ".join(crossed_b)
        out.append(f"bad: FX tracing flag of another thread's trace seen in thread {which}")
    return out


def _thread_lines(g: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    out = []
    gc, bc = g.get("called_compiled"), b.get("called_compiled")
    if gc is not None and bc is not None and gc != bc:
        out.append(f"bad: {bc} threads called compiled code (good: {gc})")
    ga, ba = list(g.get("alive_at_exit") or []), list(b.get("alive_at_exit") or [])
    if len(ba) > len(ga):
        out.append(f"bad: alive at exit after calling compiled code: {', '.join(ba)}")
    ge, be = list(g.get("errors") or []), list(b.get("errors") or [])
    if len(be) > len(ge):
        first = _map(be[0])
        out.append(
            f"bad: {len(be)} thread errors (good: {len(ge)}), first "
            f"{first.get('class')}: {first.get('message')}"
        )
    return out


def _memory_lines(g: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    out = []
    gp, bp = g.get("peak_allocated_bytes"), b.get("peak_allocated_bytes")
    if gp and bp and max(gp, bp) > 1.1 * min(gp, bp):
        out.append(f"bad: CUDA peak {_gib(bp)} (good: {_gib(gp)})")
    go, bo = int(g.get("ooms") or 0), int(b.get("ooms") or 0)
    if bo != go:
        out.append(f"bad: {bo} CUDA OOMs (good: {go})")
    return out


def _warning_lines(good: list[Any], bad: list[Any], limit: int = 3) -> list[str]:
    known = {_map(w).get("message") for w in good}
    new = [_map(w) for w in bad if _map(w).get("message") not in known]
    out = []
    for w in new[:limit]:
        count = f" ({w['count']}×)" if w.get("count") and w["count"] > 1 else ""
        out.append(f"bad warns: {str(w.get('message'))[:160]}{count}")
    if len(new) > limit:
        out.append(f"bad warns: … {len(new) - limit} more new warnings")
    return out


def _steps_line(facts: Mapping[str, Any]) -> list[str]:
    """``steps: 120 timed (each optimizer step()), median 23.5 ms, p10 22.9, p90 25.1``."""
    steps = _map(facts.get("steps"))
    times = [float(t) for t in steps.get("intervals_s") or () if isinstance(t, (int, float))]
    if not times:
        return []
    rule = "each optimizer step()" if steps.get("rule") == "optimizer" else steps.get("step_fn")
    ordered = sorted(t * 1000 for t in times)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    line = (
        f"steps: {steps.get('steps')} timed ({rule}), median {at(0.5):.3g} ms, "
        f"p10 {at(0.1):.3g}, p90 {at(0.9):.3g}"
    )
    stopped = _map(facts.get("stopped_early"))
    if stopped:
        line += f"; stopped at step {stopped.get('at_step')} ({stopped.get('why')})"
    return [line]


def describe(facts: Mapping[str, Any]) -> list[str]:
    """One run's facts, a line per family, for ``envbisect probe``."""
    comp = _map(facts.get("compile"))
    fx = _map(facts.get("fx"))
    threads = _map(facts.get("threads"))
    mem = _map(facts.get("memory"))
    lines = [f"torch: {facts.get('torch') or 'not imported'}"]
    if comp.get("error"):
        lines.append(f"torch.compile: facts not readable ({comp['error']})")
    elif comp:
        lines.append(
            f"torch.compile: {comp.get('frames_compiled')} frames compiled, "
            f"{comp.get('unique_graphs')} unique graphs, {comp.get('recompiles')} recompiles, "
            f"{comp.get('graph_breaks')} graph breaks, {comp.get('compile_s') or 0:.1f} s "
            f"compiling, FX graph cache {comp.get('fxgraph_cache_hit')} hits / "
            f"{comp.get('fxgraph_cache_miss')} misses"
        )
        for kind, key in (
            ("recompile", "recompile_reasons"),
            ("graph break", "graph_break_reasons"),
        ):
            for reason, n in _map(comp.get(key)).items():
                lines.append(f"  {kind} ×{n}: {reason}")
    lines.append(f"flex_attention: {('ran ' + m) if (m := flex_mode(facts)) else 'not called'}")
    lines += _steps_line(facts)
    if fx.get("is_fx_symbolic_tracing"):
        where = f" at {fx['patched_at']}" if fx.get("patched_at") else ""
        seen = _threads_seen(fx)
        flag = (
            f"set outside a trace in thread {', '.join(seen)}"
            if seen
            else "never seen set outside a trace"
        )
        crossed = _threads_seen(fx, "flag_from_other_thread")
        if crossed:
            flag += f"; another thread's trace seen in thread {', '.join(crossed)}"
        storage = f" ({fx['flag_storage']})" if fx.get("flag_storage") else ""
        lines.append(
            f"FX: is_fx_symbolic_tracing {fx['is_fx_symbolic_tracing']}{where}; "
            f"tracing flag{storage} {flag}"
        )
    alive = threads.get("alive_at_exit") or []
    lines.append(
        f"threads: {threads.get('called_compiled') or 0} called compiled code"
        + (f"; alive at exit: {', '.join(alive)}" if alive else "")
        + (f"; {len(threads['errors'])} thread errors" if threads.get("errors") else "")
    )
    if mem.get("cuda"):
        lines.append(
            f"CUDA: peak {_gib(mem.get('peak_allocated_bytes') or 0)}, {mem.get('ooms') or 0} OOMs"
        )
    for w in facts.get("warnings") or []:
        w = _map(w)
        count = f" ×{w['count']}" if w.get("count") else ""
        lines.append(f"warning{count}: {w.get('category')}: {str(w.get('message'))[:160]}")
    crash = _map(facts.get("crash"))
    if crash:
        lines.append(f"crashed: {crash.get('class')}: {crash.get('message')}")
    if facts.get("exit_code") is not None:
        lines.append(f"exit status: {facts['exit_code']}")
    return lines
