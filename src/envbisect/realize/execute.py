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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from envbisect.agent import actuate_remote
from envbisect.agent.cache_keep import read_tree
from envbisect.model.failure import Failure
from envbisect.transport import ProcessResult, Transport

if TYPE_CHECKING:
    from envbisect.model.plan import Plan
    from envbisect.model.session import Session

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


class AgentCall(Protocol):
    """One operation of the agent through the chain (``Actuator.agent``)."""

    def __call__(
        self,
        op: str,
        params: Mapping[str, Any],
        log_dir: Path,
        name: str,
        timeout_s: float = 300,
    ) -> dict[str, Any]: ...


@dataclass
class RemoteState:
    """What the remote executors of one actuator keep between operations (the actuator
    holds it; a new executor is made for each operation)."""

    dirty: bool = False  # files may be swapped there right now
    venvs: set[str] = field(default_factory=set)  # venvs built (or found ready) there


class LocalExecutor:
    """The agent's operations in this process (see the module docstring for why)."""

    def __init__(self, transport: Transport, session: Session, uv: Callable[[], str]) -> None:
        self.transport = transport  # runs uv
        self.session = session  # its journal swaps files, its log records worktrees
        self.uv = uv  # the uv that builds venvs (found on first use)

    def inspect(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(actuate_remote.op_inspect(params))

    def venv(self, params: dict[str, Any], trial_dir: Path) -> tuple[str | None, str | None]:
        def run(argv: list[str], name: str) -> tuple[int, str, str]:
            limit = VENV_TIMEOUT_S if name == "build-venv" else INSTALL_TIMEOUT_S
            res = self.transport.run(argv, log_dir=trial_dir, name=name, timeout_s=limit)
            return res.returncode, _stderr(res), str(res.stderr_path)

        out = actuate_remote.op_venv({**params, "uv": [self.uv()], "where": ""}, run)
        return out.get("venv"), out.get("failure")

    def apply(self, plan: Plan, trial_dir: Path) -> tuple[str | None, list[str]]:
        ops = plan.ops()
        for item, swap in zip(ops["swaps"], plan.swaps, strict=True):
            item["blob"] = str(swap.blob) if swap.blob is not None else None
        session = self.session
        out = actuate_remote.apply(
            {**ops, "where": ""},
            put=lambda target, content: session.journal.swap(Path(target), content),
            record=lambda repo, path: session.record_worktree(Path(repo), Path(path)),
        )
        return out["failure"], list(out["notes"])

    def restore(self) -> list[str]:
        journal = self.session.journal
        seen = len(journal.kept)
        journal.restore()
        return [k.describe() for k in journal.kept[seen:]]

    def cleanup(self) -> None:
        return None  # the session's worktrees go with Session.remove_worktrees


class RemoteExecutor:
    """The agent's operations through the actuator's layer chain, one call each."""

    def __init__(
        self,
        agent: AgentCall,
        state: RemoteState,
        *,
        log_dir: Path,
        where: str,
        root: Callable[[], str],
        uv: Callable[[], tuple[str, ...] | None],
        probed: bool,
    ) -> None:
        self.agent = agent
        self.state = state
        self.log_dir = log_dir  # where the run-wide operations log (``<session>/remote``)
        self.where = where  # the chain, as messages name it
        self.root = root  # the remote session dir (recorded on first use)
        self.uv = uv  # how to run uv there (the target's probe; None: no uv)
        self.probed = probed  # the target was reached: there may be something to clean up

    def inspect(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.agent("inspect", params, self.log_dir, "inspect")

    def venv(self, params: dict[str, Any], trial_dir: Path) -> tuple[str | None, str | None]:
        uv = self.uv()
        if uv is None:
            return None, Failure.build("uv is not available on the target")
        path = str(params["venv"])
        if path in self.state.venvs:
            return path, None  # built (or found ready) there earlier in this run
        out = self.agent(
            "venv", {**params, "uv": list(uv)}, trial_dir, "build-venv", timeout_s=1800
        )
        if out.get("failure"):
            return None, f"{out['failure']} (full log: {trial_dir / 'build-venv.stderr'})"
        self.state.venvs.add(path)
        return str(out["venv"]), None

    def apply(self, plan: Plan, trial_dir: Path) -> tuple[str | None, list[str]]:
        ops = plan.ops()
        for item, swap in zip(ops["swaps"], plan.swaps, strict=True):
            # Sent even when the blob is unknown: the agent first puts back any swap a killed
            # run left there and compares again; it fails only if the file is not as wanted.
            if swap.blob is not None:
                item["content"] = base64.b64encode(swap.blob.read_bytes()).decode("ascii")
        for item in ops["caches"]:
            if item.get("tree"):
                _send_kept(item)
        self.state.dirty = self.state.dirty or bool(plan.swaps)
        root = self.root()
        out = self.agent("realize", {"root": root, "pid": os.getpid(), **ops}, trial_dir, "realize")
        return out.get("failure"), list(out.get("notes") or ())

    def restore(self) -> list[str]:
        if not self.state.dirty:
            return []
        out = self.agent("restore", {"root": self.root()}, self.log_dir, "restore")
        self.state.dirty = False
        return [f"{line} (via {self.where})" for line in out.get("kept") or ()]

    def cleanup(self) -> None:
        if not self.probed:
            return  # nothing was ever done there
        self.agent("cleanup", {"root": self.root()}, self.log_dir, "cleanup")
        self.state.dirty = False


def _send_kept(item: dict[str, Any]) -> None:
    """A kept cache's tree and the blobs it lists, sent along to a remote target (the paths
    are this machine's); a blob missing here is left out (the target says how many)."""
    tree = Path(item.pop("tree"))
    body = tree.read_bytes()
    item["tree_body"] = base64.b64encode(body).decode("ascii")
    contents = {}
    for _rel, sha, _mode in read_tree(body):
        blob = tree.parent / sha
        if sha not in contents and blob.is_file():
            contents[sha] = base64.b64encode(blob.read_bytes()).decode("ascii")
    item["contents"] = contents


def _stderr(res: ProcessResult) -> str:
    try:
        return res.stderr_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
