"""The probe inside real programs: real torch on CPU, each fixture script under the probe,
each fact read from what the probe delivered (a file here; a frame through a layer).

The scripts (fixtures/probe/) are tiny: torch.compile with the eager backend, so no
inductor compile is needed, and flex_attention's eager path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from envbisect.cli import cli
from envbisect.model.facts import describe, explain
from envbisect.run.probed import bootstrap, probe_command, wrap
from envbisect.transport import Transport, parse_layer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "probe"
PY = sys.executable

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _inductor_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def _probe(tmp_path: Path, *words: str, transport: Transport | None = None) -> Any:
    argv = [PY, str(FIXTURES / words[0]), *words[1:]]
    return probe_command(
        argv,
        transport=transport or Transport(),
        python=PY,
        timeout_s=300,
        log_dir=tmp_path / "logs",
    )


def test_graph_breaks_are_counted_with_their_reason(tmp_path: Path) -> None:
    run = _probe(tmp_path, "graph_breaks.py")
    assert run.exit_status == 0
    comp = run.facts["compile"]
    # two print()s in one compiled function: two breaks, three graphs, all read per reason
    assert comp["graph_breaks"] == 2
    assert comp["unique_graphs"] == 3
    [(reason, n)] = comp["graph_break_reasons"].items()
    assert n == 2 and "print" in reason
    assert comp["recompiles"] == 0
    assert run.facts["threads"]["called_compiled"] == 1
    # the program's own output is untouched: stdout holds only what it printed
    assert (tmp_path / "logs" / "probe.stdout").read_text() == "sum 32.0\n"


def test_recompiles_on_new_shapes_name_the_guard(tmp_path: Path) -> None:
    run = _probe(tmp_path, "recompile.py", "5")
    comp = run.facts["compile"]
    assert comp["frames_compiled"] == 5
    assert comp["recompiles"] == 4
    [(reason, n)] = comp["recompile_reasons"].items()
    assert n == 4 and "size mismatch" in reason and "'x'" in reason


def test_flex_attention_called_eagerly_is_counted(tmp_path: Path) -> None:
    run = _probe(tmp_path, "flex_eager.py", "4")
    flex = run.facts["flex"]
    # flex_attention's eager path compiles a wrapper of its own: that is not "compiled"
    assert flex == {"eager_calls": 4, "compiled_graphs": 0, "imported": True}
    assert run.facts["threads"]["called_compiled"] == 0
    assert any("without torch.compile" in w["message"] for w in run.facts["warnings"])
    assert (tmp_path / "logs" / "probe.stdout").read_text() == "out (1, 1, 16, 8)\n"


def test_flex_attention_compiled_is_told_apart(tmp_path: Path) -> None:
    script = tmp_path / "flex_compiled.py"
    script.write_text(
        "import torch\n"
        "from torch.nn.attention.flex_attention import flex_attention\n"
        "flex = torch.compile(flex_attention, backend='eager')\n"
        "q = torch.randn(1, 1, 16, 8)\n"
        "for _ in range(3):\n"
        "    flex(q, q, q)\n"
    )
    run = probe_command(
        [PY, str(script)], transport=Transport(), python=PY, timeout_s=300, log_dir=tmp_path
    )
    flex = run.facts["flex"]
    assert flex["eager_calls"] == 0 and flex["compiled_graphs"] == 1
    assert run.facts["threads"]["called_compiled"] == 1


def test_patched_is_fx_symbolic_tracing_and_the_stuck_flag(tmp_path: Path) -> None:
    run = _probe(tmp_path, "fx_patch.py")
    fx = run.facts["fx"]
    assert fx["is_fx_symbolic_tracing"] == "patched"
    assert fx["patched_at"] == f"{FIXTURES / 'fx_patch.py'}:7"
    # torch 2.13 keeps the flag in a module global (2.14: thread-local); left set at exit,
    # with no trace in flight, in the main thread (thread 1)
    assert fx["flag_storage"] == ("thread-local" if _torch_214() else "global")
    assert fx["flag_at_exit"] is True
    assert fx["flag_outside_trace"] == {"1": 1}


def test_fx_flag_set_by_a_real_trace_is_not_a_sentinel(tmp_path: Path) -> None:
    script = tmp_path / "trace.py"
    script.write_text(
        "import threading, torch, torch.fx\n"
        "def f(x):\n    return x + 1\n"
        "def work():\n    torch.fx.symbolic_trace(f)\n"
        "t = threading.Thread(target=work); t.start(); t.join()\n"
        "torch.fx.symbolic_trace(f)\n"
    )
    run = probe_command(
        [PY, str(script)], transport=Transport(), python=PY, timeout_s=300, log_dir=tmp_path
    )
    fx = run.facts["fx"]
    assert fx["is_fx_symbolic_tracing"] == "original" and fx["patched_at"] is None
    assert fx["flag_outside_trace"] == {} and fx["flag_at_exit"] is False


def test_a_crash_keeps_its_traceback_exit_status_and_facts(tmp_path: Path) -> None:
    run = _probe(tmp_path, "crash.py")
    assert run.exit_status == 1
    assert run.facts["crash"] == {
        "class": "RuntimeError",
        "message": "boom after one compiled step",
    }
    assert run.facts["compile"]["frames_compiled"] == 1
    stderr = (tmp_path / "logs" / "probe.stderr").read_text()
    # the traceback starts at the program, as without the probe
    tb = stderr[stderr.index("Traceback") :]
    assert "envbisect-probe" not in tb and '"<string>"' not in tb
    assert 'crash.py", line 13, in <module>' in tb
    assert tb.rstrip().endswith("RuntimeError: boom after one compiled step")


def test_ten_thousand_lines_of_noise_hide_nothing_even_through_a_layer(tmp_path: Path) -> None:
    # through a layer: the frame on stdout, after 10,000 printed lines (one a fake marker)
    layered = Transport((parse_layer("env ENVBISECT_TEST_LAYER=1"),))
    run = _probe(tmp_path, "noise.py", transport=layered)
    assert run.exit_status == 0
    assert run.facts["compile"]["frames_compiled"] == 1
    assert run.facts["threads"]["called_compiled"] == 1
    kept = json.loads((tmp_path / "logs" / "probe.facts.json").read_text())
    assert kept["compile"] == run.facts["compile"]
    lines = (tmp_path / "logs" / "probe.stdout").read_text().splitlines()
    assert len([x for x in lines if x.startswith(("config.", "step "))]) == 10_000


def test_program_semantics_are_kept(tmp_path: Path) -> None:
    """``__name__``, ``__file__``, ``sys.argv``, ``sys.path[0]``, stdin and the exit status
    are those of the plain run, for a script, ``-m`` and ``-c``."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    show = (
        "import json, os, sys\n"
        "main = sys.modules['__main__']\n"
        "print(json.dumps([__name__, os.path.basename(getattr(main, '__file__', '-')),"
        " sys.argv[1:], sys.path[0] == os.path.dirname(os.path.abspath(sys.argv[0]))"
        " if sys.argv[0] not in ('-c', '-m') else sys.path[0], sys.stdin.read(),"
        " sorted(k for k in vars(main) if not k.startswith('__'))]))\n"
        "sys.exit(3)\n"
    )
    (tmp_path / "show.py").write_text(show)
    (pkg / "__main__.py").write_text(show)
    forms = (
        [PY, "show.py", "a", "--b=1"],
        [PY, "-u", "show.py", "a"],
        [PY, "-m", "pkg", "a"],
        [PY, "-c", show, "a"],
    )
    for argv in forms:
        plain = subprocess.run(argv, cwd=tmp_path, input="in", capture_output=True, text=True)
        probed = subprocess.run(
            list(wrap(argv, PY).argv), cwd=tmp_path, input="in", capture_output=True, text=True
        )
        assert (probed.returncode, probed.stdout) == (plain.returncode, plain.stdout), argv
        assert plain.returncode == 3


