"""``trials/NNN/trial.json``: how a trial ran, one entry per call (interpreter, venv, cwd,
layers, environment difference, state check, runs), so an odd number can be traced."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbisect.agent.redact import redact_env as redact_value
from envbisect.agent.redact import redact_tree
from envbisect.model.failure import Failure
from envbisect.model.paths import atomic_write_text
from envbisect.model.steps import trial_timing
from envbisect.realize.actuate import Realized
from envbisect.realize.faithful import StateCheck
from envbisect.run.launch import RunLog
from envbisect.transport import Transport

TRIAL_LOG = "trial.json"


def env_diff(env: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, Any]:
    """How ``env`` differs from ``base`` (default: this process's environment, i.e. the
    user's): variables set or changed, and unset; values redacted as in manifests."""
    base = os.environ if base is None else base
    return {
        "set": {k: redact_value(k, v) for k, v in sorted(env.items()) if base.get(k) != v},
        "unset": sorted(k for k in base if k not in env),
    }


@dataclass(frozen=True)
class TrialCall:
    """One call of a trial's test function (more samples of a state add a call): how it
    ran, for ``trial.json``."""

    realized: Realized
    transport: Transport
    check: StateCheck | None
    runs: tuple[RunLog, ...]
    wall_s: float
    failure: Failure | None
    fill_s: float = 0.0  # a warm cache made by a run first
    compile_cache: Mapping[str, Any] | None = None  # the shared cache it ran with

    def as_dict(self) -> dict[str, Any]:
        realized, python = self.realized, self.realized.python
        return {
            "interpreter": python,
            "interpreter_resolved": os.path.realpath(python) if not self.transport.layers else None,
            "venv": str(realized.venv) if realized.venv else None,
            "cwd": str(realized.cwd) if realized.cwd else None,
            "via": [layer.describe() for layer in self.transport.layers],
            "env_diff": env_diff(realized.env),
            "state_check": self.check.as_dict() if self.check is not None else None,
            "build_failure": realized.failure,
            "runs": [run.as_dict() for run in self.runs],
            "wall_s": round(self.wall_s, 3),
            "fill_s": round(self.fill_s, 3),
            "compile_cache": dict(self.compile_cache) if self.compile_cache else None,
            "failure": self.failure,
        }


def read_timing(trial_dir: Path | str | None) -> dict[str, Any] | None:
    """Where a trial's time went (``envbisect.model.steps.trial_timing``), from its
    ``trial.json``; None when it has none."""
    import json

    if trial_dir is None:
        return None
    try:
        doc = json.loads((Path(trial_dir) / TRIAL_LOG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    calls = doc.get("calls") if isinstance(doc, dict) else None
    return trial_timing(calls) if isinstance(calls, list) and calls else None


def write_trial_log(
    trial_dir: Path, index: int, applied: list[str], positions: Mapping[str, int], call: TrialCall
) -> None:
    """``trials/NNN/trial.json``: how the trial ran, one entry per call, so an odd number
    can be traced to its argv, cwd, interpreter and environment."""
    import json

    path = trial_dir / TRIAL_LOG
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {"trial": index, "applied": applied, "positions": dict(positions), "calls": []}
    doc["calls"].append(call.as_dict())
    # Secret-shaped text anywhere (an argv --token, a failure line) is masked too.
    atomic_write_text(path, json.dumps(redact_tree(doc), indent=2, default=str) + "\n")
