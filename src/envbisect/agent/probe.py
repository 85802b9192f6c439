"""The probe: rides along inside a user's Python program (stdlib only, 3.8+ syntax).

The host (``envbisect.run.probed``) turns ``python [opts] train.py ARGS`` into ``python [opts] -c
BOOT train.py ARGS``, where BOOT executes this module's source and calls ``main()``. ``main``
installs its hooks, then runs the program the way the interpreter would have: a script with
``__name__ == "__main__"``, ``__file__`` absolute, ``sys.argv`` as typed and the script's
directory first on ``sys.path``; ``-m pkg`` through runpy as ``python -m`` does; ``-c CODE``
in ``__main__``. Exit status, tracebacks, stdout and stderr are the program's own.

It never imports torch. Hooks go in as the program's own imports finish (a meta-path hook
that wraps nothing but the loader's ``exec_module``), and each only *observes*:

- ``torch._dynamo.convert_frame``: recompile reasons (the guard-failure function, wrapped);
- ``torch._dynamo.output_graph``: each graph handed to the backend (flex_attention inside);
- ``torch._dynamo.eval_frame``: threads that call a ``torch.compile``'d function;
- ``torch.nn.attention.flex_attention``: eager calls of ``flex_attention`` (a call made while
  Dynamo traces costs nothing at run time and is not counted);
- ``torch.fx._symbolic_trace``: the original ``is_fx_symbolic_tracing`` and the traces in
  flight per thread, so the FX tracing flag seen set with no trace in flight is a sentinel
  (the flag is a module global up to torch 2.13, thread-local from 2.14);
- ``warnings.showwarning`` and the ``torch`` logger: warnings, deduplicated and counted;
- ``torch.optim.optimizer`` (or the function named by ``step_fn``): the end of each
  training step, timed (``probe_steps``), and the files of the code Dynamo traced.

At exit (after non-daemon threads are joined) or on a crash it reads torch.compile's
counters, CUDA peak memory and OOMs, and writes the facts (schema ``envbisect/facts@1``) to
the file named in ``$ENVBISECT_PROBE`` or, through layers, as a frame on the real stdout with
the nonce given there: never as text a program's prints could hide or fake.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import json
import os
import re
import sys
import threading

if __name__ == "_envbisect_probe":  # pragma: no cover - inside the probed program
    # run/probed.py's bootstrap runs this module and probe_facts under private names, so the
    # program never sees an ``envbisect`` package made up by the probe.
    import _envbisect_probe_profile as profile
    import _envbisect_probe_reads as probe_reads
    import _envbisect_probe_steps as probe_steps
    import _envbisect_probe_stop as probe_stop
    from _envbisect_probe_facts import (
        CONFIG_ENV,
        MAX_REASONS,
        SCHEMA,
        SEEN,
        SEEN_LOCK,
        check_flag,
        facts,
        serialized,
        thread_no,
        tls,
    )
else:
    from envbisect.agent import kernel_profile as profile
    from envbisect.agent import probe_reads, probe_steps, probe_stop
    from envbisect.agent.probe_facts import (
        CONFIG_ENV,
        MAX_REASONS,
        SCHEMA,
        SEEN,
        SEEN_LOCK,
        check_flag,
        facts,
        serialized,
        thread_no,
        tls,
    )

# ----------------------------------------------------------------------------- hooks


class _Loader:
    """The real loader, with a hook after ``exec_module``; everything else forwarded."""

    def __init__(self, loader, hook):
        self._loader = loader
        self._hook = hook

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        # The module keeps its real loader: nothing downstream sees this wrapper.
        module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        _quietly(self._hook, module)


class _PostImport:
    """A meta-path finder that finds nothing itself: it asks the other finders and wraps
    the loader of the modules it has hooks for."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.busy = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.hooks or name in self.busy:
            return None
        self.busy.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.busy.discard(name)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self.hooks.pop(name))
        return spec