def test_envbisect_probe_command_text_json_and_no_probe_form(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["probe", "--python", PY, "--log-dir", str(tmp_path / "l")]
    res = runner.invoke(
        cli, [*args, "--", PY, str(FIXTURES / "recompile.py"), "3"], standalone_mode=False
    )
    assert res.exception is None and res.return_value == 0, res.output
    assert "torch.compile: 3 frames compiled, 3 unique graphs, 2 recompiles" in res.output
    assert "  recompile ×2: tensor 'x' size mismatch at index 0. expected 2, actual 3" in res.output
    res = runner.invoke(
        cli,
        [*args, "--format", "json", "--", PY, str(FIXTURES / "crash.py")],
        standalone_mode=False,
    )
    assert res.return_value == 1
    data = json.loads(res.output)
    assert data["exit_status"] == 1 and data["facts"]["crash"]["class"] == "RuntimeError"
    assert "<envbisect probe bootstrap>" in data["argv"]
    res = runner.invoke(cli, [*args, "--", "bash", "-c", "true"], standalone_mode=False)
    assert res.exception is not None and "bash is not a Python interpreter" in str(res.exception)


def test_good_vs_bad_facts_explained_from_real_runs(tmp_path: Path) -> None:
    good = _probe(tmp_path / "g", "graph_breaks.py").facts
    bad = _probe(tmp_path / "b", "flex_eager.py", "16").facts
    lines = explain(good, bad)
    assert "bad: flex_attention ran eagerly 16× (good: not called)" in lines
    assert any(x.startswith("bad: 0 graph breaks (good: 2)") for x in lines)
    assert "bad: 0 threads called compiled code (good: 1)" in lines
    assert describe(bad)[2] == "flex_attention: ran eagerly 16×"


def _torch_214() -> bool:
    import torch

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 14)


