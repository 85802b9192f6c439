"""A user's own repo, the command typed the way users type it (issue 21): from the repo's
parent, from inside the repo, with absolute paths, from elsewhere. Real git, real uv venv."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers_run import resign
from tests.helpers_user_repo import METRIC, UserRepo, envbisect, make_user_repo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> UserRepo:
    return make_user_repo(tmp_path_factory.mktemp("user"))


def _run(
    w: UserRepo, cwd: Path, session: str, *command: str, env: dict[str, str] | None = None
) -> tuple[int, dict, str]:
    res = envbisect(
        cwd,
        "run",
        "--config", str(w.config),
        "--good", str(w.good),
        "--bad", str(w.bad),
        "--python", str(w.python),
        "--session", str(w.ws / ".envbisect" / session),
        "--metric-regex", METRIC,
        "--until", "50%",
        "--json", "-",
        "--report", str(w.ws / f"report-{session}.md"),
        "--", *command,
        env=env,
    )  # fmt: skip
    doc = json.loads(res.stdout[res.stdout.index("{") :]) if "{" in res.stdout else {}
    return res.returncode, doc, res.stdout + res.stderr


def _assert_found_the_slow_commit(w: UserRepo, code: int, doc: dict, out: str) -> None:
    assert code == 0, out
    assert [c["unit"] for c in doc["culprits"]] == [f"git:{w.repo}"], out
    assert doc["culprits"][0]["commit"] == w.slow_commit, out
    failed = [t for t in doc["trials"] if t.get("failure")]
    assert failed == [], out


@pytest.mark.parametrize(
    ("where", "command"),
    [
        ("parent", ("python", "repo/train.py", "--data", "repo/data/x.jsonl")),
        ("parent", ("python3", "repo/train.py", "--data", "data/prompts.jsonl")),  # README
        ("parent", ("python3", "repo/train.py", "--data=repo/data/x.jsonl")),
        ("repo", ("python", "train.py", "--data", "data/x.jsonl")),
        ("elsewhere", ("python", "{repo}/train.py", "--data", "{repo}/data/x.jsonl")),
        ("parent", ("bash", "-c", "python repo/train.py --data repo/data/x.jsonl")),
        ("parent", ("python", "-m", "repo.train", "--data", "repo/data/x.jsonl")),
        ("repo", ("python3", "-m", "train", "--data", "data/x.jsonl")),
    ],
)
def test_every_form_of_the_command_runs_every_trial_and_finds_the_commit(
    world: UserRepo, where: str, command: tuple[str, ...], request: pytest.FixtureRequest
) -> None:
    cwd = {"parent": world.ws, "repo": world.repo, "elsewhere": world.ws.parent}[where]
    argv = [w.format(repo=world.repo) for w in command]
    session = "s-" + "".join(c if c.isalnum() else "-" for c in request.node.callspec.id)
    code, doc, out = _run(world, cwd, session, *argv)
    _assert_found_the_slow_commit(world, code, doc, out)


def test_a_command_that_cannot_start_is_stopped_after_the_good_endpoint(world: UserRepo) -> None:
    """A typo in the script's name: one trial, the command's own error line, exit 2."""
    code, doc, out = _run(world, world.ws, "s-typo", "python", "repo/trian.py", "--data", "x")
    assert code == 2, out
    assert "the smoke command fails in the good state: " in out
    assert "can't open file" in out and "trian.py" in out
    assert f"cwd: {world.ws}" in out and f"interpreter: {world.python}" in out
    assert "trial 2" not in out
    for word in ("unfaithful", "does not reproduce", "outside the recorded", "Culprit"):
        assert word not in out


def test_a_missing_data_file_is_said_in_the_commands_words(world: UserRepo) -> None:
    code, _doc, out = _run(
        world, world.ws, "s-nodata", "python", "repo/train.py", "--data", "no.jsonl"
    )
    assert code == 2, out
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'no.jsonl'" in out
    assert "trial 2" not in out


def test_a_command_whose_output_has_no_metric_stops_with_its_last_line(world: UserRepo) -> None:
    code, _doc, out = _run(world, world.ws, "s-nometric", "python", "-c", "print('hello')")
    assert code == 2, out
    assert "gives no throughput in the good state" in out and "hello" in out


@pytest.mark.parametrize(
    ("knob", "said", "verdict"),
    [
        ("EB_CRASH_IF_OTHER", "EB_OTHER needs", "bad"),
        ("EB_QUIET_IF_OTHER", "no metric", "unresolved"),
    ],
)
def test_a_culprit_whose_confirmation_failed_is_not_named(
    world: UserRepo, knob: str, said: str, verdict: str
) -> None:
    """Everything but the isolated repo crashes, or prints no number: nothing shows that
    reverting the repo restores speed, so the run names no culprit and says why. A state
    with no number is unresolved (as check says 125), never counted as slow."""
    session = f"s-unconfirmed-{knob}"
    code, doc, out = _run(
        world, world.ws, session, "python", "repo/train.py", "--data", "repo/data/x.jsonl",
        env={knob: "1"},
    )  # fmt: skip
    assert code == 1, out
    assert doc["outcome"] == "unconfirmed" and doc["culprits"] == []
    assert "No single culprit (unconfirmed): git:" in out
    assert "the confirmation with everything but it" in out and said in out
    [without] = [t for t in doc["trials"] if t["applied"] == ["env:EB_OTHER"]]
    assert without["verdict"] == verdict
    report = (world.ws / f"report-{session}.md").read_text()
    assert "No single culprit (unconfirmed)" in report


def test_check_says_125_with_the_commands_own_line(world: UserRepo) -> None:
    res = envbisect(
        world.ws, "check", "--config", str(world.config), "--until-ktoks", "1k",
        "--python", str(world.python), "--", "python3", "repo/trian.py",
    )  # fmt: skip
    assert res.returncode == 125, res.stdout + res.stderr
    assert "the smoke command fails in the current state: " in res.stdout
    assert "can't open file" in res.stdout and f"argv: {world.python} repo/trian.py" in res.stdout


def _print_command(w: UserRepo, cwd: Path, *flags: str) -> str:
    res = envbisect(
        cwd, "run", "--config", str(w.config), "--good", str(w.good), "--bad", str(w.bad),
        "--session", str(w.ws / ".envbisect" / "s-print"), *flags, "--print-command",
        "--", "python", "repo/train.py", "--data", "repo/data/x.jsonl",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_print_command_shows_the_good_states_whole_command(world: UserRepo) -> None:
    """Without --python: the interpreter the manifests recorded; the cwd where typed; the
    paths in the good state's worktree; the environment the trial sets."""
    line = _print_command(world, world.ws)
    wt = f"{world.ws}/.envbisect/s-print/worktrees/repo-"
    assert line.startswith(f"cd {world.ws} && env ")
    assert f" {world.python} {wt}" in line and "/train.py --data " in line
    assert f"VIRTUAL_ENV={world.python.parent.parent}" in line
    assert line.endswith(f"{world.commits[0][:12]}/data/x.jsonl")


