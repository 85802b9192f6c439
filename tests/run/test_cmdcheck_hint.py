"""The one-line error of a command that cannot start says what to type, through --via too."""

from __future__ import annotations

from pathlib import Path

from envbisect.model.failure import Failure
from envbisect.run.cmdcheck import RunFacts, message

WT = "/root/.envbisect/session-1/worktrees/mlp-e8fd940b-67c48d6a8188"
MISSING = f"python: can't open file '{WT}/mlp/train.py': [Errno 2] No such file or directory"


def facts(origin: str | None, cwd: str, stderr: str) -> RunFacts:
    return RunFacts(
        argv=("python", "mlp/train.py"),
        cwd=Path(cwd),
        interpreter="/ws/venv/bin/python",
        started=True,
        exit_status=2,
        stdout="",
        stderr=stderr,
        failure=Failure.crash("exit 2"),
        origin=origin,
    )


def test_a_path_typed_from_the_repos_parent_through_via_gets_the_hint() -> None:
    text = message("good", facts(None, WT, MISSING))
    assert "hint: through --via/--target the command runs in the repo's worktree" in text
    assert "relative to the repo (python train.py) or absolute" in text


def test_no_hint_locally_or_for_other_errors() -> None:
    assert "hint:" not in message("good", facts("/ws", WT, MISSING))
    assert "hint:" not in message("good", facts(None, WT, "ModuleNotFoundError: No module x"))
    assert "hint:" not in message("good", facts(None, "/home/u", MISSING))