def test_bootstrap_is_one_word_of_safe_characters() -> None:
    boot = bootstrap()
    assert "\n" not in boot and '"' not in boot and "$" not in boot and "`" not in boot


def test_a_script_that_cannot_be_opened_is_said_as_python_says_it(tmp_path: Path) -> None:
    for argv in ([PY, "missing.py"], [PY, "-m", "missing_module"]):
        plain = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
        probed = subprocess.run(
            list(wrap(argv, PY).argv), cwd=tmp_path, capture_output=True, text=True
        )
        assert (probed.returncode, probed.stderr) == (plain.returncode, plain.stderr), argv


def test_the_fields_race_another_threads_trace_seen_by_a_compiled_call(tmp_path: Path) -> None:
    run = _probe(tmp_path, "fx_race.py")
    fx = run.facts["fx"]
    out = (tmp_path / "logs" / "probe.stdout").read_text()
    if _torch_214():  # thread-local: the main thread never sees the tracer's flag
        assert fx["flag_from_other_thread"] == {} and out == "compiled call ran\n"
    else:
        assert fx["flag_from_other_thread"] == {"1": 1}
        assert out.startswith("compiled call refused:")
    assert fx["flag_outside_trace"] == {} and fx["flag_at_exit"] is False


def test_torchrun_runs_every_worker_under_the_probe(tmp_path: Path) -> None:
    script = tmp_path / "tr.py"
    script.write_text("import os, sys\nprint('rank', os.environ['RANK'], sys.argv[1:], __name__)\n")
    torchrun = str(Path(PY).parent / "torchrun")
    argv = [torchrun, "--standalone", "--nproc_per_node", "2", str(script), "--x", "1"]
    run = probe_command(argv, transport=Transport(), python=PY, timeout_s=300, log_dir=tmp_path)
    assert run.exit_status == 0 and run.facts["exit_code"] == 0 and "rank" not in run.facts
    lines = ["rank 0 ['--x', '1'] __main__\n", "rank 1 ['--x', '1'] __main__\n"]
    # The two workers share one stdout and may interleave mid-line: compare as characters.
    out = (tmp_path / "probe.stdout").read_text()
    assert sorted(out) == sorted("".join(lines)), out
    rank1 = json.loads((tmp_path / "probe.facts.json.rank1").read_text())
    assert rank1["rank"] == 1
