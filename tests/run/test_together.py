"""How many crash-counting runs go at once (``run.together.RunsAtOnce``, issue 51) and a run
that crashes 1 run in 3 through the CLI with ``--rate-runs-at-once auto`` (the default) and 1:
the same culprit, the runs of auto overlapping, each phase line saying its cost."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.cli import cli
from envbisect.model.errors import UsageError
from envbisect.run.launch import Launch, RunLog
from envbisect.run.together import CUDA_CONTEXT_BYTES, HEADROOM, RunsAtOnce
from tests.helpers_run import manifest


def _log(rss: int | None, facts: dict[str, object] | None = None, wall: float = 2.0) -> RunLog:
    from envbisect.model.metric import Measurement

    launch = Launch(("python",), started=True, exit_status=0, facts=facts, peak_rss_bytes=rss)
    return RunLog("run-1", None, launch, wall, Measurement(1.0, None, "stdout"))


def test_a_fixed_width_is_the_users_number() -> None:
    said: list[str] = []
    at_once = RunsAtOnce(3, said.append)
    assert at_once.enabled and at_once.width() == 3 and said == []
    assert not RunsAtOnce(1, said.append).enabled


def test_auto_is_bounded_by_cores_and_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.setattr("envbisect.run.together._mem_available", lambda: 10 * 2**30)
    said: list[str] = []
    at_once = RunsAtOnce(None, said.append)
    at_once.saw(_log(4 * 2**30))  # 4 GiB a run: two fit in 10 GiB with the headroom
    assert at_once.width() == 2
    assert said == [
        "crash-counting runs: 2 at once (--rate-runs-at-once auto: 8 cores, "
        "10.0 GiB free / 5.0 GiB a run)"
    ]
    at_once.width()
    assert len(said) == 1  # said once per new choice


def test_auto_is_bounded_by_the_gpu_memory_a_run_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    monkeypatch.setattr("envbisect.run.together._mem_available", lambda: 100 * 2**30)
    total = 80 * 2**30
    memory = {"peak_reserved_bytes": 30 * 2**30, "total_bytes": total}
    at_once = RunsAtOnce(None, lambda _line: None)
    at_once.saw(_log(2**30, {"memory": memory}))
    assert at_once.width() == int(total // ((30 * 2**30 + CUDA_CONTEXT_BYTES) * HEADROOM)) == 2
    memory["peak_reserved_bytes"] = 70 * 2**30  # one run fills the card: one at a time
    at_once.saw(_log(2**30, {"memory": memory}))
    assert at_once.width() == 1


def test_auto_goes_one_at_a_time_where_copies_cannot_be_made() -> None:
    at_once = RunsAtOnce(None, lambda _line: None, "a target behind --via keeps its caches")
    assert not at_once.enabled and at_once.width() == 1


def test_expected_time_comes_from_the_runs_so_far() -> None:
    at_once = RunsAtOnce(None, lambda _line: None)
    assert at_once.expected_s(4, 2) is None  # nothing run yet
    at_once.saw(_log(2**20, wall=3.0))
    assert at_once.expected_s(4, 1) == 12.0
    assert at_once.expected_s(5, 2) == 9.0  # no batch yet: a batch as long as a run alone
    at_once.wave_s.append(5.0)
    assert at_once.expected_s(5, 2) == 15.0  # three batches of 5 s


def test_rate_runs_at_once_refuses_a_word_it_does_not_know(tmp_path: Path) -> None:
    good = manifest(tmp_path / "good.yaml", env={})
    bad = manifest(tmp_path / "bad.yaml", env={"A": "1"})
    argv = ["run", "--good", str(good), "--bad", str(bad), "--rate-runs-at-once", "many"]
    res = CliRunner().invoke(
        cli, [*argv, "--", sys.executable, "-c", "pass"], standalone_mode=False
    )
    assert isinstance(res.exception, UsageError)
    assert "--rate-runs-at-once 'many': expected auto or a whole number >= 1" in str(res.exception)


# Every third run of the bad build crashes (a counter shared by every process, whichever
# order they run in); each run logs when it started and ended.
FLAKY = r"""
import fcntl, os, time
start = time.time()
if os.environ.get("EB_FLAKY"):
    with open(os.environ["EB_COUNTER"], "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        n = len(fh.read()) + 1
        fh.write("x")
    if n % 3 == 0:
        raise RuntimeError("intermittent: every third run of this build crashes")
acc = 0
for t in range(400_000):
    acc = (acc + t * t) % 1000003
with open(os.environ["EB_RUNS_LOG"], "a") as fh:
    fh.write(f"{start} {time.time()}\n")
print("throughput: 5000 tok/s", flush=True)
"""


def _flaky_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, *extra: str
) -> tuple[dict, str]:
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    monkeypatch.setenv("EB_COUNTER", str(tmp_path / f"counter-{name}"))
    monkeypatch.setenv("EB_RUNS_LOG", str(tmp_path / f"runs-{name}.log"))
    good = manifest(tmp_path / "good.yaml", env={"A1": "x"})
    bad = manifest(tmp_path / "bad.yaml", env={"A1": "y", "EB_FLAKY": "1"})
    out = tmp_path / f"{name}.json"
    argv = [
        "run", "--python", sys.executable, "--good", str(good), "--bad", str(bad),
        "--crash-runs", "6", "--session", str(tmp_path / f"session-{name}"), "--json", str(out),
        "--metric-regex", r"throughput: ([0-9.]+) tok/s", *extra, "--", "python", str(script),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0, res.output
    return json.loads(out.read_text()), res.stderr


def _overlapping(log: Path) -> int:
    """How many runs started before the one before them ended."""
    runs = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    return sum(1 for (_, end), (start, _) in zip(runs, runs[1:], strict=False) if start < end)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="auto needs two cores to pick 2")
def test_a_crash_one_run_in_three_counts_its_runs_at_once_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auto, said = _flaky_run(tmp_path, monkeypatch, "auto")
    one, said_one = _flaky_run(tmp_path, monkeypatch, "one", "--rate-runs-at-once", "1")
    for doc in (auto, one):  # the same verdict either way
        (culprit,) = doc["culprits"]
        assert culprit["unit"] == "env:EB_FLAKY"
    assert "crash-counting runs: 2 at once (--rate-runs-at-once auto: 2 cores" in said
    assert "crash-counting runs" not in said_one
    # Each line of the phase says the runs it may still take, their time and its rule.
    assert "2 more runs at once to estimate its crash rate" in said
    assert "at most 21 more runs, 2 at a time: the rate is known at 3 crashes" in said
    assert "at the pace so far" in said
    assert "one more run to estimate its crash rate; at most" in said_one
    assert _overlapping(tmp_path / "runs-auto.log") >= 5
    assert _overlapping(tmp_path / "runs-one.log") == 0
