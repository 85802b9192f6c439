from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from envbisect.diff import diff_manifests
from envbisect.model import manifest as mf
from envbisect.model.session import Session
from envbisect.realize.actuate import Actuator
from tests.helpers_run import (
    build_wheel,
    commit_all,
    file_entry,
    freeze,
    git,
    init_repo,
    make_venv,
    pkg,
    store_blob,
    tree_hashes,
)


def _run(python: str, code: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheels")
    build_wheel(d, "ebwork", "1.0", "WORK = 1\n")
    build_wheel(d, "ebwork", "2.0", "WORK = 8\n")
    build_wheel(d, "ebonly", "1.0", "X = 1\n")
    build_wheel(d, "ebgone", "1.0", "Y = 1\n")
    return d


def _actuator(tmp_path: Path, good: Path, bad: Path, python: str, **kw: object) -> Actuator:
    g, b = mf.load(good), mf.load(bad)
    result = diff_manifests(g, b)
    session = Session.start(tmp_path / "session", {})
    return Actuator(
        good=g,
        bad=b,
        units=result.units,
        session=session,
        python=python,
        **kw,  # type: ignore[arg-type]
    )


def test_packages_overlay_installs_hides_and_never_touches_the_target(
    tmp_path: Path, wheels: Path
) -> None:
    target = make_venv(tmp_path / "target", wheels, "ebwork==2.0", "ebonly==1.0")
    before = (freeze(target), tree_hashes(target))
    good = mf_path = tmp_path / "m" / "good.yaml"
    from tests.helpers_run import manifest

    manifest(mf_path, packages={"ebwork": pkg("1.0"), "ebgone": pkg("1.0")})
    bad = manifest(
        tmp_path / "m" / "bad.yaml", packages={"ebwork": pkg("2.0"), "ebonly": pkg("1.0")}
    )
    act = _actuator(
        tmp_path,
        good,
        bad,
        str(target / "bin" / "python"),
        index_url=(tmp_path / "empty-index").as_uri(),
        find_links=(str(wheels),),
    )
    assert {u.id for u in act.units} == {"packages:ebwork", "packages:ebonly", "packages:ebgone"}
    assert act.blockers() == {}
    trial = tmp_path / "t1"
    with act.realize(frozenset(), {}, trial) as state:
        assert state.failure is None, state.failure
        assert state.venv is not None and state.python != str(target / "bin" / "python")
        probe = (
            "import importlib, importlib.metadata as m\n"
            "import ebwork, ebgone\n"
            "print(ebwork.WORK, m.version('ebwork'), m.version('ebgone'))\n"
            "try:\n    import ebonly; print('visible')\nexcept ImportError: print('hidden')\n"
            "try:\n    m.version('ebonly'); print('meta-visible')\n"
            "except m.PackageNotFoundError: print('meta-hidden')\n"
        )
        assert _run(state.python, probe).split() == ["1", "1.0", "1.0", "hidden", "meta-hidden"]
        assert state.env["VIRTUAL_ENV"] == str(state.venv)
        first_venv = state.venv
    # Only ebwork applied: the bad version, ebonly still hidden, ebgone still there.
    with act.realize(frozenset({"packages:ebwork"}), {}, tmp_path / "t2") as state:
        out = _run(state.python, "import ebwork, ebgone; print(ebwork.WORK)")
        assert out == "8"
    # Everything applied is the target itself: no venv needed.
    with act.realize(frozenset(u.id for u in act.units), {}, tmp_path / "t3") as state:
        assert state.venv is None and state.python == str(target / "bin" / "python")
    # Revisiting a package set reuses its venv (cached by the set's hash).
    with act.realize(frozenset(), {}, tmp_path / "t4") as state:
        assert state.venv == first_venv
        assert not (tmp_path / "t4" / "build-venv.stderr").exists()
    assert (freeze(target), tree_hashes(target)) == before


def test_resolver_failure_is_an_unresolved_state_with_uvs_message(
    tmp_path: Path, wheels: Path
) -> None:
    from tests.helpers_run import manifest

    target = make_venv(tmp_path / "target", wheels, "ebwork==2.0")
    good = manifest(tmp_path / "m" / "good.yaml", packages={"ebwork": pkg("9.9")})
    bad = manifest(tmp_path / "m" / "bad.yaml", packages={"ebwork": pkg("2.0")})
    act = _actuator(
        tmp_path,
        good,
        bad,
        str(target / "bin" / "python"),
        index_url=(tmp_path / "empty-index").as_uri(),
        find_links=(str(wheels),),
    )
    with act.realize(frozenset(), {}, tmp_path / "t1") as state:
        assert state.failure is not None and state.failure.startswith("build: uv pip install")
        assert "ebwork==9.9" in state.failure
    log = (tmp_path / "t1" / "build-install.stderr").read_text()
    assert "9.9" in log


def test_git_worktree_files_and_env(tmp_path: Path) -> None:
    from tests.helpers_run import manifest

    repo = init_repo(tmp_path / "repo")
    (repo / "train.py").write_text("print('v1')\n")
    (repo / "knob.txt").write_text("1\n")
    c1 = commit_all(repo, "one")
    (repo / "train.py").write_text("print('v2')\n")
    c2 = commit_all(repo, "two")
    (repo / "train.py").write_text("print('v3')\n")
    c3 = commit_all(repo, "three")
    loose = tmp_path / "loose.cfg"
    loose.write_bytes(b"slow\n")
    mdir = tmp_path / "m"
    good = manifest(
        mdir / "good.yaml",
        git={str(repo): {"head": c1, "branch": "main", "dirty": False}},
        files={
            str(loose): store_blob(mdir, b"fast\n"),
            str(repo / "knob.txt"): store_blob(mdir, b"1\n"),
        },
        env={"KEEP": "x"},
    )
    bad = manifest(
        mdir / "bad.yaml",
        # knob.txt differs from c3's: uncommitted, so it stays a files: unit of its own.
        git={str(repo): {"head": c3, "branch": "main", "dirty": True}},
        files={str(loose): file_entry(b"slow\n"), str(repo / "knob.txt"): store_blob(mdir, b"8\n")},
        env={"EB_SLOW": "8", "KEEP": "x"},
    )
    (repo / "knob.txt").write_text("8\n")  # the user's repo is dirty in the bad state
    status_before = git(repo, "status", "--porcelain")
    act = _actuator(tmp_path, good, bad, "python3", base_env={"PATH": "/usr/bin:/bin"}, cwd=repo)
    assert act.blockers() == {}
    # knob.txt: no commit touched it, so its one version is the uncommitted edit.
    assert act.ordered() == {f"git:{repo}": [c2, c3], f"files:{repo / 'knob.txt'}": ["uncommitted"]}
    trial = tmp_path / "t1"
    with act.realize(frozenset({"env:EB_SLOW"}), {}, trial) as state:
        assert state.failure is None
        assert state.cwd is not None and (state.cwd / "train.py").read_text() == "print('v1')\n"
        assert (state.cwd / "knob.txt").read_text() == "1\n"
        assert loose.read_bytes() == b"fast\n"  # swapped in place, journaled
        assert state.env["EB_SLOW"] == "8"
        # No cache changed: none is redirected (or copied); trials use the machine's.
        assert "TORCHINDUCTOR_CACHE_DIR" not in state.env
        assert state.map_argv([str(repo / "train.py"), "-x"]) == [
            str(state.cwd / "train.py"),
            "-x",
        ]
    assert loose.read_bytes() == b"slow\n"  # restored after the trial
    with act.realize(
        frozenset({f"git:{repo}", f"files:{repo / 'knob.txt'}"}), {f"git:{repo}": 0}, trial
    ) as state:
        assert (state.cwd / "train.py").read_text() == "print('v2')\n"
        assert (state.cwd / "knob.txt").read_text() == "8\n"  # written into the worktree
        assert "EB_SLOW" not in state.env
    act.close()
    assert git(repo, "status", "--porcelain") == status_before
    assert git(repo, "worktree", "list").count("\n") == 0
    assert (repo / "knob.txt").read_text() == "8\n"


def test_redacted_env_and_missing_blob_and_data_are_blocked_plainly(tmp_path: Path) -> None:
    from tests.helpers_run import manifest

    loose = tmp_path / "x.cfg"
    loose.write_text("new")
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n{}\n")
    good = manifest(
        tmp_path / "good.yaml",
        env={"TOKEN": {"redacted": "abcd1234"}},
        files={str(loose): {"sha256": "0" * 64, "size": 3, "blob": "0" * 64}},
        data={str(data): {"size": 3, "records": 1, "fingerprint": "a"}},
    )
    bad = manifest(
        tmp_path / "bad.yaml",
        env={"TOKEN": {"redacted": "ffff0000"}},
        files={str(loose): file_entry(b"new")},
        data={str(data): {"size": 6, "records": 2, "fingerprint": "b"}},
    )
    act = _actuator(tmp_path, good, bad, "python3")
    blocked = act.blockers()
    token = {u.id: u for u in act.units}["env:TOKEN"]
    assert "redacted" in (blocked.get("env:TOKEN") or token.reason or "")
    assert not token.bisectable or "env:TOKEN" in blocked
    assert "no stored content" in blocked[f"files:{loose}"]
    assert "data_map" in blocked[f"data:{data}"]
    old = tmp_path / "old.jsonl"
    old.write_text("{}\n")
    act2 = _actuator(tmp_path / "b", good, bad, "python3", data_map={str(data): str(old)})
    assert f"data:{data}" not in act2.blockers()
    with act2.realize(frozenset(), {}, tmp_path / "t") as state:
        assert state.map_argv(["--data", str(data)]) == ["--data", str(old)]
        assert state.env["ENVBISECT_DATA_0"] == str(old)


def _h(value: str) -> dict[str, str]:
    return {"redacted": hashlib.sha256(value.encode()).hexdigest()[:8]}


def test_a_redacted_env_var_passes_through_unchanged_and_says_why(tmp_path: Path) -> None:
    """Issue 17: trials saw X="{'redacted': '...'}" instead of the user's real token."""
    from tests.helpers_run import manifest

    real = "real-token-of-the-user"
    good = manifest(tmp_path / "good.yaml", env={"CUDA_TOKEN_X": _h("older-token")})
    bad = manifest(tmp_path / "bad.yaml", env={"CUDA_TOKEN_X": _h(real)})
    act = _actuator(tmp_path, good, bad, "python3", base_env={"CUDA_TOKEN_X": real, "A": "1"})
    unit = {u.id: u for u in act.units}["env:CUDA_TOKEN_X"]
    assert not unit.bisectable and "redacted" in (unit.reason or "")
    assert act.notes() == [
        "env CUDA_TOKEN_X is a secret (redacted in the manifest): every trial passes it "
        "through from your environment unchanged"
    ]
    for applied in (frozenset(), frozenset({"env:CUDA_TOKEN_X"})):
        with act.realize(applied, {}, tmp_path / "t") as state:
            assert state.env["CUDA_TOKEN_X"] == real


@pytest.mark.parametrize("here", ["real-token", "another-token", None])
def test_an_added_redacted_env_var_is_bisectable_when_the_environment_holds_it(
    tmp_path: Path, here: str | None
) -> None:
    from tests.helpers_run import manifest

    good = manifest(tmp_path / "good.yaml", env={})
    bad = manifest(tmp_path / "bad.yaml", env={"HF_TOKEN": _h("real-token")})
    base = {"A": "1"} if here is None else {"A": "1", "HF_TOKEN": here}
    act = _actuator(tmp_path, good, bad, "python3", base_env=base)
    blocked = act.blockers()
    if here == "real-token":
        assert blocked == {}
        with act.realize(frozenset(), {}, tmp_path / "t") as state:
            assert "HF_TOKEN" not in state.env
        with act.realize(frozenset({"env:HF_TOKEN"}), {}, tmp_path / "t") as state:
            assert state.env["HF_TOKEN"] == "real-token"
        return
    assert blocked["env:HF_TOKEN"] == (
        "env HF_TOKEN: the bad value is a secret, redacted in the manifest, and HF_TOKEN here "
        "is not that value, so it cannot be set; every trial passes HF_TOKEN through from "
        "your environment unchanged"
    )
    with act.realize(frozenset(), {}, tmp_path / "t") as state:
        assert state.env.get("HF_TOKEN") == here


def test_caches_warm_is_a_copy_cold_is_empty_and_the_users_cache_is_untouched(
    tmp_path: Path,
) -> None:
    from tests.helpers_run import manifest

    cache = tmp_path / "inductor"
    (cache / "fx").mkdir(parents=True)
    (cache / "fx" / "graph").write_text("compiled\n")
    before = tree_hashes(cache)
    warm = {"path": str(cache), "exists": True, "files": 1, "bytes": 9}
    cold = {"path": str(cache), "exists": True, "files": 0, "bytes": 0}
    triton = {"path": str(tmp_path / "triton"), "exists": True, "files": 1, "bytes": 5}
    good = manifest(tmp_path / "good.yaml", caches={"inductor": warm, "triton": triton})
    bad = manifest(tmp_path / "bad.yaml", caches={"inductor": cold, "triton": triton})
    act = _actuator(tmp_path, good, bad, "python3")
    assert act.blockers() == {}
    with act.realize(frozenset(), {}, tmp_path / "t1") as state:
        # triton did not change: used where the snapshot found it, never copied
        assert state.env["TRITON_CACHE_DIR"] == triton["path"]
        assert not (tmp_path / "t1" / "caches" / "triton").exists()
        sandbox = Path(state.env["TORCHINDUCTOR_CACHE_DIR"])
        assert sandbox != cache and (sandbox / "fx" / "graph").read_text() == "compiled\n"
        (sandbox / "fx" / "new").write_text("written by the trial\n")
    assert not sandbox.exists()  # the copy goes when the trial ends
    with act.realize(frozenset({"caches:inductor"}), {}, tmp_path / "t2") as state:
        cold_dir = Path(state.env["TORCHINDUCTOR_CACHE_DIR"])
        assert list(cold_dir.iterdir()) == []
    assert not cold_dir.exists()
    assert tree_hashes(cache) == before
    # A warm state whose recorded cache is gone is still bisected: its dir starts empty and
    # the state says that warm is to be made by a run of it (the runner does that run).
    (cache / "fx" / "graph").unlink()
    (cache / "fx").rmdir()
    act2 = _actuator(tmp_path / "b", good, bad, "python3")
    assert act2.blockers() == {}
    with act2.realize(frozenset(), {}, tmp_path / "t3") as state:
        made = Path(state.env["TORCHINDUCTOR_CACHE_DIR"])
        assert state.fill == ("inductor",) and list(made.iterdir()) == []
        (made / "graph").write_text("compiled by the filling run\n")
    with act2.realize(frozenset(), {}, tmp_path / "t3") as state:  # the same trial again
        assert (made / "graph").read_text() == "compiled by the filling run\n"
    with act2.realize(frozenset({"caches:inductor"}), {}, tmp_path / "t4") as state:
        assert state.fill == ()


def test_local_version_labels_are_kept(tmp_path: Path, wheels: Path) -> None:
    from tests.helpers_run import manifest

    build_wheel(tmp_path / "w", "ebwork", "1.0+cu130", "WORK = 130\n")
    target = make_venv(tmp_path / "target", wheels, "ebwork==1.0")
    good = manifest(tmp_path / "m" / "good.yaml", packages={"ebwork": pkg("1.0+cu130")})
    bad = manifest(tmp_path / "m" / "bad.yaml", packages={"ebwork": pkg("1.0")})
    act = _actuator(
        tmp_path,
        good,
        bad,
        str(target / "bin" / "python"),
        index_url=(tmp_path / "empty-index").as_uri(),
        find_links=(str(tmp_path / "w"), str(wheels)),
    )
    with act.realize(frozenset(), {}, tmp_path / "t") as state:
        assert state.failure is None, state.failure
        out = _run(
            state.python,
            "import ebwork, importlib.metadata as m; print(ebwork.WORK, m.version('ebwork'))",
        )
        assert out == "130 1.0+cu130"


# ---- remote targets: the same actuators through a layer chain (the remote agent) ----------


def _far(tmp_path: Path) -> tuple[object, Path]:
    """A chain whose far side has its own HOME (so the remote session dir lands there)."""
    from envbisect.transport import Transport

    home = tmp_path / "far-home"
    home.mkdir()
    return Transport.from_specs([f"env HOME={home}"]), home


def test_remote_overlay_venv_is_built_under_the_remote_session_dir(
    tmp_path: Path, wheels: Path
) -> None:
    from tests.helpers_run import manifest

    target = make_venv(tmp_path / "target", wheels, "ebwork==2.0", "ebonly==1.0")
    before = (freeze(target), tree_hashes(target))
    good = manifest(tmp_path / "m" / "good.yaml", packages={"ebwork": pkg("1.0")})
    bad = manifest(
        tmp_path / "m" / "bad.yaml", packages={"ebwork": pkg("2.0"), "ebonly": pkg("1.0")}
    )
    transport, home = _far(tmp_path)
    act = _actuator(
        tmp_path,
        good,
        bad,
        str(target / "bin" / "python"),
        transport=transport,
        index_url=(tmp_path / "empty-index").as_uri(),
        find_links=(str(wheels),),
    )
    assert act.blockers() == {}
    with act.realize(frozenset(), {}, tmp_path / "t1") as state:
        assert state.failure is None, state.failure
        assert state.venv is not None
        assert str(state.venv).startswith(f"{home}/.envbisect/session-")
        probe = "import ebwork\ntry:\n    import ebonly; print(ebwork.WORK, 'visible')\n"
        probe += "except ImportError: print(ebwork.WORK, 'hidden')\n"
        assert _run(state.python, probe) == "1 hidden"
        assert state.env["PATH"].startswith(f"{state.venv}/bin:")
        assert state.env["VIRTUAL_ENV"] == str(state.venv)
        # uv's own output is in the trial's log on this machine
        assert (tmp_path / "t1" / "build-venv.stderr").exists()
    with act.realize(frozenset(), {}, tmp_path / "t2") as again:
        assert again.venv == state.venv  # cached by the package-set hash
    assert (freeze(target), tree_hashes(target)) == before


def test_remote_caches_data_and_blockers_are_decided_on_the_target(tmp_path: Path) -> None:
    from tests.helpers_run import manifest

    cache = tmp_path / "inductor"
    (cache / "fx").mkdir(parents=True)
    (cache / "fx" / "graph").write_text("compiled\n")
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n{}\n")
    old = tmp_path / "old.jsonl"
    old.write_text("{}\n")
    warm = {"path": str(cache), "exists": True, "files": 1, "bytes": 9}
    cold = {"path": str(cache), "exists": True, "files": 0, "bytes": 0}
    good = manifest(
        tmp_path / "good.yaml",
        caches={"inductor": warm},
        data={str(data): {"size": 3, "records": 1, "fingerprint": "a"}},
    )
    bad = manifest(
        tmp_path / "bad.yaml",
        caches={"inductor": cold},
        data={str(data): {"size": 6, "records": 2, "fingerprint": "b"}},
    )
    transport, home = _far(tmp_path)
    missing = {str(data): str(tmp_path / "nowhere.jsonl")}
    act0 = _actuator(tmp_path / "a", good, bad, "python3", transport=transport, data_map=missing)
    assert "data_map" in act0.blockers()[f"data:{data}"]
    act = _actuator(
        tmp_path / "b", good, bad, "python3", transport=transport, data_map={str(data): str(old)}
    )
    assert act.blockers() == {}
    with act.realize(frozenset(), {}, tmp_path / "t1") as state:
        sandbox = Path(state.env["TORCHINDUCTOR_CACHE_DIR"])
        assert str(sandbox).startswith(f"{home}/.envbisect/session-")
        assert (sandbox / "fx" / "graph").read_text() == "compiled\n"
        assert "TRITON_CACHE_DIR" not in state.env  # not recorded: not redirected
        assert state.map_argv(["--data", str(data)]) == ["--data", str(old)]
    assert not sandbox.exists()  # removed there when the trial ended
    with act.realize(frozenset({"caches:inductor", f"data:{data}"}), {}, tmp_path / "t2") as s2:
        assert list(Path(s2.env["TORCHINDUCTOR_CACHE_DIR"]).iterdir()) == []
        assert s2.map_argv([str(data)]) == [str(data)]
    (cache / "fx" / "graph").unlink()
    (cache / "fx").rmdir()
    act2 = _actuator(
        tmp_path / "c", good, bad, "python3", transport=transport, data_map={str(data): str(old)}
    )
    assert act2.blockers() == {}
    with act2.realize(frozenset(), {}, tmp_path / "t3") as s3:
        assert s3.fill == ("inductor",)
        assert list(Path(s3.env["TORCHINDUCTOR_CACHE_DIR"]).iterdir()) == []


def test_untracked_entries_are_linked_into_a_fresh_worktree(tmp_path: Path) -> None:
    """Data and local configs the repo does not track are in every worktree state, as
    links; a directory holding a file the state writes is made real down to it, so the
    write never reaches the live repo; bytecode is never linked."""
    from envbisect.agent import actuate_remote
    from tests.helpers_run import commit_all, git, init_repo

    repo = init_repo(tmp_path / "repo")
    (repo / "train.py").write_text("print(1)\n")
    (repo / ".gitignore").write_text("data/\n")
    head = commit_all(repo, "first")
    (repo / "data" / "cfg").mkdir(parents=True)
    (repo / "data" / "x.jsonl").write_text("{}\n")
    (repo / "data" / "cfg" / "knob.txt").write_text("live\n")
    (repo / "local.yaml").write_text("lr: 1\n")
    (repo / "__pycache__").mkdir()
    wt = tmp_path / "wt"
    knob = str(wt / "data" / "cfg" / "knob.txt")
    out = actuate_remote.apply(
        {"worktrees": [[str(repo), head, str(wt)]], "swaps": [{"path": knob, "sha256": None}]},
        put=lambda _t, _c: None,
        record=lambda _r, _p: None,
    )
    assert out["failure"] is None
    assert (wt / "local.yaml").is_symlink() and (wt / "local.yaml").read_text() == "lr: 1\n"
    assert (wt / "data").is_dir() and not (wt / "data").is_symlink()
    assert (wt / "data" / "x.jsonl").is_symlink()
    assert not (wt / "data" / "cfg" / "knob.txt").exists()  # the state has it absent
    assert not (wt / "__pycache__").exists()
    assert (repo / "data" / "cfg" / "knob.txt").read_text() == "live\n"
    git(repo, "worktree", "remove", "--force", str(wt))
    assert (repo / "data" / "x.jsonl").read_text() == "{}\n"
