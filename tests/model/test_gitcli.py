"""Host-side git (envbisect.model.gitcli) and the agent's twin: real git, and a git that hangs."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from envbisect.agent import actuate_common
from envbisect.model import gitcli


def _repo(tmp_path: Path) -> tuple[Path, list[str]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = gitcli.commit_env(
        "2026-01-01T00:00:00Z",
        {
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@x",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@x",
        },
    )
    assert gitcli.run("init", "-q", "-b", "main", repo=repo).ok
    shas = []
    for i in range(3):
        (repo / "f.txt").write_text(f"{i}\n")
        assert gitcli.run("add", "f.txt", repo=repo, env=env).ok
        assert gitcli.run("commit", "-q", "-m", f"change {i}", repo=repo, env=env).ok
        shas.append(gitcli.run("rev-parse", "HEAD", repo=repo).stdout.strip())
    return repo, shas


def test_log_subjects_oldest_first(tmp_path: Path) -> None:
    repo, shas = _repo(tmp_path)
    res = gitcli.log_subjects(str(repo), shas[0], shas[2])
    assert res.ok
    assert res.stdout.splitlines() == [f"{shas[1]} change 1", f"{shas[2]} change 2"]


def test_a_failing_git_is_a_result_not_an_exception(tmp_path: Path) -> None:
    res = gitcli.run("rev-parse", "HEAD", repo=tmp_path)
    assert not res.ok
    assert "not a git repository" in res.stderr


@pytest.fixture
def hanging_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``git`` first on PATH that never answers (a lock, a prompt, a dead mount)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "git"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return fake


def test_a_hanging_git_times_out(hanging_git: Path, tmp_path: Path) -> None:
    start = time.monotonic()
    res = gitcli.run("worktree", "prune", repo=tmp_path, timeout_s=0.5)
    assert res.returncode == 124
    assert res.stderr == "git worktree prune timed out after 0.5s"
    assert time.monotonic() - start < 10


def test_the_agents_git_times_out_too(hanging_git: Path, tmp_path: Path) -> None:
    res = actuate_common.run_git(str(tmp_path), "rev-list", "a..b", timeout=0.5)
    assert isinstance(res, subprocess.CompletedProcess)
    assert res.returncode == 124
    assert "timed out" in res.stderr


def test_no_git_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    res = gitcli.run("status", repo=tmp_path)
    assert res.returncode == 127
    assert res.stderr.startswith("cannot run git")
