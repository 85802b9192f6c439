"""The user's own repo (commits and an uncommitted patch in model.py, relative paths) bisected
on a target reached through layers: a real sshd on 127.0.0.1, then the fake ``pct exec``
(issue 33). The far side is this machine, so the repo, its worktrees and the remote session
dir can be looked at; ``env HOME=...`` as the innermost layer keeps the remote session dir
inside the test's tmp dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers_ssh import (  # the same module object as test_transport_ssh's: one sshd
    SshServer,
    sshd_server,  # noqa: F401 - a pytest fixture, used by name
)

from envbisect.cli import cli
from tests.helpers_user_repo import METRIC, UserRepo, make_user_repo

pytestmark = pytest.mark.slow


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


@pytest.mark.parametrize("chain", ["ssh", "ssh+pct"])
def test_the_model_file_is_narrowed_to_its_commit_and_hunk_through_layers(
    listed: UserRepo, sshd_server: SshServer, chain: str  # noqa: F811 - the fixture
) -> None:
    res, doc = _run(
        listed, sshd_server, chain, f"h-{chain}", "python", "train.py", "--data", "data/x.jsonl"
    )
    print(res.output)
    assert res.return_value == 0, res.output
    (culprit,) = doc["culprits"]
    assert culprit["unit"] == f"files:{listed.repo / 'model.py'}", res.output
    hunk = culprit["hunk"]
    assert hunk["commit"] == listed.slow_commit and not hunk["uncommitted"], res.output
    assert hunk["hunk_text"] == "@@ -1,1 +1,1 @@\n-WORK = 1\n+WORK = 8\n", res.output