def test_a_relative_python_is_resolved_once_where_it_was_typed(world: UserRepo) -> None:
    line = _print_command(world, world.ws, "--python", "../target/bin/python")
    assert f" {world.ws}/../target/bin/python " in line
    assert f"PATH={world.ws}/../target/bin:" in line


def test_without_python_a_missing_recorded_interpreter_is_said(
    world: UserRepo, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(world.bad.read_text().replace(str(world.python), "/nowhere/bin/python"))
    res = envbisect(
        world.ws, "run", "--good", str(world.good), "--bad", str(bad), "--", "python", "x.py"
    )
    assert res.returncode == 2
    assert "interpreter the bad manifest recorded (/nowhere/bin/python) is not here" in res.stderr


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> UserRepo:
    return make_user_repo(tmp_path_factory.mktemp("listed"), list_model=True)


@pytest.mark.parametrize(
    ("where", "command"),
    [
        ("parent", ("python3", "repo/train.py", "--data", "repo/data/x.jsonl")),
        ("repo", ("python", "train.py", "--data", "data/x.jsonl")),
        ("elsewhere", ("python", "{repo}/train.py", "--data", "{repo}/data/x.jsonl")),
    ],
)
def test_a_listed_model_file_is_narrowed_to_its_commit_and_hunk_in_every_form(
    listed: UserRepo, where: str, command: tuple[str, ...], request: pytest.FixtureRequest
) -> None:
    """The field's shape: commits and a hand patch in one model file. Typed from the
    parent, from inside the repo and with absolute paths, the run names the commit and the
    hunk, not the file."""
    cwd = {"parent": listed.ws, "repo": listed.repo, "elsewhere": listed.ws.parent}[where]
    argv = [w.format(repo=listed.repo) for w in command]
    session = "h-" + "".join(c if c.isalnum() else "-" for c in request.node.callspec.id)
    code, doc, out = _run(listed, cwd, session, *argv)
    assert code == 0, out
    (culprit,) = doc["culprits"]
    assert culprit["unit"] == f"files:{listed.repo / 'model.py'}", out
    slow = listed.commits[2]
    hunk = culprit["hunk"]
    assert hunk["commit"] == slow and not hunk["uncommitted"], out
    assert hunk["hunk"] == "@@ -1,1 +1,1 @@", out
    assert hunk["hunk_text"] == "@@ -1,1 +1,1 @@\n-WORK = 1\n+WORK = 8\n", out
    line = next(x for x in out.splitlines() if x.startswith("Culprit: "))
    assert line.startswith(f"Culprit: commit {slow[:7]} "), line
    assert "repo/model.py hunk @@ -1,1 +1,1 @@" in line, line
    assert [t for t in doc["trials"] if t.get("failure")] == [], out


def test_a_bad_manifest_edited_to_a_commit_the_repo_lacks_names_the_commit(
    world: UserRepo, tmp_path: Path
) -> None:
    """Someone edited the bad manifest: its repo's head is a commit the repo does not hold,
    and nothing else differs. The run says which commit, and does not blame the good state."""
    import yaml

    good = yaml.safe_load(world.good.read_text())
    bad = yaml.safe_load(world.bad.read_text())
    bad["env"] = good["env"]
    bad["git"][str(world.repo)]["head"] = "deadbeef" * 5
    edited = tmp_path / "bad-edited.yaml"
    edited.write_text(yaml.safe_dump(bad))
    resign(edited)
    res = envbisect(
        world.ws,
        "run",
        "--config", str(world.config),
        "--good", str(world.good),
        "--bad", str(edited),
        "--python", str(world.python),
        "--session", str(world.ws / ".envbisect" / "s-edited"),
        "--metric-regex", METRIC,
        "--until", "50%",
        "--", "python", "repo/train.py", "--data", "repo/data/x.jsonl",
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "nothing to bisect: no change can be realized here: " in out
    assert "commit deadbeefdead is not in that repo" in out
    assert "good state cannot be realized" not in out


def test_from_inside_the_repo_a_config_one_folder_up_typed_relative(world: UserRepo) -> None:
    """Found as a user: ``cd repo && envbisect run --config ../envbisect.yaml …`` made the
    session ``repo/../.envbisect/session``; its worktrees, reported by the state check as
    ``.envbisect/session/…``, read "at no commit" and both endpoints were unfaithful."""
    rel = os.path.relpath(world.config, world.repo)
    assert rel.startswith("..")
    res = envbisect(
        world.repo,
        "run", "--config", rel, "--good", str(world.good), "--bad", str(world.bad),
        "--python", str(world.python), "--metric-regex", METRIC, "--until", "50%",
        "--fresh", "--json", "-",
        "--", "python", "train.py", "--data", "data/x.jsonl",
    )  # fmt: skip
    out = res.stdout + res.stderr
    doc = json.loads(res.stdout[res.stdout.index("{") :]) if "{" in res.stdout else {}
    _assert_found_the_slow_commit(world, res.returncode, doc, out)
    assert f"session {world.ws / '.envbisect' / 'session'}" in res.stderr, out
