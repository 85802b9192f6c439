"""Training steps timed inside the probed program, and the sources torch.compile traced
(stdlib only, Python 3.8+ syntax; run beside ``envbisect.agent.probe``).

The rule for a step (documented in the README and ``envbisect.model.steps``):

- by default each ``step()`` of the optimizer that stepped most ends a training step (torch's
  global ``register_optimizer_step_post_hook``; of optimizers that stepped as often, the
  first to step): an optimizer used once to warm up before training is not the one timed;
  the optimizers that stepped while it did (threads with an optimizer each, a second
  optimizer of the same loop) have their ends merged with its own, in time order
  (``merged_ends_s``), and the host's samples are windows of one step of each, since one
  thread's own steps (most fast, some waiting on the others) are not the program's rate;
- with ``step_fn`` in the probe's config (``--step-fn MODULE:QUALNAME``), each outermost
  return of that function ends a step instead (in the thread that returned from it most):
  a function of the script itself (``__main__:train_step``, or the script's own name
  ``train:train_step``) is decorated where it is defined, a function of an imported module
  (``model:Drafter.forward``) is wrapped once its module is imported.

A step's time is from the end of the step before to its own end, so the first step (which
holds the first compile) has none; the host leaves out the first third of the rest as
warm-up. Only clock readings are taken here: no torch call, no synchronization, nothing the
program's speed could notice beyond one ``perf_counter`` per step.

``note_traced`` records every code object Dynamo traced (the compiled frames and the
functions inlined into them: file and qualified name), for the host's key of a shared
compile cache.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from typing import Any

T0 = time.perf_counter()  # the probe's start: offsets below are from here
MAX_ENDS = 100000  # a long run keeps its first steps' ends (the host uses a few)
MAX_MERGED = 20000  # step ends of every source, merged, that the facts carry
MAX_SOURCES = 64  # optimizers (or threads, for a step function) whose step ends are kept
STEPS: dict[str, Any] = {
    "rule": None,  # "optimizer" | "function"
    "step_fn": None,  # "module:qualname" asked for
    "found": False,  # the step function was found and wrapped
    "ends": {},  # per optimizer id (per thread id for a step function), in first-step order
    "script": None,  # the script's module name (``train`` for train.py)
}
COMPILES: list[tuple[float, float]] = []  # (start, end) of each backend compile, from T0
MAX_COMPILES = 1000
MAX_SPANS = 2000  # step ends said with their times (enough to place the compiles)
TRACED: set[str] = set()  # files of code objects Dynamo traced
TRACED_CODE: set[tuple[str, str]] = set()  # (file, qualified name) of each
MAX_TRACED = 500
_LOCK = threading.Lock()
_DEPTH = threading.local()
ON_END: list[Any] = [None]  # called with a source's step ends after each (probe_stop.check)


def configure(config):
    """Read ``step_fn`` from the probe's config (a dict); returns the post-import hooks to
    install: module name -> hook."""
    step_fn = config.get("step_fn") if isinstance(config, dict) else None
    if isinstance(step_fn, str) and ":" in step_fn:
        STEPS["step_fn"] = step_fn
        STEPS["rule"] = "function"
        module = step_fn.split(":", 1)[0]
        STEPS["script"] = _script_module()  # before the program's own sys.argv is set
        if module not in ("__main__", STEPS["script"]):
            return {module: _hook_module}
        return {}
    STEPS["rule"] = "optimizer"
    return {"torch.optim.optimizer": _hook_optimizer}


def _script_module():
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-m", "-c"):
        return None
    return os.path.splitext(os.path.basename(argv[0]))[0]


def compiling(run):
    """``run()`` (one graph handed to torch.compile's backend), its span kept: a timed step
    that spent its time compiling is the program's cost, not the machine's noise."""
    t0 = time.perf_counter()
    try:
        return run()
    finally:
        with _LOCK:
            if len(COMPILES) < MAX_COMPILES:
                COMPILES.append((t0 - T0, time.perf_counter() - T0))


def _end(source):
    """A step of ``source`` (an optimizer's or a thread's id) ended now."""
    now = time.perf_counter()
    with _LOCK:
        by_source = STEPS["ends"]
        ends = by_source.get(source)
        if ends is None:
            if len(by_source) >= MAX_SOURCES:
                return
            ends = by_source[source] = []
        if len(ends) < MAX_ENDS:
            ends.append(now)
        ended = list(ends) if ON_END[0] is not None else None
    if ended is not None:
        ON_END[0](ended)


def _optimizer_stepped(optimizer, args, kwargs):
    _end(id(optimizer))


def _hook_optimizer(mod):
    mod.register_optimizer_step_post_hook(_optimizer_stepped)


def timed(fn):
    """``fn`` whose outermost returns (per thread) end a training step."""

    @functools.wraps(fn)
    def step(*args, **kwargs):
        depth = getattr(_DEPTH, "n", 0)
        _DEPTH.n = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH.n = depth
            if depth == 0:
                _end(threading.get_ident())

    return step


def _hook_module(mod):
    qualname = STEPS["step_fn"].split(":", 1)[1]
    owner, name = mod, qualname
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    name = parts[-1]
    setattr(owner, name, timed(getattr(owner, name)))
    STEPS["found"] = True


def compile_main(source, filename):
    """The script's code, with the step function (when it is one of the script's own,
    module-level or a class's method) decorated by ``timed`` where it is defined; plain
    ``compile`` otherwise. Line numbers and the file name are the script's."""
    step_fn = STEPS["step_fn"]
    if not step_fn or step_fn.split(":", 1)[0] not in ("__main__", STEPS["script"]):
        return compile(source, filename, "exec", dont_inherit=True)
    import ast

    tree = ast.parse(source, filename)
    parts = step_fn.split(":", 1)[1].split(".")
    body = tree.body
    for i, part in enumerate(parts):
        found = None
        for node in body:
            kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            if isinstance(node, kinds) and node.name == part:
                found = node
        if found is None:
            break
        if i == len(parts) - 1 and not isinstance(found, ast.ClassDef):
            # sys.modules[<this module>].timed: no name is added to the script's globals
            deco = ast.Attribute(
                value=ast.Subscript(
                    value=ast.Attribute(
                        value=ast.Call(
                            func=ast.Name(id="__import__", ctx=ast.Load()),
                            args=[ast.Constant(value="sys")],
                            keywords=[],
                        ),
                        attr="modules",
                        ctx=ast.Load(),
                    ),
                    slice=_index(ast, __name__),
                    ctx=ast.Load(),
                ),
                attr="timed",
                ctx=ast.Load(),
            )
            found.decorator_list.append(ast.copy_location(deco, found))
            ast.fix_missing_locations(tree)
            STEPS["found"] = True
            break
        body = getattr(found, "body", [])
    return compile(tree, filename, "exec", dont_inherit=True)


def _index(ast, name):
    # A target on Python 3.8 wants the subscript wrapped in ast.Index.
    if sys.version_info >= (3, 9):  # noqa: UP036 - the agent runs on Python 3.8 too
        return ast.Constant(value=name)
    return ast.Index(value=ast.Constant(value=name))  # pragma: no cover - Python 3.8


def note_traced(output_graph):
    """The files of the code objects this graph traced (``OutputGraph.traced_code``)."""
    codes = getattr(output_graph, "traced_code", None)
    if codes is None:  # older torch: the tracing context holds the list
        codes = getattr(getattr(output_graph, "tracing_context", None), "traced_code", None)
    codes = codes or ()
    found = set()
    for code in codes:
        name = getattr(code, "co_filename", None)
        if name and not name.startswith("<"):
            # co_qualname from Python 3.11 (``Block.forward``); co_name before it
            found.add((name, getattr(code, "co_qualname", None) or code.co_name))
    with _LOCK:
        TRACED.update(f for f, _ in found)
        for item in found:
            if len(TRACED_CODE) < MAX_TRACED:
                TRACED_CODE.add(item)


def facts():
    """The steps seen and the sources traced, for the probe's facts."""
    with _LOCK:
        sources = [list(e) for e in STEPS["ends"].values()]
        spans = [[round(a, 4), round(b, 4)] for a, b in COMPILES]
        traced = sorted(TRACED)
        code = sorted(TRACED_CODE)
    # The source that stepped most (the first of a tie: dicts keep the order they stepped
    # in) gives the timed steps; the span of steps is every source's, first end to last.
    ends = max(sources, key=len) if sources else []
    # the sources stepping while it did (threads, an optimizer each; a second optimizer of
    # the same loop), not one that stepped before or after it (a warm-up's, an old epoch's)
    beside = [e for e in sources if e and ends and e[0] <= ends[-1] and e[-1] >= ends[0]]
    firsts = [e[0] for e in sources if e]
    lasts = [e[-1] for e in sources if e]
    out = {
        "rule": STEPS["rule"],
        "step_fn": STEPS["step_fn"],
        "found": STEPS["found"] if STEPS["step_fn"] else None,
        "sources": len(sources),
        "steps": len(ends),
        "intervals_s": [round(ends[i] - ends[i - 1], 6) for i in range(1, len(ends))],
        "ends_s": [round(e - T0, 4) for e in ends[:MAX_SPANS]],
        "compile_spans_s": spans,
        # several sources (threads with an optimizer each): every step's end, in time order,
        # the host's windows of one step per source (the program's rate, not one thread's)
        "beside": len(beside),
        "merged_ends_s": (
            [round(e - T0, 6) for e in sorted(e for src in beside for e in src)[:MAX_MERGED]]
            if len(beside) > 1
            else None
        ),
        "first_end_s": round(min(firsts) - T0, 4) if firsts else None,
        "last_end_s": round(max(lasts) - T0, 4) if lasts else None,
        "at_exit_s": round(time.perf_counter() - T0, 4),
    }
    return {"steps": out, "traced_sources": traced, "traced_code": [list(c) for c in code]}