def _quietly(fn, *args):
    """A hook that fails leaves the program alone (and the fact unknown)."""
    with contextlib.suppress(Exception):
        fn(*args)


def _hook_convert_frame(mod):
    import torch._dynamo.guards as guards

    original = guards.get_and_maybe_log_recompilation_reasons

    @functools.wraps(original)
    def reasons(*args, **kwargs):
        found = original(*args, **kwargs)
        _quietly(_note_recompile, found)
        return found

    guards.get_and_maybe_log_recompilation_reasons = reasons
    if getattr(mod, "get_and_maybe_log_recompilation_reasons", None) is original:
        mod.get_and_maybe_log_recompilation_reasons = reasons


def _note_recompile(found):
    reason = "unknown"
    if found:
        reason = str(found[0]).strip().splitlines()[0][:200]
        reason = re.sub(r"^\d+/\d+: ", "", reason)  # the compile id: "0/3: tensor 'x' ..."
    # One entry per kind of reason (numbers aside), keeping the first one's text.
    kind = re.sub(r"\d+", "#", reason)
    with SEEN_LOCK:
        table = SEEN["recompiles"]
        if kind in table or len(table) < MAX_REASONS:
            first, n = table.get(kind, (reason, 0))
            table[kind] = (first, n + 1)


def _hook_output_graph(mod):
    cls = mod.OutputGraph
    original = cls.call_user_compiler

    @functools.wraps(original)
    def call_user_compiler(self, gm, *args, **kwargs):
        _quietly(_note_graph, gm)
        _quietly(probe_steps.note_traced, self)
        return probe_steps.compiling(lambda: original(self, gm, *args, **kwargs))

    cls.call_user_compiler = call_user_compiler


def _note_graph(gm):
    if getattr(tls, "eager_flex", 0):
        return  # eager flex_attention compiles its own wrapper (backend "eager"): not ours
    flex = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and "flex_attention" in str(node.target):
            flex += 1
    with SEEN_LOCK:
        SEEN["graphs_seen"] += 1
        SEEN["flex_graphs"] += 1 if flex else 0
    _note_compiled_thread()


def _note_compiled_thread():
    me = threading.current_thread()
    ident = me.ident
    if ident not in SEEN["compiled_threads"]:
        thread_no(ident)
        with SEEN_LOCK:
            SEEN["compiled_threads"][ident] = me.name


def _hook_eval_frame(mod):
    import types

    # torch._dynamo.eval_frame has no public name for the base class whose __call__ turns a
    # function into its compiled form; the probe wraps it to see compiled calls.
    cls = mod._TorchDynamoContext  # private: torch.compile's context, no public name
    original = cls.__call__

    @functools.wraps(original)
    def __call__(self, fn, *args, **kwargs):
        compiled = original(self, fn, *args, **kwargs)
        if not isinstance(compiled, types.FunctionType) or type(self) is not _ctx_type(mod):
            return compiled

        def probed(*a, **k):
            eager_flex = getattr(tls, "eager_flex", 0)
            if not eager_flex and threading.get_ident() not in SEEN["compiled_threads"]:
                _note_compiled_thread()
            with serialized():  # a warm-cache run: no other thread traces meanwhile
                check_flag()  # entering compiled code: the flag must not be set here
                return compiled(*a, **k)

        # The copied __dict__ keeps Dynamo's own markers (_torchdynamo_orig_callable, ...).
        return functools.update_wrapper(probed, compiled)

    cls.__call__ = __call__


def _ctx_type(mod):
    # Only torch.compile's context (OptimizeContext); disable() and friends stay untouched.
    return getattr(mod, "OptimizeContext", None)


