"""A local run's peak memory, read from /proc while it runs (``transport.hang.PeakWatch``):
what ``--rate-runs-at-once auto`` sizes its runs by (issue 51)."""

from __future__ import annotations

import sys
from pathlib import Path

from envbisect.transport import Transport

# Holds 200 MB for a second in a child of its own: the group's memory, not only the first
# process's, counts.
HOLD = r"""
import subprocess, sys
child = ("import time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
         "time.sleep(1.2)")
subprocess.run([sys.executable, "-c", child], check=True)
"""


def test_a_local_run_says_the_most_memory_its_processes_held(tmp_path: Path) -> None:
    res = Transport().run([sys.executable, "-c", HOLD], log_dir=tmp_path, timeout_s=60)
    assert res.returncode == 0, res.stderr_tail()
    assert res.peak_rss_bytes is not None
    assert 200 * 2**20 <= res.peak_rss_bytes < 1024 * 2**20
