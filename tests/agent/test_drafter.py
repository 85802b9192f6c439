"""The DFlash drafter smoke test: mask, training, result schema, knobs, host and CLI.

Everything runs real torch on CPU at micro sizes (tests/helpers_smoke.py). Compiled paths use
dynamo's ``eager`` backend: it counts graphs and recompiles exactly as inductor would, without
the C++ build that makes CPU inductor too slow for a 2-core CI machine.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers_smoke import MICRO, MICRO_FLAGS, run_drafter_process

torch = pytest.importorskip("torch")

from envbisect.agent import drafter, drafter_facts, drafter_model, drafter_params  # noqa: E402
from envbisect.cli import cli  # noqa: E402  (after the torch skip)
from envbisect.model.errors import SmokeError  # noqa: E402
from envbisect.run import smoke as host  # noqa: E402
from envbisect.transport import Transport  # noqa: E402


def micro(**over):
    return dict(MICRO, **over)


# ----------------------------------------------------------------------------- mask


def test_dflash_mask_matches_hand_computed_case() -> None:
    # context of 6 tokens, blocks of 2, anchors at positions 1 and 4
    anchors = torch.tensor([[1, 4]])
    mask = drafter_model.dflash_mask_dense(torch, anchors, ctx_len=6, block_size=2)
    # columns: context 0..5, then block 0 slots (6, 7), block 1 slots (8, 9)
    block0 = [1, 0, 0, 0, 0, 0, 1, 1, 0, 0]  # before anchor 1: only token 0; own block
    block1 = [1, 1, 1, 1, 0, 0, 0, 0, 1, 1]  # before anchor 4: tokens 0..3; own block
    expected = torch.tensor([[block0, block0, block1, block1]], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_flex_mask_mod_agrees_with_dense_mask() -> None:
    anchors = torch.tensor([[3, 9, 20], [1, 2, 30]])
    ctx, bs = 40, 4
    dense = drafter_model.dflash_mask_dense(torch, anchors, ctx, bs)
    mod = drafter_model.dflash_mask_mod(anchors, ctx, bs)
    t = anchors.shape[1] * bs
    b = torch.arange(2)[:, None, None]
    q = torch.arange(t)[None, :, None]
    kv = torch.arange(ctx + t)[None, None, :]
    assert torch.equal(mod(b, 0, q, kv), dense)


def test_attended_pairs_counts_the_mask() -> None:
    anchors = torch.tensor([[1, 4]])
    mask = drafter_model.dflash_mask_dense(torch, anchors, ctx_len=6, block_size=2)
    assert drafter_model.attended_pairs(anchors, 2) == int(mask.sum())


# ----------------------------------------------------------------------------- training


def test_loss_decreases_on_a_fixed_batch() -> None:
    p = drafter.resolve_params(micro(lr=3e-3), cuda_available=False)
    trainer = drafter_model.Trainer(torch, p)
    batch = trainer.make_batch(p["seq_len"], p["anchors"])
    losses = [float(trainer.step(batch)) for _ in range(30)]
    # frozen random embedding and lm_head cap how far it can go; a broken gradient stays flat
    assert losses[-1] < losses[0] - 0.5, losses
    assert sum(losses[-5:]) < sum(losses[:5]), losses


def test_weighted_loss_matches_plain_cross_entropy() -> None:
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(10, 8, generator=gen, requires_grad=True)
    w = torch.randn(20, 8, generator=gen)
    labels = torch.randint(0, 20, (10,), generator=gen)
    wts = torch.rand(10, generator=gen)
    fused = drafter_model.make_linear_ce(torch, drafter_model.make_chunk_loss(torch), chunk=3)
    loss = fused(h, w, labels, wts)
    loss.backward()
    h2 = h.detach().clone().requires_grad_(True)
    per = torch.nn.functional.cross_entropy(h2 @ w.t(), labels, reduction="none")
    ref = (per * wts).sum() / wts.sum()
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(h.grad, h2.grad, atol=1e-5)


def test_slot_weights_decay_with_gamma() -> None:
    p = drafter.resolve_params(micro(), cuda_available=False)
    trainer = drafter_model.Trainer(torch, p)
    w = trainer.slot_w
    assert w.shape == (15,)
    assert float(w[0]) == pytest.approx(1.0)
    assert float(w[7]) == pytest.approx(pytest.importorskip("math").exp(-1.0))


# ----------------------------------------------------------------------------- result


def test_standalone_run_prints_line_and_writes_file(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc, line = run_drafter_process(MICRO_FLAGS, result_file=out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(out.read_text()) == line
    assert set(drafter.RESULT_KEYS) <= set(line)
    assert line["ok"] is True and line["error"] is None
    assert line["tok_per_s"] > 0 and line["tok_per_s_steady"] > 0
    assert line["step_s"]["p10"] <= line["step_s"]["median"] <= line["step_s"]["p90"]
    assert line["device"]["type"] == "cpu"
    assert line["attn"] == "sdpa" and line["compile"]["requested"] is False
    assert line["torch"] == torch.__version__
    assert line["fx_tracing"]["flag"] is False
    assert "[smoke]" in proc.stderr and "[smoke]" not in proc.stdout


def test_script_path_runs_without_envbisect_on_path(tmp_path: Path) -> None:
    import subprocess

    script = Path(drafter.__file__)
    proc = subprocess.run(
        [sys.executable, str(script), *MICRO_FLAGS],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ENVBISECT_RESULT {")


def test_agent_run_frames_result_and_keeps_stdout_line(tmp_path: Path) -> None:
    result = Transport().run_agent(
        sys.executable, "envbisect.agent.drafter", micro(), timeout_s=300, log_dir=tmp_path
    )
    assert result["ok"] is True
    stdout = b"".join(p.read_bytes() for p in tmp_path.rglob("*stdout*"))
    assert b"\nENVBISECT_RESULT {" in stdout or stdout.startswith(b"ENVBISECT_RESULT {")


def test_bad_params_are_a_params_error() -> None:
    result = drafter.run(micro(heads=3, kv_heads=2))
    assert result["ok"] is False
    assert result["error"]["stage"] == "params"
    assert "multiple of kv_heads" in result["error"]["message"]


# ----------------------------------------------------------------------------- knobs


def test_vary_shapes_raises_recompiles() -> None:
    base = drafter.run(micro(compile=True, compile_backend="eager", warmup=2, steps=4))
    varied = drafter.run(
        micro(compile=True, compile_backend="eager", warmup=2, steps=4, vary_shapes=True)
    )
    assert base["ok"] and varied["ok"], (base["error"], varied["error"])
    assert base["compile"]["effective"] is True
    assert base["dynamo"]["recompiles"] == 0
    assert varied["dynamo"]["recompiles"] > 0


def test_no_compile_compiles_nothing() -> None:
    result = drafter.run(micro(compile=False))
    assert result["ok"]
    assert result["compile"] == {
        "requested": False,
        "backend": None,
        "mode": None,
        "disabled_by_env": False,
        "effective": False,
        "unit": "layer",
    }
    assert result["dynamo"]["frames_compiled"] == 0


def test_torch_compile_disable_env_is_reported() -> None:
    flags = [*MICRO_FLAGS, "--compile", "--compile-backend=eager"]
    _, result = run_drafter_process(flags, env={"TORCH_COMPILE_DISABLE": "1"})
    assert result["ok"]
    assert result["compile"]["requested"] is True
    assert result["compile"]["disabled_by_env"] is True
    assert result["compile"]["effective"] is False
    assert result["env"]["TORCH_COMPILE_DISABLE"] == "1"


def test_flex_eager_reports_the_fallback() -> None:
    result = drafter.run(micro(attn="flex-eager"))
    assert result["attn"] == "flex-eager"
    assert result["flex_fallback"] is True
    assert result["flex_eager_calls"] >= 1
    if not result["ok"]:  # flex has no backward on CPU: the crash is a result
        assert result["error"]["class"] == "NotImplementedError"


def test_data_lengths_drive_the_batches(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"length": 48}\n{"input_ids": [1, 2, 3]}\n{"text": "a b c d"}\n')
    result = drafter.run(micro(data=str(data), steps=3))
    assert result["ok"], result["error"]
    assert result["data"] == {"path": str(data), "records": 3}
    # warm-up takes record 0; the timed steps records 1, 2, 0. Short records count as two
    # blocks (32 tokens): 32 + 32 + 48.
    assert result["timed_tokens"] == 112


def test_data_shape_plan_follows_the_records() -> None:
    p = drafter.resolve_params(micro(batch=2), cuda_available=False)
    plan = drafter_params.ShapePlan(p, lengths=[40, 64, 128, 16])
    assert plan.next() == (64, 4, 104)
    assert plan.next() == (128, 8, 160)


def test_bad_data_line_is_a_params_error(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"length": 48}\n{"nothing": 1}\n')
    result = drafter.run(micro(data=str(data)))
    assert result["error"]["stage"] == "params"
    assert f"{data}:2:" in result["error"]["message"]


def test_drafter_threads_step_concurrently() -> None:
    result = drafter.run(micro(drafter_threads=2))
    assert result["ok"], result["error"]
    assert result["compile"]["unit"] == "flex"  # auto with 2+ drafters: the field's pattern
    threads = result["threads"]
    assert (threads["count"], threads["errors"], threads["crashed"], threads["died"]) == (
        2,
        [],
        0,
        [],
    )
    assert [t["steps_done"] for t in threads["per_thread"]] == [3, 3]  # 1 warm-up + 2 timed
    assert all(t["ok"] and t["path"] == "eager (compile off)" for t in threads["per_thread"])


# ----------------------------------------------------------------------------- the FX race
#
# The race needs a second thread inside an FX trace at the moment a compiled function is
# entered: on a GPU that is inductor's own tracing. Here a model file holds the flag up for
# the whole run, so dynamo's real check fires every time, deterministically, on CPU.

FLAG_UP = "import torch.fx._symbolic_trace as _st\n_st._is_fx_tracing_flag = True\n"
FIELD_PATCH = "_st.is_fx_symbolic_tracing = lambda: False\n"  # the demo's hand patch


def _flag_module(tmp_path: Path, text: str) -> str:
    path = tmp_path / "model_patch.py"
    path.write_text(text)
    return str(path)


@pytest.fixture()
def fx_flag_restored():
    import torch.fx._symbolic_trace as st

    saved = (st._is_fx_tracing_flag, st.is_fx_symbolic_tracing)
    yield
    st._is_fx_tracing_flag, st.is_fx_symbolic_tracing = saved


def _compiled(**over):
    over.setdefault("compile_unit", "layer")  # on CPU attention is sdpa: compile it
    return micro(compile=True, compile_backend="eager", drafter_threads=2, **over)


@pytest.mark.usefixtures("fx_flag_restored")
def test_nested_fx_trace_kills_the_drafters_as_in_the_field(tmp_path: Path) -> None:
    result = drafter.run(_compiled(patch_module=_flag_module(tmp_path, FLAG_UP)))
    assert result["ok"] is False
    assert result["error"]["class"] == "RuntimeError"
    assert "Detected that you are using FX to symbolically trace" in result["error"]["message"]
    threads = result["threads"]
    assert threads["crashed"] == 2 and sorted(threads["died"]) == [0, 1]
    for t in threads["per_thread"]:
        assert t["ok"] is False and t["steps_done"] == 0
        assert t["error"]["stage"] == "warmup" and t["error"]["class"] == "RuntimeError"
    assert result["race"]["patch_module"]["path"].endswith("model_patch.py")


@pytest.mark.usefixtures("fx_flag_restored")
def test_nested_fx_unoptimized_survives_but_runs_outside_the_graph(tmp_path: Path) -> None:
    result = drafter.run(
        _compiled(patch_module=_flag_module(tmp_path, FLAG_UP), nested_fx="unoptimized")
    )
    assert result["ok"], result["error"]
    assert result["race"]["error_on_nested_fx_trace"] is False
    for t in result["threads"]["per_thread"]:
        assert t["ok"] and t["path"].startswith("unoptimized")
        assert t["eager_attention_calls"] == 3  # every step: 1 warm-up + 2 timed, one layer
    import torch._dynamo.config as dc

    assert dc.error_on_nested_fx_trace is True  # restored after the run


@pytest.mark.usefixtures("fx_flag_restored")
def test_field_monkey_patch_from_a_model_file_silences_the_check(tmp_path: Path) -> None:
    result = drafter.run(_compiled(patch_module=_flag_module(tmp_path, FLAG_UP + FIELD_PATCH)))
    assert result["ok"], result["error"]
    assert result["race"]["is_fx_symbolic_tracing"]["torch.fx._symbolic_trace"]["patched"]
    assert all(t["path"] == "compiled" for t in result["threads"]["per_thread"])


def test_masks_once_are_built_before_the_threads_and_reused() -> None:
    result = drafter.run(_compiled(mask_build="once"))
    assert result["ok"], result["error"]
    assert [t["mask_builds"] for t in result["threads"]["per_thread"]] == [1, 1]
    assert result["race"]["mask_build"] == "once"


def test_locked_masks_are_built_every_step() -> None:
    result = drafter.run(_compiled(mask_build="locked"))
    assert result["ok"], result["error"]
    assert [t["mask_builds"] for t in result["threads"]["per_thread"]] == [3, 3]
    assert all(t["path"] == "compiled" for t in result["threads"]["per_thread"])


@pytest.mark.parametrize("unit", ["model", "layer", "flex"])
def test_compile_units_compile_and_report(unit: str) -> None:
    result = drafter.run(micro(compile=True, compile_backend="eager", compile_unit=unit))
    assert result["ok"], result["error"]
    assert result["compile"]["unit"] == unit
    # sdpa on CPU: the "flex" unit compiles only the loss; the others the attention too
    assert result["compile"]["effective"] is True
    assert result["dynamo"]["recompiles"] == 0


def test_patch_module_missing_is_a_params_error(tmp_path: Path) -> None:
    result = drafter.run(micro(patch_module=str(tmp_path / "nope.py")))
    assert result["error"]["stage"] == "params"
    assert "no such file" in result["error"]["message"]


# ----------------------------------------------------------------------------- samples


def test_samples_are_windows_of_one_process() -> None:
    result = drafter.run(micro(samples=3, steps=2))
    assert result["ok"], result["error"]
    assert len(result["samples"]) == 3 and all(s > 0 for s in result["samples"])
    assert result["step_s"]["n"] == 6
    assert min(result["samples"]) <= result["tok_per_s"] <= max(result["samples"])


def test_equal_chunks_pad_the_tail() -> None:
    assert drafter_model.equal_chunks(7680, 4096) == (3840, 7680)
    assert drafter_model.equal_chunks(100, 32) == (25, 100)
    assert drafter_model.equal_chunks(101, 32) == (26, 104)
    assert drafter_model.equal_chunks(10, 32) == (10, 10)


# ----------------------------------------------------------------------------- host and CLI


def test_host_raises_smoke_error_for_params(tmp_path: Path) -> None:
    with pytest.raises(SmokeError, match="multiple of kv_heads"):
        host.run_smoke(
            Transport(),
            sys.executable,
            micro(heads=3, kv_heads=2),
            timeout_s=300,
            log_dir=tmp_path,
        )


def test_host_parse_env() -> None:
    assert host.parse_env(("A=1", "B=x=y")) == {"A": "1", "B": "x=y"}
    with pytest.raises(SmokeError, match="NAME=VALUE"):
        host.parse_env(("NOVALUE",))


def test_cli_smoke_json_exit_0() -> None:
    args = ["smoke", "--python", sys.executable, "--format", "json", "--steps", "2"]
    args += ["--preset", "tiny", "--layers", "1", "--hidden", "64", "--seq-len", "64"]
    args += ["--anchors", "4", "--batch", "1", "--warmup", "1"]
    res = CliRunner().invoke(cli, args, standalone_mode=False)
    assert res.exception is None, res.output
    assert res.return_value == 0
    assert json.loads(res.stdout)["ok"] is True


def test_cli_smoke_failed_run_exit_1_and_env_reaches_target() -> None:
    args = ["smoke", "--python", sys.executable, "--attn", "flex-eager", "--steps", "1"]
    args += ["--preset", "tiny", "--layers", "1", "--hidden", "64", "--seq-len", "64"]
    args += ["--anchors", "4", "--batch", "1", "--warmup", "1", "--env", "OMP_NUM_THREADS=1"]
    args += ["--format", "json"]
    res = CliRunner().invoke(cli, args, standalone_mode=False)
    assert res.exception is None, res.output
    result = json.loads(res.stdout)
    assert result["env"]["OMP_NUM_THREADS"] == "1"
    assert res.return_value == (0 if result["ok"] else 1)
    assert result["flex_fallback"] is True


def test_cli_smoke_missing_data_exits_2(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "smoke", "--python", sys.executable]
        + ["--data", str(tmp_path / "missing.jsonl")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("envbisect: error: smoke parameters rejected")
    assert "missing.jsonl" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_smoke_print_command_shows_env_layer() -> None:
    args = ["smoke", "--python", "/opt/py/bin/python3", "--env", "OMP_NUM_THREADS=1"]
    res = CliRunner().invoke(cli, [*args, "--print-command"], standalone_mode=False)
    assert res.exception is None, res.output
    assert res.return_value == 0
    assert res.stdout.strip() == "env OMP_NUM_THREADS=1 /opt/py/bin/python3 -"


def test_samples_env_sets_the_window_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVBISECT_SAMPLES", "2")
    result = drafter.run(micro(steps=1))
    assert result["ok"], result["error"]
    assert len(result["samples"]) == 2
    monkeypatch.setenv("ENVBISECT_SAMPLES", "many")
    assert drafter.run(micro())["error"]["stage"] == "params"


# ----------------------------------------------------------------------------- CPU threads


def test_cpu_threads_are_sized_to_the_cores_really_free() -> None:
    size = drafter_facts.size_cpu_threads
    tiny, h200 = {"preset": "tiny"}, {"preset": "h200"}
    assert size(tiny, 8, 0.0, None)[0] == 1  # tiny: one thread unless asked
    assert size(dict(tiny, cpu_threads=3), 8, 0.0, None) == (3, "asked (--cpu-threads)")
    assert size(h200, 8, 0.0, None)[0] == 8
    assert size(h200, 8, 2.2, None) == (6, "8 usable cores, 2 busy at start")
    assert size(h200, 2, 1.9, None)[0] == 1  # never below one
    assert size(h200, 8, 0.0, "4") == (None, "OMP_NUM_THREADS=4")  # left as torch read it


def test_a_cpu_run_records_its_threads_affinity_and_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        result = drafter.run(micro(preset="tiny"))
        assert result["ok"], result["error"]
        cpu = result["cpu"]
        assert cpu["threads"] == 1 == result["device"]["threads"]
        assert cpu["why"].startswith("tiny preset")
        assert cpu["affinity"] == sorted(os.sched_getaffinity(0))
        assert cpu["busy_cores_start"] is not None and cpu["busy_cores_during"] is not None
        assert cpu["load_start"] is not None and cpu["load_end"] is not None
        asked = drafter.run(micro(preset="tiny", cpu_threads=2))
        assert asked["cpu"]["threads"] == 2 and asked["cpu"]["why"] == "asked (--cpu-threads)"
    finally:
        torch.set_num_threads(before)


def test_compiling_inside_a_timed_window_makes_the_rate_over_all_windows_the_one_sample() -> None:
    """The field's grown data: new shapes recompile after the warm-up. That window's time is
    the program's own cost (H100: windows of 1.9, 39 and 58 Ktok/s, 5.0 Ktok/s over all of
    them), not noise the median of the windows should step over."""
    same = drafter.run(micro(compile=True, compile_backend="eager", warmup=2, steps=2, samples=3))
    grown = drafter.run(
        micro(compile=True, compile_backend="eager", warmup=2, steps=2, samples=3, vary_shapes=True)
    )
    assert same["ok"] and grown["ok"], (same["error"], grown["error"])
    assert "compiled_in_windows" not in same and len(same["samples"]) == 3
    hot = grown["compiled_in_windows"]
    assert hot["windows"] and hot["frames"] >= 1
    assert grown["samples"] == [grown["tok_per_s"]]
    windows = grown["window_samples"]
    assert len(windows) == 3
    # the one sample is tokens over the time of all windows: below their median
    assert grown["tok_per_s"] < sorted(windows)[1]


# ----------------------------------------------------------------------------- flex decoding


def _flex_attend(monkeypatch: pytest.MonkeyPatch, **over: object) -> list[object]:
    """The kernel_options each flex_attention call of a micro drafter's attention got (a
    real forward on CPU, no grad: flex has no CPU backward)."""
    import torch.nn.attention.flex_attention as fa

    seen: list[object] = []
    real = fa.flex_attention

    def spy(q, k, v, **kw):  # type: ignore[no-untyped-def]
        seen.append(kw.get("kernel_options"))
        return real(q, k, v, **kw)

    monkeypatch.setattr(fa, "flex_attention", spy)
    p = drafter_params.resolve_params(micro(attn="flex", compile=False, **over), False)
    trainer = drafter_model.Trainer(torch, p)
    batch = trainer.make_batch(p["seq_len"], p["anchors"])
    attend = trainer.build_attend(batch)
    bs, n = p["block_size"], p["anchors"]
    q = torch.randn(1, p["heads"], n * bs, p["head_dim"])
    kv = torch.randn(1, p["kv_heads"], p["seq_len"] + n * bs, p["head_dim"])
    with torch.no_grad():
        out = attend(q, kv, kv)
    assert out.shape == q.shape and bool(torch.isfinite(out).all())
    return seen


def test_flex_attention_keeps_the_main_kernel_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # The field's data on torch 2.11: a short query whose length the recompile made dynamic
    # went to the flex-decoding kernel, whose autotune had no valid choice.
    assert drafter_params.DEFAULTS["flex_decoding"] == "off"
    assert _flex_attend(monkeypatch) == [{"FORCE_USE_FLEX_ATTENTION": True}]


def test_flex_decoding_auto_leaves_the_kernel_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _flex_attend(monkeypatch, flex_decoding="auto") == [None]


def test_flex_decoding_refuses_an_unknown_choice() -> None:
    result = drafter.run(micro(flex_decoding="sometimes"))
    assert result["error"]["stage"] == "params"
    assert "unknown flex decoding 'sometimes' (off, auto)" in result["error"]["message"]