def _hook_flex(mod):
    original = mod.flex_attention
    import torch

    is_compiling = torch.compiler.is_compiling

    def flex_attention(*args, **kwargs):
        if is_compiling():
            return original(*args, **kwargs)
        SEEN["flex_eager"] += 1
        check_flag()
        tls.eager_flex = getattr(tls, "eager_flex", 0) + 1
        try:
            with serialized():  # eager flex sets the FX flag too
                return original(*args, **kwargs)
        finally:
            tls.eager_flex -= 1

    mod.flex_attention = functools.update_wrapper(flex_attention, original)


def _hook_fx(mod):
    fn = mod.is_fx_symbolic_tracing
    code = getattr(fn, "__code__", None)
    SEEN["fx_original"] = (fn, code.co_filename if code is not None else None)
    tracer = mod.Tracer
    original = tracer.trace

    @functools.wraps(original)
    def trace(self, *args, **kwargs):
        with serialized():  # a warm-cache run: the flag is up for this thread alone
            return _traced(original, self, args, kwargs)

    tracer.trace = trace


def _traced(original, tracer, args, kwargs):
    """One FX trace, counted as in flight in this thread while it runs."""
    me = threading.get_ident()
    with SEEN_LOCK:
        SEEN["tracing"][me] = SEEN["tracing"].get(me, 0) + 1
    try:
        return original(tracer, *args, **kwargs)
    finally:
        with SEEN_LOCK:
            SEEN["tracing"][me] -= 1
        check_flag()


_HOOKS = {
    "torch._dynamo.convert_frame": _hook_convert_frame,
    "torch._dynamo.output_graph": _hook_output_graph,
    "torch._dynamo.eval_frame": _hook_eval_frame,
    "torch.nn.attention.flex_attention": _hook_flex,
    "torch.fx._symbolic_trace": _hook_fx,
    "torch": lambda mod: _hook_torch_logging(),
}


def _hook_torch_logging():
    import logging

    class _Record(logging.Handler):
        def emit(self, record):
            try:
                text = record.getMessage()
            except Exception:
                return
            _note_warning("log " + record.levelname, text)

    logger = logging.getLogger("torch")
    if logger.handlers:  # torch's own handler prints: adding ours changes no output
        logger.addHandler(_Record(logging.WARNING))


def _note_warning(category, message):
    first = (str(message).strip().splitlines() or [""])[0][:200]
    key = (category, first)
    with SEEN_LOCK:
        table = SEEN["warnings"]
        if key in table or len(table) < MAX_REASONS:
            table[key] = table.get(key, 0) + 1


def _install():
    import warnings

    with contextlib.suppress(ValueError, TypeError, AttributeError):
        if json.loads(os.environ.get(CONFIG_ENV) or "{}").get("serialize_compiles"):
            SEEN["serial"] = threading.RLock()
    step_hooks = {}
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        config = json.loads(os.environ.get(CONFIG_ENV) or "{}")
        profile.configure(config)
        step_hooks = probe_steps.configure(config)
        probe_reads.configure(config)
        probe_stop.configure(config, _stop_early)
        if probe_stop.STOP["rule"] is not None:
            probe_steps.ON_END[0] = lambda ends: probe_stop.check(
                ends, probe_steps.COMPILES, probe_steps.T0
            )
        _stacks_later(config.get("stacks_after"))
        QUICK["on"] = config.get("quick_exit") is True

    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        _quietly(_note_warning, getattr(category, "__name__", str(category)), message)
        return shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    excepthook = threading.excepthook

    def thread_excepthook(args):
        with SEEN_LOCK:
            SEEN["thread_errors"].append(
                {
                    "thread": thread_no(args.thread.ident) if args.thread else None,
                    "class": getattr(args.exc_type, "__name__", "?"),
                    "message": str(args.exc_value)[:300],
                }
            )
        return excepthook(args)

    threading.excepthook = thread_excepthook
    thread_no(threading.main_thread().ident)  # the main thread is thread 1
    finder = _PostImport(profile.with_hooks(_with_step_hooks(step_hooks)))
    for name in list(finder.hooks):
        if name in sys.modules:  # imported before us (a sitecustomize): hook it now
            _quietly(finder.hooks.pop(name), sys.modules[name])
    sys.meta_path.insert(0, finder)


