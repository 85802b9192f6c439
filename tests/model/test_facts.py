"""One fact schema, one explain path: the drafter's result and the probe's facts read alike;
good vs bad says only what differs. Also the argv forms the probe rides along with."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from envbisect.model.facts import describe, explain, flex_mode, from_drafter
from envbisect.render.culprit import why_lines
from envbisect.run import probed
from envbisect.run.result import Culprit, RunResult


def _facts(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schema": "envbisect/facts@1",
        "source": "probe",
        "torch": "2.13.0",
        "compile": {
            "frames_compiled": 2,
            "unique_graphs": 2,
            "recompiles": 0,
            "recompile_reasons": {},
            "graph_breaks": 0,
            "graph_break_reasons": {},
            "compile_s": 3.0,
            "fxgraph_cache_hit": 0,
            "fxgraph_cache_miss": 2,
        },
        "flex": {"eager_calls": 0, "compiled_graphs": 1},
        "fx": {
            "is_fx_symbolic_tracing": "original",
            "patched_at": None,
            "flag_outside_trace": {},
        },
        "threads": {"called_compiled": 1, "alive_at_exit": [], "errors": []},
        "memory": {"cuda": True, "peak_allocated_bytes": 10 * 2**30, "ooms": 0},
        "warnings": [],
        "crash": None,
    }
    for path, value in over.items():
        node = base
        *head, last = path.split("__")
        for key in head:
            node = node[key]
        node[last] = value
    return base


def test_identical_facts_explain_nothing() -> None:
    assert explain(_facts(), copy.deepcopy(_facts())) == ()
    assert explain(None, _facts()) == () and explain(_facts(), {}) == ()


def test_flex_falling_back_and_frames_lost_read_as_the_issue_writes_them() -> None:
    bad = _facts(compile__frames_compiled=0, flex__eager_calls=16, flex__compiled_graphs=0)
    assert explain(_facts(), bad) == (
        "bad: 0 compiled frames (good: 2)",
        "bad: flex_attention ran eagerly 16× (good: compiled)",
    )


def test_recompiles_name_their_reason_and_are_not_counted_twice_as_frames() -> None:
    reason = "tensor 'x' size mismatch at index 0. expected 2, actual 3"
    bad = _facts(
        compile__frames_compiled=16,
        compile__recompiles=14,
        compile__recompile_reasons={reason: 14},
    )
    assert explain(_facts(), bad) == (f"bad: 14 recompiles (good: 0) (reason: {reason})",)


def test_fx_patch_stuck_flag_threads_memory_warnings_and_crash() -> None:
    bad = _facts(
        fx__is_fx_symbolic_tracing="patched",
        fx__patched_at="/repo/model.py:12",
        fx__flag_outside_trace={"2": 5},
        threads__alive_at_exit=["thread 2 (drafter-1)"],
        memory__peak_allocated_bytes=20 * 2**30,
        memory__ooms=1,
        warnings=[{"category": "UserWarning", "message": "flex without compile", "count": 3}],
        crash={"class": "OutOfMemoryError", "message": "CUDA out of memory"},
    )
    assert explain(_facts(), bad) == (
        "bad: is_fx_symbolic_tracing patched at /repo/model.py:12 (good: original)",
        "bad: FX tracing flag set outside a trace in thread 2",
        "bad: alive at exit after calling compiled code: thread 2 (drafter-1)",
        "bad: CUDA peak 20.0 GiB (good: 10.0 GiB)",
        "bad: 1 CUDA OOMs (good: 0)",
        "bad warns: flex without compile (3×)",
        "bad: crashed: OutOfMemoryError: CUDA out of memory",
    )


def test_compile_time_and_the_fx_graph_cache_turning_cold() -> None:
    good = _facts(compile__fxgraph_cache_hit=2, compile__fxgraph_cache_miss=0)
    bad = _facts(compile__compile_s=40.0)
    assert explain(good, bad) == (
        "bad: 40.0 s compiling (good: 3.0 s)",
        "bad: FX graph cache 0 hits, 2 misses (good: 2 hits, 0 misses)",
    )


DRAFTER = {
    "torch": "2.13.0",
    "attn": "flex",
    "compile": {"effective": True},
    "flex_fallback": False,
    "flex_eager_calls": 0,
    "dynamo": {
        "frames_compiled": 2,
        "unique_graphs": 2,
        "recompiles": 0,
        "graph_breaks": 0,
        "fxgraph_cache_hit": 0,
        "fxgraph_cache_miss": 2,
    },
    "compile_times": {"_compile.compile_inner": 3.0},
    "fx_tracing": {
        "flag": False,
        "is_fx_symbolic_tracing": "torch.fx._symbolic_trace.is_fx_symbolic_tracing",
    },
    "memory": {"peak_allocated_bytes": 10 * 2**30, "ooms": 0},
    "threads": {"count": 1, "errors": []},
    "warnings": [],
    "error": None,
}


def test_the_drafter_result_reads_into_the_same_schema_and_explains_alike() -> None:
    good = from_drafter(DRAFTER)
    assert good["compile"]["frames_compiled"] == 2 and good["compile"]["compile_s"] == 3.0
    assert flex_mode(good) == "compiled"
    assert good["fx"]["is_fx_symbolic_tracing"] == "original"
    bad_result = copy.deepcopy(DRAFTER)
    bad_result.update(flex_fallback=True, flex_eager_calls=16)
    bad_result["dynamo"]["frames_compiled"] = 0
    bad_result["fx_tracing"] = {
        "flag": True,
        "is_fx_symbolic_tracing": "model.<lambda>",
        "defined_in": "/repo/model.py",
    }
    assert explain(good, from_drafter(bad_result)) == (
        "bad: 0 compiled frames (good: 2)",
        "bad: flex_attention ran eagerly 16× (good: compiled)",
        "bad: is_fx_symbolic_tracing patched at /repo/model.py (good: original)",
        "bad: FX tracing flag set outside a trace in thread 1",
    )
    # the probe's facts and the drafter's compare with each other too
    assert explain(good, _facts(compile__compile_s=3.0)) == ()


def test_describe_lists_one_runs_facts() -> None:
    lines = describe(_facts(compile__recompile_reasons={"size of L['x'] changed": 2}))
    assert lines[0] == "torch: 2.13.0"
    assert lines[1].startswith("torch.compile: 2 frames compiled, 2 unique graphs")
    assert "  recompile ×2: size of L['x'] changed" in lines
    assert "flex_attention: ran compiled" in lines
    assert "CUDA: peak 10.0 GiB, 0 OOMs" in lines


def test_the_report_puts_the_facts_under_the_culprit() -> None:
    culprit = Culprit(unit=None, why=("bad: 0 compiled frames (good: 2)",))  # type: ignore[arg-type]
    result = RunResult.__new__(RunResult)
    object.__setattr__(result, "culprits", (culprit,))
    assert why_lines(result) == ["  bad: 0 compiled frames (good: 2)"]


# ----------------------------------------------------------------------------- argv forms

BOOT = "<envbisect probe bootstrap>"


def _shown(argv: list[str], python: str | None = "/venv/bin/python") -> tuple[Any, ...]:
    w = probed.wrap(argv, python)
    return (w.probed, probed.shown(w.argv) if w.probed else w.why_not)


def test_python_forms_keep_interpreter_options_before_the_bootstrap() -> None:
    assert _shown(["python3", "train.py", "--lr", "1"]) == (
        True,
        ("python3", "-c", BOOT, "train.py", "--lr", "1"),
    )
    assert _shown(["python", "-u", "-X", "dev", "-W", "ignore", "t.py"]) == (
        True,
        ("python", "-u", "-X", "dev", "-W", "ignore", "-c", BOOT, "t.py"),
    )
    assert _shown(["python3.11", "-m", "pkg.train", "x"]) == (
        True,
        ("python3.11", "-c", BOOT, "-m", "pkg.train", "x"),
    )
    assert _shown(["python", "-um", "pkg"]) == (True, ("python", "-u", "-c", BOOT, "-m", "pkg"))
    assert _shown(["python", "-c", "print(1)", "a"]) == (
        True,
        ("python", "-c", BOOT, "-c", "print(1)", "a"),
    )
    assert _shown(["/venv/bin/python", "t.py"])[0] is True  # the state's interpreter


def test_forms_that_run_as_typed_say_why() -> None:
    assert _shown(["bash", "-c", "python t.py"]) == (False, "bash is not a Python interpreter")
    assert _shown(["python", "-"]) == (False, "the program comes from stdin")
    assert _shown(["python", "--version"]) == (False, "no program to run")
    assert _shown(["torchrun", "--no-python", "x"]) == (
        False,
        "torchrun --no-python: runs as typed",
    )


def test_torchrun_workers_run_under_the_probe() -> None:
    assert _shown(["torchrun", "--standalone", "--nproc_per_node", "2", "train.py", "--a"]) == (
        True,
        (
            "torchrun", "--standalone", "--nproc_per_node", "2", "--no-python",
            "/venv/bin/python", "-u", "-c", BOOT, "train.py", "--a",
        ),
    )  # fmt: skip
    assert _shown(["python", "-m", "torch.distributed.run", "--nnodes=1", "t.py"]) == (
        True,
        (
            "python", "-m", "torch.distributed.run", "--nnodes=1", "--no-python",
            "/venv/bin/python", "-u", "-c", BOOT, "t.py",
        ),
    )  # fmt: skip


def test_a_frame_is_taken_out_of_stdout_and_kept_beside_the_logs(tmp_path: Path) -> None:
    delivery = probed.Delivery.for_run(tmp_path, "run-1", remote=True)
    import base64

    body = base64.b64encode(json.dumps({"torch": "2.13.0"}).encode()).decode()
    n = delivery.nonce
    out = f"step 1 | 5.0 Ktok/s\n\n<<ENVBISECT {n} BEGIN>>\n{body}\n<<ENVBISECT {n} END>>\n"
    facts, stdout = delivery.collect(out.encode(), tmp_path, "run-1")
    assert facts == {"torch": "2.13.0"}
    assert b"ENVBISECT" not in stdout and stdout.startswith(b"step 1 | 5.0 Ktok/s\n")
    assert probed.trial_facts(tmp_path) == {"torch": "2.13.0"}


def test_the_thread_local_flag_of_torch_214(monkeypatch: Any) -> None:
    """torch 2.14 keeps the flag in ``_is_fx_tracing_tls`` read by ``_get_is_fx_tracing``
    (upstream PR #168999): the probe reads it per thread, and a flag left set in this
    thread with no trace in flight is the sentinel."""
    import sys
    import threading
    import types

    from envbisect.agent import probe_facts

    tls = threading.local()
    st = types.SimpleNamespace(
        _is_fx_tracing_tls=tls, _get_is_fx_tracing=lambda: getattr(tls, "flag", False)
    )
    assert probe_facts._flag(st) == (False, "thread-local")
    tls.flag = True
    assert probe_facts._flag(st) == (True, "thread-local")
    seen: list[Any] = []
    other = threading.Thread(target=lambda: seen.append(probe_facts._flag(st)))
    other.start()
    other.join()
    assert seen == [(False, "thread-local")]  # another thread's flag is its own
    monkeypatch.setitem(sys.modules, "torch.fx._symbolic_trace", st)
    monkeypatch.setitem(probe_facts.SEEN, "flag_outside", {})
    probe_facts.check_flag()
    assert probe_facts.SEEN["flag_outside"] == {probe_facts.thread_no(threading.get_ident()): 1}
    # up to 2.13: the module global
    assert probe_facts._flag(types.SimpleNamespace(_is_fx_tracing_flag=True)) == (True, "global")
