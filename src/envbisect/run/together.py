"""Processes of one state at once, for crash counts alone (``--rate-runs-at-once``).

A crash rate needs no clean timing, only whether each process crashed; on the H100 the
field's grown data took 180 s of a 410 s run for its four rate runs one after the other.
Each process gets its own copy of the state's compile caches (``own_caches``): a cold cache
stays cold for every one of them, as a run after another would find it, and none warms
another's. Their figures are not kept (processes sharing the machine).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from envbisect.model.metric import Measurement
from envbisect.run.launch import RunLog, RunSpec, SmokeCommand, run_once
from envbisect.sections.caches import CACHE_ENV


def own_caches(env: Mapping[str, str] | None, root: Path) -> dict[str, str] | None:
    """``env`` with each compile cache dir it names copied under ``root`` (one process's);
    None (the caller's environment, no state's caches) stays None."""
    if env is None:
        return None
    out = dict(env)
    for var in CACHE_ENV.values():
        if out.get(var):
            out[var] = str(_copy(Path(out[var]), root / var))
    return out


def run_at_once(
    smoke: SmokeCommand, specs: Sequence[RunSpec]
) -> tuple[list[RunLog], list[Measurement]]:
    """Every spec's process started at once; their logs (in spec order) and measurements."""
    logs: list[list[RunLog]] = [[] for _ in specs]
    found: list[Measurement | None] = [None] * len(specs)

    def one(i: int) -> None:
        found[i] = run_once(smoke, specs[i], record=logs[i].append)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [log for batch in logs for log in batch], [m for m in found if m is not None]


def empty_dir(path: Path) -> None:
    """A cold cache made cold again (what an earlier run compiled into it removed)."""
    if path.is_dir():
        shutil.rmtree(path)
        path.mkdir()


def _copy(source: Path, dest: Path) -> Path:
    """``dest``, holding what ``source`` holds (empty when it is missing)."""
    if source.is_dir():
        shutil.copytree(source, dest, symlinks=True)
    else:
        dest.mkdir(parents=True)
    return dest
