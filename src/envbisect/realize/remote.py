"""What a run leaves on a remote target: its session dir there, and ``envbisect reset``.

Remote targets (``--via``/``--target``): Everything lives under a remote session directory
``<remote $HOME, else /tmp>/.envbisect/session-<id>`` (recorded in the local session log as a
``remote`` event, so ``envbisect reset`` cleans it up too, see :func:`reset_remote`): the
overlay venv is built there with the target's uv (on its PATH, next to its python, or
``python -m uv``; without uv, package units are not bisectable and the reason says so), git
worktrees are added in the remote repo, loose files are swapped after journaling on the
target (blobs travel base64 in the parameters) and restored after every trial and on exit,
cold caches are fresh remote dirs, and ``data_map`` paths are checked on the target. The
per-trial environment reaches the far process through an innermost ``env`` layer (see
``run.launch.run_once``).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from pathlib import Path

from envbisect.model.events import RemoteEvent
from envbisect.model.gitcli import Exec
from envbisect.model.session import Session
from envbisect.transport import Layer, Transport

AGENT = "envbisect.agent.actuate_remote"
FAR_PATH = "/usr/local/bin:/usr/bin:/bin"  # a remote target whose PATH the probe did not see


def session_dir(session: Session, transport: Transport, python: str, home: str | None) -> str:
    """The remote session dir of ``session`` on the target ``transport`` reaches (its home
    ``home``), recorded in the local session log on first use."""
    tag = hashlib.sha256(f"{session.root}\0{transport.describe()}".encode()).hexdigest()[:12]
    root = f"{(home or '/tmp').rstrip('/')}/.envbisect/session-{tag}"
    if not any(e.get("type") == "remote" and e.get("root") == root for e in session.events()):
        layers = [layer.as_dict() for layer in transport.layers]
        session.append(RemoteEvent(root, python, layers))
    return root


def reset_remote(session: Session) -> list[str]:
    """``envbisect reset`` for the remote parts of ``session``: restore the target's journal,
    remove its worktrees, venvs and cache dirs. Returns one line per thing done."""
    lines: list[str] = []
    seen: set[str] = set()
    for ev in session.events():
        if ev.get("type") != "remote" or ev.get("root") in seen:
            continue
        root = str(ev["root"])
        seen.add(root)
        transport = Transport(tuple(Layer(tuple(d["argv"]), d["kind"]) for d in ev["layers"]))
        out = transport.run_agent(
            str(ev["python"]),
            AGENT,
            {"op": "cleanup", "root": root, "all": True},
            timeout_s=300,
            log_dir=session.root / "remote",
            name="reset",
        )
        where = transport.describe()
        lines += [f"restored {p} (via {where})" for p in out.get("restored") or ()]
        lines += [f"{line} (via {where})" for line in out.get("kept") or ()]
        lines += [f"removed worktree {p} (via {where})" for p in out.get("worktrees") or ()]
        lines += [f"removed {p} (via {where})" for p in out.get("removed") or ()]
    return lines


def git_exec(transport: Transport, log_dir: Path) -> Exec:
    """A read-only git command run on the target (the user's repo is there, not here): the
    same argv through the layer chain, its output logged under ``log_dir``."""
    numbers = itertools.count(1)

    def run(argv: Sequence[str], timeout_s: float) -> tuple[int, bytes, bytes]:
        res = transport.run(argv, timeout_s=timeout_s, log_dir=log_dir, name=f"git-{next(numbers)}")
        code = 124 if res.timed_out else res.returncode
        return code, res.stdout(), res.stderr_path.read_bytes()

    return run
