"""Workers: --workers N|auto, the fact check, calibration, the pool's scheduling."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from envbisect.model.config import Config
from envbisect.model.errors import ConfigError, UsageError, WorkerError
from envbisect.run.workers import (
    MAX_SKEW,
    Worker,
    WorkerPool,
    calibrate,
    config_workers,
    fact_mismatch,
    parse_count,
    slot_workers,
    visible_gpus,
)
from envbisect.search import Outcome, State


def test_workers_count_parses_numbers_and_auto() -> None:
    assert parse_count("3") == 3 and parse_count("auto") is None
    for bad in ("0", "-1", "two"):
        with pytest.raises(UsageError, match="--workers"):
            parse_count(bad)


def test_gpu_slots_get_one_device_each() -> None:
    workers = slot_workers(None, gpus=[0, 1, 2], cpus=[0, 1])
    assert [w.name for w in workers] == ["gpu0", "gpu1", "gpu2"]
    assert [dict(w.env) for w in workers] == [{"CUDA_VISIBLE_DEVICES": str(i)} for i in range(3)]
    assert [w.device for w in workers] == [0, 1, 2] and not any(w.cpus for w in workers)
    assert len(slot_workers(2, gpus=[4, 5, 6], cpus=[])) == 2
    with pytest.raises(UsageError, match="3 visible GPU"):
        slot_workers(4, gpus=[0, 1, 2], cpus=[0])


def test_cpu_host_pins_workers_to_disjoint_cores_or_refuses() -> None:
    workers = slot_workers(2, gpus=[], cpus=[0, 1, 2, 3])
    assert [w.cpus for w in workers] == [(0, 1), (2, 3)]
    assert [w.pin_argv() for w in workers] == [("taskset", "-c", "0,1"), ("taskset", "-c", "2,3")]
    assert workers[0].env == {"OMP_NUM_THREADS": "2"}
    with pytest.raises(UsageError, match="2 core.*disturb each other's throughput"):
        slot_workers(3, gpus=[], cpus=[0, 1])
    with pytest.raises(UsageError, match="no visible GPU"):
        slot_workers(None, gpus=[], cpus=[0, 1])


def test_visible_gpus_follow_cuda_visible_devices_then_the_snapshot() -> None:
    gpu = {"devices": [{"index": 0, "name": "H200"}, {"index": 1, "name": "H200"}]}
    assert visible_gpus(gpu, {}) == [0, 1]
    assert visible_gpus(gpu, {"CUDA_VISIBLE_DEVICES": "1"}) == [1]
    assert visible_gpus(gpu, {"CUDA_VISIBLE_DEVICES": ""}) == []


def _facts(name: str = "NVIDIA H200", driver: str = "570.86", torch: str = "2.13.0") -> Any:
    return {
        "gpu": {
            "driver": driver,
            "devices": [{"index": 0, "name": "NVIDIA H200"}, {"index": 1, "name": name}],
        },
        "torch": {"version": torch, "cuda": "13.0"},
        "system": {"cpu_model": "EPYC"},
    }


def test_fact_check_names_what_differs() -> None:
    want = _facts()
    want["gpu"]["devices"] = want["gpu"]["devices"][:1]
    assert fact_mismatch(Worker("gpu1", device=1), _facts(), want) is None
    assert fact_mismatch(Worker("gpu1", device=1), _facts(name="NVIDIA A100"), want) == (
        "GPU 1 'NVIDIA A100' differs from the target's 'NVIDIA H200'"
    )
    assert (
        fact_mismatch(Worker("box"), _facts(driver="560.1"), want)
        == "GPU driver 560.1 differs from the target's 570.86"
    )
    assert "torch version 2.12.0 differs" in str(
        fact_mismatch(Worker("box"), _facts(torch="2.12.0"), want)
    )
    cpu = {"gpu": {}, "torch": {"version": "2.13.0"}, "system": {"cpu_model": "EPYC"}}
    other = {**cpu, "system": {"cpu_model": "Xeon"}}
    assert (
        fact_mismatch(Worker("cpu1"), other, cpu) == "CPU 'Xeon' differs from the target's 'EPYC'"
    )


def test_calibration_keeps_scales_or_refuses() -> None:
    ref = [10_000.0, 10_100.0, 9_900.0]
    same = [10_050.0, 9_950.0, 10_000.0]
    slow = [9_300.0, 9_310.0, 9_290.0]  # 7% off, far outside a 1% noise
    cal = calibrate([("w0", ref), ("w1", same), ("w2", slow)])
    assert [(c.worker, c.decision) for c in cal] == [
        ("w0", "reference"),
        ("w1", "within noise"),
        ("w2", "scaled"),
    ]
    assert cal[1].factor == 1.0
    assert cal[2].factor == pytest.approx(10_000 / 9_300)
    off = [x / (MAX_SKEW * 1.05) for x in ref]
    with pytest.raises(WorkerError, match=r"worker w1: .* \(more than 1.15x off") as exc:
        calibrate([("w0", ref), ("w1", off)])
    assert exc.value.worker == "w1"


def test_pool_runs_a_round_at_once_and_keeps_a_state_on_its_worker() -> None:
    workers = [Worker("a"), Worker("b")]
    barrier = threading.Barrier(2, timeout=10)
    seen: list[tuple[State, str]] = []
    lock = threading.Lock()

    def measure(state: State, n: int, worker: Worker, cancel: threading.Event) -> Outcome:
        with lock:
            seen.append((state, worker.name))
        if n == 3:
            barrier.wait()  # both states of the round run at the same time, or this fails
        return Outcome(samples=(100.0,) * n)

    pool = WorkerPool(workers, measure, factors={"b": 2.0})
    s1, s2 = State.of(["x"]), State.of(["y"])
    outs = pool([(s1, 3), (s2, 3)])
    assert {o.worker for o in outs} == {"a", "b"}
    by_state = dict(zip((s1, s2), outs, strict=True))
    # Worker b's samples are scaled by its calibration factor.
    assert all(s == (200.0 if o.worker == "b" else 100.0) for o in outs for s in o.samples)
    again = pool([(s2, 2), (s1, 2)])
    assert [o.worker for o in again] == [by_state[s2].worker, by_state[s1].worker]


def test_pool_interrupt_cancels_the_round_and_calls_back() -> None:
    called: list[str] = []
    cancels: list[threading.Event] = []

    def measure(state: State, n: int, worker: Worker, cancel: threading.Event) -> Outcome:
        cancels.append(cancel)
        if worker.name == "a":
            raise KeyboardInterrupt  # as a trial's run does when its process is killed
        assert cancel.wait(10), "the other trial of the round was not cancelled"
        return Outcome(samples=(1.0,))

    pool = WorkerPool([Worker("a"), Worker("b")], measure, on_cancel=lambda: called.append("x"))
    with pytest.raises(KeyboardInterrupt):
        pool([(State.of(["x"]), 3), (State.of(["y"]), 3)])
    # The other trial was cancelled, running or before it started.
    assert called == ["x"] and cancels and all(c.is_set() for c in cancels)


def test_config_workers_are_validated_and_expanded(tmp_path: Path) -> None:
    path = tmp_path / "envbisect.yaml"
    data = {
        "targets": {"box2": {"via": ["ssh root@10.0.0.2"], "python": "/opt/py/bin/python3"}},
        "workers": [
            {"name": "gpu0", "env": {"CUDA_VISIBLE_DEVICES": 0}},
            {"name": "box2", "target": "box2"},
            {
                "name": "slurm",
                "slurm": {"partition": "gpu", "gres": "gpu:1", "count": 3, "time": "00:20:00"},
            },
        ],
    }
    config = Config.from_mapping(data, path)
    workers = config_workers(config.workers, config.targets)
    assert [w.name for w in workers] == ["gpu0", "box2", "slurm0", "slurm1", "slurm2"]
    assert workers[0].env == {"CUDA_VISIBLE_DEVICES": "0"} and workers[0].device == 0
    assert workers[1].transport is not None and workers[1].python == "/opt/py/bin/python3"
    assert workers[2].slurm is not None and workers[2].slurm.options() == [
        "--partition=gpu",
        "--gres=gpu:1",
        "--time=00:20:00",
    ]


@pytest.mark.parametrize(
    ("workers", "match"),
    [
        ("gpu0", "field 'workers' must be a non-empty list"),
        ([{"env": {}}], r"field 'workers\[0\].name'"),
        ([{"name": "a"}, {"name": "a"}], "'a' is used twice"),
        ([{"name": "a", "target": "nowhere"}], "no target named 'nowhere'"),
        ([{"name": "a", "slurm": {"count": 0}}], r"workers\[0\].slurm.count"),
        ([{"name": "a", "slurm": {"mode": "sbatch"}}], "'salloc' or 'srun'"),
        ([{"name": "a", "slurm": {"nodes": 2}}], r"unknown field 'workers\[0\].slurm.nodes'"),
        ([{"name": "a", "gpus": 1}], r"unknown field 'workers\[0\].gpus'"),
        ([{"name": "a", "cpus": ["x"]}], r"workers\[0\].cpus"),
    ],
)
def test_config_worker_mistakes_name_the_field(tmp_path: Path, workers: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Config.from_mapping({"workers": workers}, tmp_path / "envbisect.yaml")
