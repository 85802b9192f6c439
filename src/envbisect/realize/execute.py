"""Executors: a state's plan (``envbisect.realize.plan``) made real by the agent's operation code.

One interface, two ways to reach the code in ``envbisect.agent.actuate_remote``:

- :class:`RemoteExecutor`: each operation is one ``Transport.run_agent`` call through the
  layer chain (the agent shipped on stdin, nothing installed there);
- :class:`LocalExecutor`: the empty chain calls the same functions *in this process*.
  Running them as a ``python -`` child instead would be refused by our own locks: the host
  holds the ``flock`` of every file it may swap for the whole run (``journal.claim(...,
  hold=True)``, see ``claim_files``), and a child is another process, so the journal's
  "in use by envbisect process N" rule would turn it away. It would also cost a process
  per operation: measured here (median of 7, ``Transport().run_agent`` of an empty
  ``inspect``), 159 ms as a ``python -`` child against 2 µs in-process, where a whole
  revisited state costs about 2 ms. So locally the swaps go through the host's
  ``Session.journal`` (same journal rules, same files) and worktrees are recorded in the
  session log, where ``reset`` finds them; everything else (uv, link farm, worktrees, cache
  dirs, facts) is the agent's code unchanged.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from envbisect.agent import actuate_remote
from envbisect.model.failure import Failure
from envbisect.transport import ProcessResult

if TYPE_CHECKING:
    from envbisect.realize.actuate import Actuator
    from envbisect.realize.plan import Plan

# uv's own time limits (a cold uv cache may download a large wheel).
VENV_TIMEOUT_S = 300
INSTALL_TIMEOUT_S = 1800


class Executor(Protocol):
    """Runs the agent's operations for one actuator."""

    def inspect(self, params: dict[str, Any]) -> dict[str, Any]:
        """The ``inspect`` operation: facts about files, commits, dirs on the target."""
        ...

    def venv(self, params: dict[str, Any], trial_dir: Path) -> tuple[str | None, str | None]:
        """Build (or find) an overlay venv: its path, or the failure."""
        ...

    def apply(self, plan: Plan, trial_dir: Path) -> tuple[str | None, list[str]]:
        """Worktrees, file swaps, cache dirs of ``plan``: the failure (None) and notes."""
        ...

    def restore(self) -> list[str]:
        """Put back every swapped file; one line per file kept as the user changed it."""
        ...

    def cleanup(self) -> None:
        """Restore and remove what the run made on the target (venvs stay)."""
        ...


class LocalExecutor:
    """The agent's operations in this process (see the module docstring for why)."""

    def __init__(self, act: Actuator) -> None:
        self.act = act

    def inspect(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(actuate_remote.op_inspect(params))

    def venv(self, params: dict[str, Any], trial_dir: Path) -> tuple[str | None, str | None]:
        def run(argv: list[str], name: str) -> tuple[int, str, str]:
            limit = VENV_TIMEOUT_S if name == "build-venv" else INSTALL_TIMEOUT_S
            res = self.act.transport.run(argv, log_dir=trial_dir, name=name, timeout_s=limit)
            return res.returncode, _stderr(res), str(res.stderr_path)

        out = actuate_remote.op_venv({**params, "uv": [self.act.uv_path()], "where": ""}, run)
        return out.get("venv"), out.get("failure")

    def apply(self, plan: Plan, trial_dir: Path) -> tuple[str | None, list[str]]:
        ops = plan.ops()
        for item, swap in zip(ops["swaps"], plan.swaps, strict=True):
            item["blob"] = str(swap.blob) if swap.blob is not None else None
        session = self.act.session
        out = actuate_remote.apply(
            {**ops, "where": ""},
            put=lambda target, content: session.journal.swap(Path(target), content),
            record=lambda repo, path: session.record_worktree(Path(repo), Path(path)),
        )
        return out["failure"], list(out["notes"])

    def restore(self) -> list[str]:
        journal = self.act.session.journal
        seen = len(journal.kept)
        journal.restore()
        return [k.describe() for k in journal.kept[seen:]]

    def cleanup(self) -> None:
        return None  # the session's worktrees go with Session.remove_worktrees


class RemoteExecutor:
    """The agent's operations through the actuator's layer chain, one call each."""

    def __init__(self, act: Actuator) -> None:
        self.act = act

    def _log(self) -> Path:
        return self.act.session.root / "remote"

    def inspect(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.act.agent("inspect", params, self._log(), "inspect")

    def venv(self, params: dict[str, Any], trial_dir: Path) -> tuple[str | None, str | None]:
        uv = self.act.target().uv
        if uv is None:
            return None, Failure.build("uv is not available on the target")
        path = str(params["venv"])
        if path in self.act._remote_venvs:
            return path, None  # built (or found ready) there earlier in this run
        out = self.act.agent(
            "venv", {**params, "uv": list(uv)}, trial_dir, "build-venv", timeout_s=1800
        )
        if out.get("failure"):
            return None, f"{out['failure']} (full log: {trial_dir / 'build-venv.stderr'})"
        self.act._remote_venvs.add(path)
        return str(out["venv"]), None

    def apply(self, plan: Plan, trial_dir: Path) -> tuple[str | None, list[str]]:
        ops = plan.ops()
        for item, swap in zip(ops["swaps"], plan.swaps, strict=True):
            # Sent even when the blob is unknown: the agent first puts back any swap a killed
            # run left there and compares again; it fails only if the file is not as wanted.
            if swap.blob is not None:
                item["content"] = base64.b64encode(swap.blob.read_bytes()).decode("ascii")
        self.act._remote_dirty = self.act._remote_dirty or bool(plan.swaps)
        root = self.act.remote_root()
        out = self.act.agent(
            "realize", {"root": root, "pid": os.getpid(), **ops}, trial_dir, "realize"
        )
        return out.get("failure"), list(out.get("notes") or ())

    def restore(self) -> list[str]:
        if not self.act._remote_dirty:
            return []
        out = self.act.agent("restore", {"root": self.act.remote_root()}, self._log(), "restore")
        self.act._remote_dirty = False
        where = self.act.transport.describe()
        return [f"{line} (via {where})" for line in out.get("kept") or ()]

    def cleanup(self) -> None:
        if self.act._target is None:
            return  # nothing was ever done there
        self.act.agent("cleanup", {"root": self.act.remote_root()}, self._log(), "cleanup")
        self.act._remote_dirty = False


def _stderr(res: ProcessResult) -> str:
    try:
        return res.stderr_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
