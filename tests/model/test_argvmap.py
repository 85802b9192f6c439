"""The user's command in a state: every form of path word names the state's copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbisect.model.argvmap import PathMapper


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """A workspace with a repo (train.py, pkg/mod.py, data/x.jsonl, run.sh) and its worktree."""
    ws = tmp_path / "ws"
    repo = ws / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "pkg").mkdir()
    for name in ("train.py", "pkg/mod.py", "data/x.jsonl", "run.sh"):
        (repo / name).write_text("x\n")
    (ws / "outside.txt").write_text("o\n")
    wt = tmp_path / "sess" / "worktrees" / "repo-abc"
    return {"ws": ws, "repo": repo, "wt": wt}


def _from_parent(w: dict[str, Path]) -> PathMapper:
    return PathMapper(((str(w["repo"]), str(w["wt"])),), str(w["ws"]), str(w["ws"]))


def _from_inside(w: dict[str, Path]) -> PathMapper:
    return PathMapper(((str(w["repo"]), str(w["wt"])),), str(w["repo"]), str(w["wt"]))


def test_relative_paths_from_the_parent_name_the_worktree(world: dict[str, Path]) -> None:
    m, wt = _from_parent(world), world["wt"]
    assert m.argv(["python", "repo/train.py", "--data", "repo/data/x.jsonl"], "/py") == [
        "/py",
        f"{wt}/train.py",
        "--data",
        f"{wt}/data/x.jsonl",
    ]


def test_relative_paths_from_inside_stay_as_typed(world: dict[str, Path]) -> None:
    m = _from_inside(world)
    argv = ["python3", "train.py", "--data", "data/x.jsonl", "--lr", "0.1"]
    assert m.argv(argv, "/py") == ["/py", *argv[1:]]


def test_a_relative_path_leaving_the_repo_from_inside_becomes_absolute(
    world: dict[str, Path],
) -> None:
    m = _from_inside(world)
    assert m.argv(["python", "train.py", "../outside.txt"]) == [
        "python",
        "train.py",
        str(world["ws"] / "outside.txt"),
    ]


def test_absolute_paths_and_the_opt_equals_form(world: dict[str, Path]) -> None:
    m, repo, wt = _from_parent(world), world["repo"], world["wt"]
    assert m.argv([f"{repo}/train.py", f"--data={repo}/data/x.jsonl", "--data=repo/data"]) == [
        f"{wt}/train.py",
        f"--data={wt}/data/x.jsonl",
        f"--data={wt}/data",
    ]


def test_words_that_are_no_paths_are_left_alone(world: dict[str, Path]) -> None:
    m = _from_parent(world)
    argv = ["python", "-u", "-m", "pkg.mod", "--name", "train", "--url", "http://repo/x", "-"]
    assert m.argv(argv) == argv


def test_pythonpath_entries_map_for_dash_m(world: dict[str, Path]) -> None:
    m, wt = _from_parent(world), world["wt"]
    env = m.env({"PYTHONPATH": f"repo:{world['repo']}/pkg:/usr/lib", "HOME": "/h"})
    assert env == {"PYTHONPATH": f"{wt}:{wt}/pkg:/usr/lib", "HOME": "/h"}


def test_a_shell_c_script_maps_its_path_words_only(world: dict[str, Path]) -> None:
    m, wt = _from_parent(world), world["wt"]
    script = 'cd /tmp && python "repo/train.py" --data repo/data/x.jsonl | tee log.txt'
    out = m.argv(["bash", "-c", script])
    assert out == [
        "bash",
        "-c",
        f'cd /tmp && python "{wt}/train.py" --data {wt}/data/x.jsonl | tee log.txt',
    ]
    assert m.argv(["sh", "-ec", "python repo/train.py"])[2] == f"python {wt}/train.py"


def test_sh_script_is_an_ordinary_word(world: dict[str, Path]) -> None:
    m, wt = _from_parent(world), world["wt"]
    assert m.argv(["sh", "repo/run.sh", "repo/data"]) == ["sh", f"{wt}/run.sh", f"{wt}/data"]
    assert m.argv(["repo/run.sh"]) == [f"{wt}/run.sh"]


def test_a_dataset_inside_the_repo_follows_its_data_map(world: dict[str, Path]) -> None:
    repo, wt = world["repo"], world["wt"]
    data = str(repo / "data" / "x.jsonl")
    m = PathMapper(
        ((data, "/old/x.jsonl"), (str(repo), str(wt))), str(world["ws"]), str(world["ws"])
    )
    assert m.argv(["python", "repo/train.py", "repo/data/x.jsonl", data]) == [
        "python",
        f"{wt}/train.py",
        "/old/x.jsonl",
        "/old/x.jsonl",
    ]


def test_only_a_bare_python_is_replaced_by_the_states_interpreter(world: dict[str, Path]) -> None:
    m = _from_parent(world)
    assert m.argv(["python3.12", "-V"], "/v/bin/python")[0] == "/v/bin/python"
    assert m.argv(["/usr/bin/python3", "-V"], "/v/bin/python")[0] == "/usr/bin/python3"
    assert m.argv(["bash", "-c", "true"], "/v/bin/python")[0] == "bash"


def test_dash_m_from_the_parent_imports_the_states_copy(world: dict[str, Path]) -> None:
    """``python -m repo.pkg.mod`` typed from the parent: the package is imported from the
    worktree (a real interpreter runs the mapped argv), args and ``__main__`` as ``-m``."""
    import subprocess
    import sys

    ws, repo, wt = world["ws"], world["repo"], world["wt"]
    shown = "import sys; print(__name__, __file__, sys.argv[1:], sys.path[0])\n"
    for root in (repo, wt):
        (root / "pkg").mkdir(parents=True, exist_ok=True)
        (root / "pkg" / "__init__.py").write_text("")
        (root / "pkg" / "mod.py").write_text(shown)
    argv = _from_parent(world).argv(["python3", "-u", "-m", "repo.pkg.mod", "--lr", "1"], "/py")
    assert argv[:3] == ["/py", "-u", "-c"] and argv[4:] == ["repo.pkg.mod", "--lr", "1"]
    argv[0] = sys.executable
    out = subprocess.run(argv, cwd=ws, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["__main__", f"{wt}/pkg/mod.py", "['--lr',", "'1']", str(ws)]
    # From inside the repo the cwd is the worktree: -m is left as typed there.
    inside = _from_inside(world).argv(["python", "-m", "pkg.mod"], "/py")
    assert inside == ["/py", "-m", "pkg.mod"]
    # A module outside every moved tree, and a script, are untouched.
    assert _from_parent(world).argv(["python", "-m", "json.tool"], "/py") == [
        "/py",
        "-m",
        "json.tool",
    ]
    assert _from_parent(world).argv(["bash", "-m", "repo.pkg.mod"]) == [
        "bash",
        "-m",
        "repo.pkg.mod",
    ]


def test_a_shell_cd_above_a_repo_is_found_and_one_into_it_is_not() -> None:
    from envbisect.model.argvmap import live_cd

    roots = ["/ws/repo"]
    assert live_cd(["bash", "-c", "cd /ws && python repo/train.py"], roots) == "/ws"
    assert live_cd(["sh", "-lc", "cd /ws/ && python repo/t.py"], roots) == "/ws"
    assert live_cd(["bash", "-c", "cd /ws/repo && python train.py"], roots) is None
    assert live_cd(["bash", "-c", "cd /elsewhere && python t.py"], roots) is None
    assert live_cd(["python", "train.py"], roots) is None
    assert live_cd(["bash", "-c", "cd 'unbalanced"], roots) is None


def test_on_a_target_a_dataset_inside_the_repo_is_the_states_own() -> None:
    """Found as a user through --via ssh to 127.0.0.1: ``python train.py --data
    data/x.jsonl``, typed relative to the repo as the README says for targets, ran the
    worktree's committed dataset in every state, so the grown data "does not reproduce".
    Nothing on this machine is looked at: the target's files are not here."""
    repo, wt = "/far/ws/repo", "/far/home/.envbisect/s/worktrees/repo-abc"
    data, old = f"{repo}/data/x.jsonl", f"{repo}/data/x-v1.jsonl"
    bad = PathMapper(((data, data), (repo, wt)), None, wt)
    argv = ["python", "train.py", "--data", "data/x.jsonl", "--lr", "0.1", "--out=data/o"]
    assert bad.argv(argv) == [
        "python", "train.py", "--data", data, "--lr", "0.1", "--out=data/o",
    ]  # fmt: skip
    good = PathMapper(((data, old), (repo, wt)), None, wt)
    assert good.argv(["python", "train.py", "--data=data/x.jsonl"])[2] == f"--data={old}"
    # no worktree (the repo is not bisected): the command's cwd is no copy, words stay
    plain = PathMapper(((data, old),), None, "/far/home")
    assert plain.argv(["python", "train.py", "--data", "data/x.jsonl"])[3] == "data/x.jsonl"
