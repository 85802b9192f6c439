"""The executors (``envbisect.realize.execute``): a plan carried out for real.

The local executor runs the agent's operations in this process: a real git repo and its
worktree, real files swapped through the session's journal and put back, real cache dirs,
a real uv overlay venv. The remote executor's bookkeeping (what it keeps between
operations in its ``RemoteState``) is checked against the agent calls it makes.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envbisect.model.plan import CacheDir, Plan, Swap, VenvSpec
from envbisect.model.session import Session
from envbisect.model.sources import Sources
from envbisect.realize.execute import LocalExecutor, RemoteExecutor, RemoteState
from envbisect.sections.git import worktree_name
from envbisect.transport import Transport
from tests.helpers_run import build_wheel, commit_all, freeze, init_repo, make_venv, uv


def _sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _blob(tmp: Path, content: bytes) -> Path:
    path = tmp / "blobs" / _sha(content)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


@pytest.fixture
def session(tmp_path: Path) -> Session:
    return Session.start(tmp_path / "session", {})


def test_local_executor_applies_a_plan_and_puts_every_file_back(
    tmp_path: Path, session: Session
) -> None:
    repo = init_repo(tmp_path / "repo")
    (repo / "train.py").write_text("v1\n")
    first = commit_all(repo, "one")
    (repo / "train.py").write_text("v2\n")
    second = commit_all(repo, "two")
    conf = tmp_path / "etc" / "app.conf"
    conf.parent.mkdir()
    conf.write_bytes(b"the user's conf\n")
    warm = tmp_path / "warm-cache"
    (warm / "sub").mkdir(parents=True)
    (warm / "sub" / "kernel.bin").write_bytes(b"compiled")

    executor = LocalExecutor(Transport(), session, uv=uv)
    facts = executor.inspect(
        {
            "sha256": [str(conf)],
            "commits": [[str(repo), first], [str(repo), "f" * 40]],
            "revlists": [[str(repo), first, second]],
            "dirs": [str(warm), str(tmp_path / "nowhere")],
            "exists": [str(conf)],
        }
    )
    assert facts["sha256"] == {str(conf): _sha(b"the user's conf\n")}
    assert facts["commits"] == [True, False]
    assert facts["revlists"] == [[second]]
    assert facts["dirs"] == [True, False]
    assert facts["exists"] == [True]

    worktree = session.root / "worktrees" / worktree_name(str(repo), first)
    trial = session.root / "trials" / "001"
    script, wanted = b"v1 with a hunk\n", b"the good conf\n"
    plan = Plan(
        python=sys.executable,
        env={},
        worktrees=((str(repo), first, str(worktree)),),
        swaps=(
            Swap(
                str(worktree / "train.py"),
                _sha(script),
                f"{repo}/train.py",
                _blob(tmp_path, script),
            ),
            Swap(str(conf), _sha(wanted), str(conf), _blob(tmp_path, wanted)),
        ),
        caches=(
            CacheDir("inductor", str(trial / "caches" / "inductor"), str(warm)),
            CacheDir("triton", str(trial / "caches" / "triton"), None),
        ),
    )
    failure, notes = executor.apply(plan, trial)
    assert (failure, notes) == (None, [])
    # The worktree is at the planned commit, with the file of the state written into it.
    head = subprocess.run(
        ["git", "-C", str(worktree), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert head == first
    assert (worktree / "train.py").read_bytes() == script
    assert (repo / "train.py").read_text() == "v2\n"  # the user's checkout is untouched
    assert session.worktrees() == [(repo, worktree)]
    # The loose file is the state's; the caches are a copy and an empty dir.
    assert conf.read_bytes() == wanted
    assert (trial / "caches" / "inductor" / "sub" / "kernel.bin").read_bytes() == b"compiled"
    assert list((trial / "caches" / "triton").iterdir()) == []

    assert executor.restore() == []
    assert conf.read_bytes() == b"the user's conf\n"
    executor.cleanup()
    session.remove_worktrees()
    assert not worktree.exists()
    session.journal.release()


def test_local_executor_keeps_a_file_the_user_changed_meanwhile(
    tmp_path: Path, session: Session
) -> None:
    conf = tmp_path / "app.conf"
    conf.write_bytes(b"original\n")
    wanted = b"state\n"
    plan = Plan(
        python=sys.executable,
        env={},
        swaps=(Swap(str(conf), _sha(wanted), str(conf), _blob(tmp_path, wanted)),),
    )
    executor = LocalExecutor(Transport(), session, uv=uv)
    assert executor.apply(plan, tmp_path / "trial") == (None, [])
    conf.write_bytes(b"edited by the user during the trial\n")
    kept = executor.restore()
    assert len(kept) == 1 and str(conf) in kept[0]
    assert conf.read_bytes() == b"edited by the user during the trial\n"
    session.journal.release()


def test_local_executor_fails_a_swap_without_its_content(tmp_path: Path, session: Session) -> None:
    conf = tmp_path / "app.conf"
    conf.write_bytes(b"original\n")
    plan = Plan(
        python=sys.executable,
        env={},
        swaps=(Swap(str(conf), _sha(b"never stored\n"), str(conf), None),),
    )
    failure, _notes = LocalExecutor(Transport(), session, uv=uv).apply(plan, tmp_path / "t")
    assert failure is not None and str(conf) in failure
    assert conf.read_bytes() == b"original\n"
    session.journal.release()


def test_local_executor_builds_an_overlay_venv_that_leaves_the_target_alone(
    tmp_path: Path, session: Session
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "ebwork", "1.0", "WORK = 1\n")
    build_wheel(wheels, "ebonly", "1.0", "X = 7\n")
    target = make_venv(tmp_path / "target", wheels, "ebwork==1.0")
    before = freeze(target)
    python = str(target / "bin" / "python")
    base, site = subprocess.run(
        [
            python,
            "-c",
            "import sys, site; print(sys.base_prefix); print(site.getsitepackages()[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")[:2]
    sources = Sources(default_index=(tmp_path / "empty-index").as_uri(), find_links=(str(wheels),))
    spec: dict[str, Any] = {
        "python": python,
        "install": {"ebonly": "ebonly==1.0"},
        "hide": [],
        "sources": sources.as_dict(),
    }
    venv = VenvSpec(
        path=str(session.root / "venvs" / "overlay"),
        base=base,
        install=("ebonly==1.0",),
        sites=(site,),
        excluded={},
        spec=spec,
    )
    executor = LocalExecutor(Transport(), session, uv=uv)
    path, failure = executor.venv(venv.params(), tmp_path / "trial")
    assert failure is None and path == venv.path
    out = subprocess.run(
        [f"{path}/bin/python", "-c", "import ebwork, ebonly; print(ebwork.WORK, ebonly.X)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == "1 7"  # ebwork through the link farm, ebonly installed in the overlay
    assert freeze(target) == before
    # Asked again, the venv is found ready, not built again.
    assert executor.venv(venv.params(), tmp_path / "trial2") == (path, None)


class _Agent:
    """Records the operations a remote executor asks for, and answers them."""

    def __init__(self, answers: dict[str, dict[str, Any]] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answers = answers or {}

    def __call__(
        self, op: str, params: Any, log_dir: Path, name: str, timeout_s: float = 300
    ) -> dict[str, Any]:
        self.calls.append((op, dict(params)))
        return self.answers.get(op, {})


def _remote(agent: _Agent, state: RemoteState, probed: bool = True) -> RemoteExecutor:
    return RemoteExecutor(
        agent,
        state,
        log_dir=Path("/logs"),
        where="ssh far",
        root=lambda: "/far/.envbisect/session-x",
        uv=lambda: ("/far/uv",),
        probed=probed,
    )


def test_remote_executor_keeps_its_state_between_operations(tmp_path: Path) -> None:
    content = b"state\n"
    state = RemoteState()
    agent = _Agent(
        {
            "realize": {"failure": None, "notes": []},
            "restore": {"kept": ["kept /etc/app.conf"]},
            "venv": {"venv": "/far/venvs/v"},
        }
    )
    # Nothing swapped yet: restoring asks the target nothing.
    assert _remote(agent, state).restore() == []
    assert agent.calls == []
    plan = Plan(
        python="/far/python",
        env={},
        swaps=(Swap("/etc/app.conf", _sha(content), "/etc/app.conf", _blob(tmp_path, content)),),
    )
    assert _remote(agent, state).apply(plan, tmp_path / "t") == (None, [])
    assert state.dirty
    op, params = agent.calls[-1]
    assert op == "realize" and params["root"] == "/far/.envbisect/session-x"
    assert params["swaps"][0]["content"] == "c3RhdGUK"  # base64 of the blob
    # A later executor of the same actuator (same state) restores, once.
    assert _remote(agent, state).restore() == ["kept /etc/app.conf (via ssh far)"]
    assert not state.dirty
    assert _remote(agent, state).restore() == []
    assert [op for op, _ in agent.calls] == ["realize", "restore"]
    # A venv built once is known ready for the rest of the run.
    params = {"venv": "/far/venvs/v", "install": []}
    assert _remote(agent, state).venv(params, tmp_path / "t") == ("/far/venvs/v", None)
    assert _remote(agent, state).venv(params, tmp_path / "t") == ("/far/venvs/v", None)
    assert [op for op, _ in agent.calls].count("venv") == 1
    assert state.venvs == {"/far/venvs/v"}
    # Cleanup only where the target was ever reached.
    _remote(agent, state, probed=False).cleanup()
    assert agent.calls[-1][0] == "venv"
    _remote(agent, state).cleanup()
    assert agent.calls[-1] == ("cleanup", {"root": "/far/.envbisect/session-x"})
