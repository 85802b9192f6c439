"""What a run leaves behind is ended; what another run started meanwhile is not.

Real processes under /proc; the one seam is the reaper's list of pids, wrapped so that a
second run starts at the moment a first run's cleanup looks (the race that CI met: two
workers, one ending its run as the other starts one).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from envbisect.transport import Transport, reaper

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")


def _running(marker: str) -> bool:
    """Whether a process whose command line holds ``marker`` exists (after its exec)."""
    for pid in Path("/proc").iterdir():
        if not pid.name.isdigit():
            continue
        try:
            if marker.encode() in (pid / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def test_a_run_started_while_another_run_is_cleaned_up_is_left_running(
    tmp_path: Path, monkeypatch: Any
) -> None:
    marker = f"eb-second-run-{tmp_path.name}"
    second: dict[str, Any] = {}

    def start_second() -> None:
        second["result"] = Transport().run(
            [sys.executable, "-c", "import time, sys; time.sleep(0.5)", marker],
            timeout_s=60,
            log_dir=tmp_path / "second",
        )

    real = reaper._pids  # noqa: SLF001 - the seam this test exists for

    def pids_as_a_second_run_starts() -> list[int]:
        if "thread" not in second:
            second["thread"] = threading.Thread(target=start_second)
            second["thread"].start()
            # The second run's process may start now (it may not, while the first run's
            # cleanup looks for orphans: then this waits out the second and goes on).
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and not _running(marker):
                time.sleep(0.01)
        return real()

    monkeypatch.setattr(reaper, "_pids", pids_as_a_second_run_starts)
    first = Transport().run(["true"], timeout_s=60, log_dir=tmp_path / "first")
    second["thread"].join(timeout=30)
    assert first.returncode == 0 and first.killed == ()
    assert second["result"].returncode == 0, second["result"].stderr_tail(5)
    assert second["result"].killed == ()


def test_a_tagged_leftover_of_the_run_is_ended_and_named(tmp_path: Path) -> None:
    # A child that leaves the run's process group (setsid) keeps the run's tag: found by it.
    script = f"setsid sleep 303 & echo $! > {tmp_path}/sid.pid"
    result = Transport().run(["sh", "-c", script], timeout_s=60, log_dir=tmp_path)
    pid = int((tmp_path / "sid.pid").read_text())
    assert any(line.startswith(f"{pid} ") and "sleep 303" in line for line in result.killed)
    assert not Path(f"/proc/{pid}/cmdline").exists() or not _running("sleep 303")