# A trial needs the program's output and the facts, not its exit: once the main body and its
# threads are done, the probe ends the process (``quick_exit`` in the config, the host's
# default; ``--full-exit`` turns it off). The interpreter's own teardown runs the program's
# atexit handlers, where torch's compile worker pool alone took 9.4 s of a 22 s run (H100).
QUICK = {"on": False}


def _exit_now(code):
    """With ``quick_exit``: join the program's non-daemon threads as the interpreter does,
    flush its output, deliver the facts and end the process with ``code``, skipping atexit
    handlers and module teardown; without it, return (the interpreter exits as usual)."""
    if not QUICK["on"]:
        return
    # The interpreter's own first step of exiting: the threading atexit calls (a thread pool
    # told to end its idle workers), then every non-daemon thread joined. Joining them
    # without those calls waits forever on an idle ThreadPoolExecutor (inductor keeps one).
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    SEEN["quick_exit"] = True
    _deliver()
    os._exit(code)


def _stop_early(why):
    """The rate is known (``probe_stop``): the program's output flushed, the facts
    delivered, the process ended with status 0 from the thread that stepped."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    SEEN["quick_exit"] = True
    _deliver()
    os._exit(0)


def _stacks_later(seconds):
    """A run about to be killed at its timeout writes every thread's stack to stderr first
    (faulthandler's watchdog; nothing runs before then): where a hang hangs. SIGUSR2 writes
    them too: the host sends it before it ends a run that hangs using no CPU time."""
    if isinstance(seconds, (int, float)) and seconds > 0:
        import faulthandler
        import signal

        with contextlib.suppress(ValueError, RuntimeError, OSError, AttributeError):
            faulthandler.dump_traceback_later(float(seconds), exit=False)
        with contextlib.suppress(ValueError, RuntimeError, OSError, AttributeError):
            faulthandler.register(signal.SIGUSR2, all_threads=True)


def _with_step_hooks(step_hooks):
    """The probe's hooks and the step timer's (a module both hook: one after the other)."""
    hooks = dict(_HOOKS)
    for name, hook in step_hooks.items():
        if name in hooks:
            first = hooks[name]
            hooks[name] = lambda mod, a=first, b=hook: (_quietly(a, mod), _quietly(b, mod))
        else:
            hooks[name] = hook
    return hooks


# ----------------------------------------------------------------------------- delivery


def _deliver():
    """Write the facts once: to the result file, or as a frame on the real stdout."""
    with SEEN_LOCK:
        if SEEN["done"] or os.getpid() != SEEN["pid"]:
            return
        SEEN["done"] = True
    try:
        data = facts()
    except Exception as exc:
        data = {"schema": SCHEMA, "source": "probe", "error": f"{type(exc).__name__}: {exc}"}
    with contextlib.suppress(Exception):
        if profile.STATE["config"] is not None:
            data["profile"] = profile.facts()
        data.update(probe_steps.facts())
        data.update(probe_reads.facts())
        data.update(probe_stop.facts())
    try:
        config = json.loads(os.environ.get(CONFIG_ENV) or "{}")
    except ValueError:
        return
    rank = os.environ.get("RANK")
    if rank not in (None, "", "0"):
        data["rank"] = int(rank) if rank.isdigit() else rank
    body = json.dumps(data, sort_keys=True, default=str)
    path = config.get("result")
    if path:
        if rank not in (None, "", "0"):
            path = f"{path}.rank{rank}"
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(body)
            os.replace(tmp, path)
        except OSError:
            pass
    nonce = config.get("nonce")
    if nonce and rank in (None, "", "0"):
        payload = base64.b64encode(body.encode("utf-8")).decode("ascii")
        frame = f"\n<<ENVBISECT {nonce} BEGIN>>\n{payload}\n<<ENVBISECT {nonce} END>>\n"
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(OSError):
            os.write(1, frame.encode("ascii"))


# ----------------------------------------------------------------------------- running


def _trim(tb):
    """The traceback from the program's first frame on: the ``-c`` bootstrap's frame and
    the probe's own are not the program's."""
    if tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    mine = main.__code__.co_filename
    while tb is not None and tb.tb_frame.f_code.co_filename == mine:
        tb = tb.tb_next
    return tb


def _run_script(path, args):
    import importlib.machinery

    main = sys.modules["__main__"]
    for name in list(main.__dict__):
        if name != "__builtins__":
            del main.__dict__[name]
    full = os.path.abspath(path)
    if not os.path.exists(full):
        # As the interpreter says it (the first line a user sees), with its exit status 2.
        prog = (getattr(sys, "orig_argv", None) or [sys.executable])[0]
        sys.stderr.write(f"{prog}: can't open file {full!r}: [Errno 2] No such file or directory\n")
        sys.exit(2)
    if not os.path.isfile(full):
        import runpy

        sys.argv = [path, *args]
        runpy.run_path(path, run_name="__main__")
        return
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.path.dirname(os.path.realpath(full))
    sys.argv = [path, *args]
    import io

    with io.open_code(full) as fh:
        source = fh.read()
    try:
        code = probe_steps.compile_main(source, full)  # the step function decorated, if any
    except Exception:  # a SyntaxError said as Python says it, by the plain compile
        code = compile(source, full, "exec", dont_inherit=True)
    main.__dict__.update(
        __name__="__main__",
        __file__=full,
        __cached__=None,
        __doc__=None,
        __package__=None,
        __spec__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", full),
    )
    exec(code, main.__dict__)


def _run_module(name, args):
    import runpy

    main = sys.modules["__main__"]
    for key in list(main.__dict__):
        if key not in ("__builtins__", "__name__"):
            del main.__dict__[key]  # the bootstrap's names
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.getcwd()
    sys.argv = ["-m", *args]
    runpy._run_module_as_main(name, alter_argv=True)


def _run_code(code, args):
    main = sys.modules["__main__"]
    for name in list(main.__dict__):
        if name not in ("__builtins__", "__name__"):
            del main.__dict__[name]
    sys.argv = ["-c", *args]
    exec(compile(code, "<string>", "exec", dont_inherit=True), main.__dict__)


def main():
    """Run the program named by ``sys.argv[1:]`` (``script ARGS``, ``-m mod ARGS`` or
    ``-c CODE ARGS``) under the probe; facts delivered at exit or on a crash."""
    words = sys.argv[1:]
    _install()
    atexit.register(_deliver)
    try:
        if words[:1] == ["-m"]:
            _run_module(words[1], words[2:])
        elif words[:1] == ["-c"]:
            _run_code(words[1], words[2:])
        else:
            _run_script(words[0], words[1:])
    except SystemExit as exc:
        code = exc.code
        SEEN["exit_code"] = code if isinstance(code, int) or code is None else 1
        if QUICK["on"] and code is not None and not isinstance(code, int):
            with contextlib.suppress(Exception):
                print(code, file=sys.stderr)  # as the interpreter says sys.exit("message")
        _exit_now(SEEN["exit_code"] or 0)
        raise
    except KeyboardInterrupt:
        SEEN["crash"] = {"class": "KeyboardInterrupt", "message": ""}
        raise  # the interpreter's own exit for it (killed by SIGINT)
    except BaseException as exc:
        SEEN["crash"] = {"class": type(exc).__name__, "message": str(exc)[:500]}
        SEEN["exit_code"] = 1
        # As the interpreter reports an uncaught exception (through a sys.excepthook the
        # program may have set), without the bootstrap's frames; exit status 1 as well.
        tb = _trim(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        _exit_now(1)
        sys.exit(1)
    SEEN["exit_code"] = 0
    _exit_now(0)
