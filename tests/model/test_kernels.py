"""The kernel diff over hand-made tables: each kind of change, per-step normalisation when
the two runs profiled different numbers of steps, and the reasons a table cannot be read."""

from __future__ import annotations

from typing import Any

import pytest

from envbisect.model.kernels import Change, ProfileTable, diff


def _row(name: str, us: float, count: int, kind: str = "kernel") -> dict[str, Any]:
    key = "self_device_us" if kind == "kernel" else "self_cpu_us"
    return {"name": name, "kind": kind, "count": count, key: us}


def _table(steps: int, step_us: float, *rows: dict[str, Any]) -> ProfileTable:
    facts = {"profile": {"steps": steps, "step_us": step_us, "device": "cuda", "rows": list(rows)}}
    return ProfileTable.from_facts(facts)


def test_each_kind_of_change_per_step_and_biggest_first() -> None:
    good = _table(
        2,
        1000.0,
        _row("flex_fused", 1200.0, 2),  # 600 µs a step
        _row("gemm_a", 400.0, 4),  # 200 µs a step
        _row("elementwise", 100.0, 8),
        _row("cudaMalloc", 2.0, 2, kind="op"),
        _row("Optimizer.step#AdamW.step", 50.0, 2, kind="annotation"),
    )
    bad = _table(
        4,
        2000.0,
        _row("bmm", 2400.0, 8),  # 600 µs a step, new
        _row("softmax", 1600.0, 4),  # 400 µs a step, new
        _row("gemm_a", 1200.0, 8),  # 300 µs a step: slower
        _row("elementwise", 204.0, 16),  # 51 µs a step vs 50: same
        _row("cudaMalloc", 8.0, 40, kind="op"),  # 1 → 10 calls a step, 2 µs
    )
    d = diff(good, bad)
    by = {c.name: c for c in d.changes}
    # equal shares: the bigger calls change first (bmm: 2 a step, flex_fused: 1)
    assert [c.name for c in d.notable] == ["bmm", "flex_fused", "softmax", "gemm_a", "cudaMalloc"]
    assert by["flex_fused"].change is Change.VANISHED
    assert by["flex_fused"].share == pytest.approx(-600 / 2000)
    assert by["bmm"].change is Change.APPEARED and by["bmm"].bad_calls == 2
    assert by["gemm_a"].change is Change.SLOWER
    assert (by["gemm_a"].good_us, by["gemm_a"].bad_us) == (200.0, 300.0)
    assert by["elementwise"].change is Change.SAME
    assert by["cudaMalloc"].change is Change.MORE_CALLS
    assert (by["cudaMalloc"].good_calls, by["cudaMalloc"].bad_calls) == (1.0, 10.0)
    assert "Optimizer.step#AdamW.step" not in by  # an annotation only wraps
    assert d.step_ratio == 2.0
    doc = d.as_dict()
    assert doc["changes"][1]["change"] == "vanished" and doc["good"]["steps"] == 2
    assert doc["changes"][0]["delta_us_per_step"] == 600.0


def test_faster_and_fewer_calls() -> None:
    good = _table(1, 1000.0, _row("gemm", 500.0, 1), _row("cudaMalloc", 1.0, 12, kind="op"))
    bad = _table(1, 800.0, _row("gemm", 300.0, 1), _row("cudaMalloc", 1.0, 3, kind="op"))
    by = {c.name: c.change for c in diff(good, bad).changes}
    assert by == {"gemm": Change.FASTER, "cudaMalloc": Change.FEWER_CALLS}


@pytest.mark.parametrize(
    ("facts", "said"),
    [
        (None, "no facts"),
        ({"torch": "2.13"}, "no profile in the facts"),
        ({"profile": {"steps": 0, "note": "no optimizer step seen"}}, "no optimizer step seen"),
        ({"profile": {"error": "RuntimeError: boom"}}, "the profiler failed: RuntimeError: boom"),
        ({"profile": {"steps": 2, "rows": [{"count": 1}]}}, "malformed profile table"),
    ],
)
def test_a_table_that_cannot_be_read_says_why(facts: Any, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        ProfileTable.from_facts(facts)
