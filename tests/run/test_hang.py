"""A run that hangs without using the CPU is ended as hung (``--hang-after``), not left to its
``--timeout`` (issue 31: the user's own threaded script deadlocked compiling in threads on the
H100 and sat until its 170 s timeout in every trial). Real processes: a deadlock of two
threads over two locks, a busy loop that prints nothing, ``sleep``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from envbisect.cli import cli
from envbisect.transport import Transport
from envbisect.transport.hang import HangSpec
from tests.helpers_run import env_scenario

# EB_DEADLOCK: two threads take two locks in opposite order and wait for each other for
# good (no CPU used); otherwise a figure. EB_BUSY: seconds of pure CPU work first, printing
# nothing (a long compile looks like this from outside).
PROGRAM = """\
import os, threading, time

a, b = threading.Lock(), threading.Lock()
ready = threading.Barrier(2)


def one(first, second):
    with first:
        ready.wait()
        with second:
            pass


if os.environ.get("EB_DEADLOCK"):
    threads = [threading.Thread(target=one, args=p) for p in ((a, b), (b, a))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
end = time.perf_counter() + float(os.environ.get("EB_BUSY", "0"))
acc = 0
while time.perf_counter() < end:
    acc = (acc + 7) % 1000003
print("throughput: 9000 tok/s", flush=True)
"""


def _run(tmp_path: Path, bad_env: dict[str, str], *extra: str) -> tuple[str, dict, float]:
    sc, script = env_scenario(tmp_path, PROGRAM, bad_env)
    argv = [
        "run", "--config", str(sc.config), "--python", sc.python, "--bad", str(sc.bad),
        "--session", str(tmp_path / "session"), "--json", str(tmp_path / "r.json"),
        "--metric-regex", r"throughput: ([0-9.]+) tok/s", *extra,
        "--", "python", str(script),
    ]  # fmt: skip
    start = time.monotonic()
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    wall = time.monotonic() - start
    doc = json.loads((tmp_path / "r.json").read_text()) if (tmp_path / "r.json").exists() else {}
    return res.output, doc, wall


def test_a_deadlocked_run_is_ended_as_hung_with_its_stacks(tmp_path: Path) -> None:
    out, doc, wall = _run(
        tmp_path, {"A1": "y", "EB_DEADLOCK": "1"}, "--timeout", "300", "--hang-after", "4"
    )
    assert [c["unit"] for c in doc.get("culprits", [])] == ["env:EB_DEADLOCK"], out
    crash = doc["culprits"][0]["crash"]
    assert "timeout (hung: no CPU time used in its last" in crash, crash
    assert "every thread's stack, written when it was ended, ends its stderr log" in out
    hung = [t for t in doc["trials"] if t["failure"] and "hung" in t["failure"]]
    assert hung
    trials = tmp_path / "session" / "trials"
    stderr = "".join(
        p.read_text() for t in hung for p in (trials / f"{t['index']:03d}").glob("run-*.stderr")
    )
    assert "(most recent call first)" in stderr and "in one" in stderr  # where it waits
    # Every hanging process ended after seconds, not at the 300 s timeout.
    assert wall < 240, wall


def test_a_busy_run_that_prints_nothing_is_not_hung(tmp_path: Path) -> None:
    out, doc, _ = _run(tmp_path, {"A1": "y", "EB_BUSY": "5"}, "--hang-after", "2")
    assert "hung" not in out
    assert doc["trials"][1]["samples"], out  # the full set ran its 5 s and gave its figure


def test_the_transport_ends_a_silent_process_and_says_for_how_long(tmp_path: Path) -> None:
    start = time.monotonic()
    res = Transport().run(["sleep", "60"], timeout_s=50, log_dir=tmp_path, hang=HangSpec(2.0))
    assert res.timed_out and res.hung_s is not None and res.hung_s >= 2.0
    assert time.monotonic() - start < 20
    busy = "import time\nt = time.perf_counter() + 4\nwhile time.perf_counter() < t: pass\n"
    res = Transport().run(
        [sys.executable, "-c", busy], timeout_s=50, log_dir=tmp_path, hang=HangSpec(2.0),
        name="busy",
    )  # fmt: skip
    assert not res.timed_out and res.hung_s is None and res.returncode == 0
