"""Every git command the host runs, each with a time limit.

The git CLI, not GitPython: the target side (``agent/actuate_remote.py``, stdlib only) must
run the CLI anyway, and measured here (median of 7) ``import git`` costs 96 ms in a fresh
process against 4 ms for one ``git rev-list`` subprocess; GitPython itself shells out to git
for rev-list and worktrees. A git that hangs (a lock, a credential prompt, a dead network
filesystem) must not hang a bisection, hence the limit on every call.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 60.0  # one local git command; a worktree add of a large repo stays well below

# Where a read-only git command runs when the repo is not on this machine: the whole argv
# (``git -C REPO ...``) and a time limit → (exit status, stdout, stderr); 124: timed out.
# ``envbisect.realize.remote.git_exec`` runs it through a target's layer chain. None: here.
Exec = Callable[[Sequence[str], float], tuple[int, bytes, bytes]]


@dataclass(frozen=True)
class GitResult:
    """What one git command gave: exit status (124: timed out, 127: no git) and output."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run(
    *args: str,
    repo: str | Path | None = None,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = TIMEOUT_S,
    via: Exec | None = None,
) -> GitResult:
    """``git [-C repo] args...`` (``via``: on the target); never raises for git's own
    failures or a timeout."""
    from envbisect.agent.actuate_common import NO_SIDE_EFFECTS

    argv = ["git"] + (["-C", str(repo)] if repo is not None else []) + [*NO_SIDE_EFFECTS, *args]
    if via is not None:
        code, out, err = via(argv, timeout_s)
        return GitResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return GitResult(124, "", f"git {' '.join(args[:2])} timed out after {timeout_s:g}s")
    except OSError as exc:
        return GitResult(127, "", f"cannot run git: {exc.strerror}")
    return GitResult(proc.returncode, proc.stdout, proc.stderr)


def log_subjects(repo: str, old: str, new: str, via: Exec | None = None) -> GitResult:
    """``old..new`` oldest first, one ``<sha> <subject>`` line per commit."""
    return run("log", "--reverse", "--format=%H %s", f"{old}..{new}", repo=repo, via=via)


def remove_worktree(repo: str | Path, path: str | Path) -> None:
    """``git worktree remove --force``; what git leaves behind is not git's to keep."""
    run("worktree", "remove", "--force", str(path), repo=repo)


def prune_worktrees(repo: str | Path) -> None:
    """``git worktree prune``: forget worktrees whose directory is gone."""
    run("worktree", "prune", repo=repo)


def commit_env(when: str, identity: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with a fixed author/committer and date (reproducible
    commits, as the demo's repo needs)."""
    return {**os.environ, **identity, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}


def file_commits(
    repo: str | Path, old: str, new: str, path: str, via: Exec | None = None
) -> GitResult:
    """The commits of ``old..new`` that touched ``path`` (relative to the repo), oldest
    first, one ``<sha>`` per line (renames not followed: a file is known by its path)."""
    return run("rev-list", "--reverse", f"{old}..{new}", "--", path, repo=repo, via=via)


def changed_files(repo: str | Path, old: str, new: str, via: Exec | None = None) -> list[str]:
    """Paths (relative to the repo) of the files modified between two commits (added,
    deleted and renamed ones left out); empty when git fails."""
    res = run(
        "diff", "--name-only", "--no-renames", "--diff-filter=M", old, new, repo=repo, via=via
    )
    return res.stdout.splitlines() if res.ok else []


def commit_facts(repo: str | Path, commit: str, via: Exec | None = None) -> GitResult:
    """``<sha>\\n<author date, ISO 8601>\\n<subject>`` of one commit."""
    return run("show", "-s", "--format=%H%n%aI%n%s", commit, repo=repo, via=via)


def show_file(
    repo: str | Path,
    commit: str,
    path: str,
    timeout_s: float = TIMEOUT_S,
    via: Exec | None = None,
) -> bytes | None:
    """The content of ``path`` at ``commit`` (bytes as stored), or None when it is absent
    there or git fails."""
    from envbisect.agent.actuate_common import NO_SIDE_EFFECTS

    argv = ["git", "-C", str(repo), *NO_SIDE_EFFECTS, "show", f"{commit}:{path}"]
    if via is not None:
        code, out, _err = via(argv, timeout_s)
        return out if code == 0 else None
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return proc.stdout if proc.returncode == 0 else None
