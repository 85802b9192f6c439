"""Contention: other processes' CPU time from /proc, the warning a run gives, GPU users
from nvidia-smi (the faithful fake in tests/fakes/bin), the smoke test's thread sizing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbisect.run import contention
from envbisect.run.contention import Busy, Contention

FAKES = Path(__file__).parents[1] / "fakes" / "bin"
pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs /proc")


@pytest.fixture
def busy_core() -> Iterator[subprocess.Popen[bytes]]:
    """One core kept busy by another process, as a user's box has them."""
    proc = subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_busy_core_is_measured_named_and_warned_about(
    busy_core: subprocess.Popen[bytes],
) -> None:
    # The loop is our child here; the warning is for other users' processes, so look at it
    # from a process that did not start it (as a run started after it would). The test
    # machine is shared: the loop gets what the scheduler gives it, so any share names it.
    code = (
        "from envbisect.run import contention as c; r = c.probe(1.0, min_cores=0.02); "
        "print(r.others_cores); print(c.busy_warning(r)); print([b.pid for b in r.top])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert float(out[0]) >= 0.5  # the loop alone is a core when nothing else runs
    assert str(busy_core.pid) in out[2]
    assert out[1].endswith(": CPU throughput will be noisy")
    assert " busy (pid " in out[1] and " of " in out[1]


def test_our_own_children_are_not_other_processes(busy_core: subprocess.Popen[bytes]) -> None:
    assert contention.is_ours(busy_core.pid)
    assert not contention.is_ours(1)
    reading = contention.probe(0.5)
    assert busy_core.pid not in [b.pid for b in reading.top]


def test_the_warning_words_and_when_a_reading_is_contended() -> None:
    one = Contention(cores=2, others_cores=1.0, load1=3.1, top=(Busy(4242, "sh", 1.0),))
    assert one.contended
    assert contention.busy_warning(one) == (
        "1 of 2 cores is 100% busy (pid 4242 sh): CPU throughput will be noisy"
    )
    two = Contention(cores=8, others_cores=1.6, load1=2.0)
    assert two.describe() == "2 of 8 cores are 80% busy"
    quiet = Contention(cores=2, others_cores=0.2, load1=0.3)
    assert not quiet.contended and contention.busy_warning(quiet) is None
    unknown = Contention(cores=2, others_cores=None, load1=None)  # no /proc: never flagged
    assert not unknown.contended
    assert Contention.from_dict(one.as_dict()).contended


def test_other_processes_on_the_gpu_from_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch, busy_core: subprocess.Popen[bytes]
) -> None:
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GPUS", "NVIDIA H200:143771")
    # One process of someone else's, one of ours (a trial's own GPU process is no contention).
    monkeypatch.setenv("FAKE_GPU_APPS", f"1:/usr/bin/python3,{busy_core.pid}:/usr/bin/sh")
    assert contention.gpu_others() == ("pid 1 python3",)
    reading = contention.Window.start().finish()
    assert reading.contended and reading.gpu_others == ("pid 1 python3",)
    warning = contention.busy_warning(reading)
    assert warning is not None and "other processes on the GPU (pid 1 python3)" in warning
    assert warning.endswith("GPU throughput will be noisy")


def test_no_nvidia_smi_means_no_gpu_contention(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert contention.gpu_others() == ()
