"""The user's own repo (commits and an uncommitted patch in model.py, relative paths) bisected
on a target reached through layers: a real sshd on 127.0.0.1, then the fake ``pct exec``
(issue 33). The far side is this machine, so the repo, its worktrees and the remote session
dir can be looked at; ``env HOME=...`` as the innermost layer keeps the remote session dir
inside the test's tmp dir."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from helpers_ssh import (  # the same module object as test_transport_ssh's: one sshd
    SshServer,
    sshd_server,  # noqa: F401 - a pytest fixture, used by name
)

from envbisect.cli import cli
from tests.helpers_user_repo import METRIC, SLOW_SUBJECT, UserRepo, make_user_repo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> UserRepo:
    return make_user_repo(tmp_path_factory.mktemp("remote-repo"))


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> UserRepo:
    return make_user_repo(tmp_path_factory.mktemp("remote"), list_model=True)


def _layers(w: UserRepo, ssh: SshServer, chain: str, session: str) -> list[str]:
    home = w.ws.parent / f"far-home-{session}"
    home.mkdir(exist_ok=True)
    via = {"ssh": [ssh.via], "ssh+pct": [ssh.via, "pct exec 200 --"]}[chain]
    return [w for v in [*via, f"env HOME={home}"] for w in ("--via", v)]


def _run(
    w: UserRepo, ssh: SshServer, chain: str, session: str, *command: str
) -> tuple[Any, dict[str, Any]]:
    out = w.ws / f"result-{session}.json"
    argv = [
        "run", "--config", str(w.config), "--good", str(w.good), "--bad", str(w.bad),
        "--python", str(w.python), "--session", str(w.ws / ".envbisect" / session),
        "--metric-regex", METRIC, "--until", "50%", "--json", str(out),
        *_layers(w, ssh, chain, session), "--", *command,
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    return res, json.loads(out.read_text()) if out.exists() else {}


def _probe_facts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every trial's facts, as the probe sent them back through the layers."""
    facts = [t["facts"] for t in doc["trials"]]
    assert facts and all(f and f["source"] == "probe" and f["exit_code"] == 0 for f in facts)
    return facts


@pytest.mark.parametrize("chain", ["ssh", "ssh+pct"])
def test_the_model_file_is_narrowed_to_its_commit_and_hunk_through_layers(
    listed: UserRepo,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
    chain: str,
) -> None:
    """model.py listed under files: (its commits and the uncommitted patch): through the
    layers the run names the commit and the hunk, as a local run does; the relative paths
    are the repo's (a remote command runs in the single repo's worktree)."""
    res, doc = _run(
        listed, sshd_server, chain, f"h-{chain}", "python", "train.py", "--data", "data/x.jsonl"
    )
    assert res.return_value == 0, res.output
    (culprit,) = doc["culprits"]
    assert culprit["unit"] == f"files:{listed.repo / 'model.py'}", res.output
    hunk = culprit["hunk"]
    assert hunk["commit"] == listed.slow_commit and not hunk["uncommitted"], res.output
    assert hunk["subject"] == SLOW_SUBJECT
    assert hunk["hunk_text"] == "@@ -1,1 +1,1 @@\n-WORK = 1\n+WORK = 8\n", res.output
    line = next(x for x in res.output.splitlines() if x.startswith("Culprit: "))
    assert line.startswith(f"Culprit: commit {listed.slow_commit[:7]} "), line
    assert "repo/model.py hunk @@ -1,1 +1,1 @@" in line, line
    assert [t for t in doc["trials"] if t.get("failure")] == [], res.output
    _probe_facts(doc)
    # The commits were read on the target: its git's output is in the session's remote logs.
    logs = listed.ws / ".envbisect" / f"h-{chain}" / "remote" / "git"
    assert any(listed.slow_commit in p.read_text() for p in logs.glob("git-*.stdout"))


@pytest.mark.parametrize("chain", ["ssh", "ssh+pct"])
def test_the_repo_is_narrowed_to_its_first_bad_commit_through_layers(
    world: UserRepo,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
    chain: str,
) -> None:
    """Unlisted model.py: the repo's unit, narrowed to the slow commit; the culprit's
    commit range is listed from the target's repo, the first bad commit marked."""
    res, doc = _run(
        world, sshd_server, chain, f"c-{chain}", "python3", "train.py", "--data", "data/x.jsonl"
    )
    assert res.return_value == 0, res.output
    (culprit,) = doc["culprits"]
    assert culprit["unit"] == f"git:{world.repo}", res.output
    assert culprit["commit"] == world.slow_commit, res.output
    marked = [d for d in culprit["details"] if d.endswith("← first bad commit")]
    assert marked == [f"{world.slow_commit[:12]} {SLOW_SUBJECT}  ← first bad commit"], res.output
    assert [t for t in doc["trials"] if t.get("failure")] == [], res.output
    _probe_facts(doc)


def test_a_shell_script_that_cds_above_the_repo_is_said_at_the_start(
    world: UserRepo,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
) -> None:
    """``bash -c 'cd /abs/ws && python repo/train.py'`` through ssh: nothing maps the
    relative path after the cd, so every trial would run the live repo. The run says so at
    the start instead of answering from the live tree in silence."""
    script = f"cd {world.ws} && python repo/train.py --data repo/data/x.jsonl"
    res, _doc = _run(world, sshd_server, "ssh", "cd-live", "bash", "-c", script)
    note = next((x for x in res.output.splitlines() if "changes into" in x), "")
    assert note.startswith(f"note: the command's shell script changes into {world.ws}"), res.output
    assert "relative paths after that name the live repo there" in note
