"""A program killed at its timeout leaves where it hung: the probe writes every thread's
stack to its stderr shortly before (seen on the H100: a user's threaded script hung under
the probe, and its logs held nothing but a warning)."""

from __future__ import annotations

import sys
from pathlib import Path

from click.testing import CliRunner

from envbisect.commands import probe
from envbisect.run.probed import STACKS_NOTE, Delivery, stacks_at

HANG = """
import threading

gate = threading.Event()


def waiting_for_the_other_thread():
    gate.wait()


t = threading.Thread(target=waiting_for_the_other_thread)
t.start()
t.join()
"""


def test_a_hung_program_leaves_every_threads_stack_in_its_stderr(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    logs = tmp_path / "logs"
    done = CliRunner().invoke(
        probe.command,
        ["--timeout", "20", "--log-dir", str(logs), "--", sys.executable, str(script)],
        standalone_mode=False,
        catch_exceptions=False,
    )
    assert done.return_value == 1
    assert "timed out after 20 s" in done.output and STACKS_NOTE in done.output
    stderr = (logs / "probe.stderr").read_text()
    assert "(most recent call first)" in stderr
    assert "in waiting_for_the_other_thread" in stderr


def test_the_stacks_come_just_before_the_timeout_and_not_for_short_runs() -> None:
    assert stacks_at(600) == 590 and stacks_at(100) == 95 and stacks_at(10) is None
    assert (
        '"stacks_after": 95'
        in Delivery(file=Path("/x"), stacks_after=95.0).env()["ENVBISECT_PROBE"]
    )
    assert "stacks_after" not in Delivery(file=Path("/x")).env()["ENVBISECT_PROBE"]
