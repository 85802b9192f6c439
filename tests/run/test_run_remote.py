"""End-to-end runs on a remote target: a real sshd on 127.0.0.1, then the fake ``pct exec``.

The actuators act on the far side through ``envbisect.agent.actuate_remote``: the overlay
venv is built there by uv, worktrees are added there, loose files are swapped there after
journaling. The far side is this machine (the only one a test has), so the user's repo,
files and venv can be fingerprinted before and after. ``env HOME=...`` as the innermost
layer keeps the remote session dir inside the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from helpers_ssh import (  # the same module object as test_transport_ssh's: one sshd
    SshServer,
    sshd_server,  # noqa: F401 - a pytest fixture, used by name
)

from envbisect.cli import cli
from envbisect.model.session import Session
from tests.helpers_run import SLOWDOWN, Scenario, file_entry, pkg, resign, run_workload, store_blob

pytestmark = pytest.mark.slow


def _chain(sc: Scenario, ssh: SshServer) -> list[str]:
    home = sc.tmp / "far-home"
    home.mkdir(exist_ok=True)
    return ["--via", ssh.via, "--via", "pct exec 200 --", "--via", f"env HOME={home}"]


def _remote_root(sc: Scenario) -> Path:
    [root] = (sc.tmp / "far-home" / ".envbisect").glob("session-*")
    return root


def _run(sc: Scenario, ssh: SshServer, *extra: str, smoke: tuple[str, ...]) -> tuple[Any, Any]:
    out = sc.tmp / "result.json"
    argv = [
        "run",
        "--config",
        str(sc.config),
        "--python",
        sc.python,
        "--session",
        str(sc.tmp / "session"),
        "--json",
        str(out),
        "--bad",
        str(sc.bad),
        *_chain(sc, ssh),
        *extra,
        "--",
        *smoke,
    ]
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    return res, json.loads(out.read_text()) if out.exists() else {}


def _threshold(sc: Scenario) -> str:
    probe = sc.tmp / "probe"
    probe.mkdir(exist_ok=True)
    (probe / "train.py").write_text((sc.repo / "train.py").read_text())
    # This interpreter has no ebwork: the speed of the fast state, whatever the target has.
    return f"{run_workload(sys.executable, probe / 'train.py') / SLOWDOWN**0.5:.0f}"


def _reset(sc: Scenario) -> Any:
    res = CliRunner().invoke(cli, ["reset", "--session", str(sc.tmp / "session")])
    assert res.exit_code == 0, res.output
    return res


def test_package_culprit_is_found_in_a_venv_built_on_the_target(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==3.0", "ebonly==1.0")  # the user's current (slow) environment
    git = sc.git_entry(sc.commits[0])
    sc.write(
        good={"packages": {"ebwork": pkg("1.0")}, "env": {"KEEP": "1"}, "git": git},
        bad={
            "packages": {"ebwork": pkg("3.0"), "ebonly": pkg("1.0")},
            "env": {"KEEP": "2"},
            "git": git,
        },
        loose_good=b"lr = 0.1\n",
        loose_bad=b"lr = 0.2\n",
    )
    before = sc.fingerprint()
    res, doc = _run(
        sc,
        sshd_server,
        "--until-ktoks",
        _threshold(sc),
        smoke=("python", str(sc.repo / "train.py")),
    )
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["packages:ebwork"]
    # 4 units: endpoints + binary isolation + confirming the culprit; then ebwork's one
    # release between 1.0 and 3.0 (2.0), built on the target too
    releases = [t for t in doc["trials"] if t["purpose"] == "narrow: releases of ebwork"]
    assert 3 <= len(doc["trials"]) - len(releases) <= 2 + 2 + 2
    assert len(releases) <= 1
    assert doc["not_bisected"] == {}
    # The venvs were built under the remote session dir, by uv on the far side.
    root = _remote_root(sc)
    venvs = list((root / "venvs").iterdir())
    assert venvs and all((v / ".envbisect-ready").exists() for v in venvs)
    assert sc.fingerprint() == before
    # reset removes the remote venvs too
    out = _reset(sc).output
    assert f"removed {root}/venvs" in out
    assert not (root / "venvs").exists()
    assert sc.fingerprint() == before


def test_versions_the_target_cannot_get_are_one_message_before_any_trial(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
) -> None:
    """The pre-check asks the target's own uv (its paths, its network, its cache)."""
    from envbisect.model.needs import SourcesMissing

    sc = Scenario(tmp_path)
    sc.venv("ebwork==2.0")
    git = sc.git_entry(sc.commits[0])
    sc.write(
        good={"packages": {"ebwork": pkg("0.5"), "ebonly": pkg("1.0")}, "git": git},
        bad={"packages": {"ebwork": pkg("2.0"), "ebextra": pkg("9.9")}, "git": git},
        loose_good=b"lr = 0.1\n",
        loose_bad=b"lr = 0.1\n",
    )
    with pytest.raises(SourcesMissing) as info:
        _run(sc, sshd_server, smoke=("python", str(sc.repo / "train.py")))
    line = str(info.value)
    assert line.startswith(f"{sc.config}: 2 package versions the run needs are not available")
    assert "ebextra==9.9, ebwork==0.5 (looked at: " in line and "by uv on the target" in line
    assert "ebonly" not in line and "\n" not in line  # ebonly 1.0 is in find-links
    assert not (sc.tmp / "session" / "trials").exists() or not list(
        (sc.tmp / "session" / "trials").iterdir()
    )


def test_file_culprit_is_swapped_on_the_target_and_restored(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0")
    git = sc.git_entry(sc.commits[0])
    knob = sc.repo / "knob.txt"
    knob.write_text(f"{SLOWDOWN}\n")  # the user's edit since good, uncommitted
    sc.write(
        good={"git": git, "env": {}},
        bad={"git": git, "env": {"EB_OTHER": "1"}},
        loose_good=b"lr = 0.1\n",
        loose_bad=b"lr = 0.2\n",
    )
    # knob.txt comes on top of the scenario's loose file: its good content only as a blob
    for side, entry in (
        ("good", store_blob(sc.mdir, b"1\n")),
        ("bad", file_entry(f"{SLOWDOWN}\n".encode())),
    ):
        path = sc.mdir / f"{side}.yaml"
        data = yaml.safe_load(path.read_text())
        data["files"][str(knob)] = entry
        path.write_text(yaml.safe_dump(data))
        resign(path)
    before = sc.fingerprint()
    res, doc = _run(
        sc,
        sshd_server,
        "--until-ktoks",
        _threshold(sc),
        smoke=("python", str(sc.repo / "train.py")),
    )
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == [f"files:{knob}"]
    assert 3 <= len(doc["trials"]) <= 2 + 2 + 2  # 3 units
    # The swaps went through the remote journal, and every one was restored.
    journal = [json.loads(x) for x in (_remote_root(sc) / "journal.jsonl").read_text().splitlines()]
    swapped = {e["id"] for e in journal if e["op"] == "swap"}
    assert swapped and swapped == {e["id"] for e in journal if e["op"] == "restored"}
    assert {e["path"] for e in journal if e["op"] == "swap"} >= {str(knob)}
    assert not (tmp_path / "session" / "journal.jsonl").exists()  # nothing swapped here
    assert knob.read_text() == f"{SLOWDOWN}\n"
    assert sc.fingerprint() == before


def test_git_culprit_is_narrowed_in_worktrees_on_the_target(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0")
    sc.commit("docs")
    slow = sc.commit("more work per token", knob=f"{SLOWDOWN}\n")
    sc.commit("docs again")
    sc.write(
        good={"git": sc.git_entry(sc.commits[0]), "env": {}},
        bad={"git": sc.git_entry(sc.commits[-1]), "env": {"EB_OTHER": "1"}},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    threshold = _threshold(sc)
    before = sc.fingerprint()
    cwd = os.getcwd()
    os.chdir(sc.repo)  # the smoke command is relative: it runs in the state's worktree
    try:
        res, doc = _run(sc, sshd_server, "--until-ktoks", threshold, smoke=("python", "train.py"))
    finally:
        os.chdir(cwd)
    assert res.return_value == 0, res.output
    [culprit] = doc["culprits"]
    assert culprit["unit"] == f"git:{sc.repo}"
    assert culprit["commit"] == slow
    # 2 endpoints + isolating 1 of 2 units + confirming + narrowing 3 commits
    assert len(doc["trials"]) <= 2 + 2 + 2 + 2
    # the worktrees lived under the remote session dir (added by the agent, not from here)
    # and are gone
    worktrees = _remote_root(sc) / "worktrees"
    assert worktrees.is_dir() and not list(worktrees.glob("*/train.py"))
    events = Session.existing(tmp_path / "session").events()
    assert not [e for e in events if e["type"] == "worktree"]
    assert [e["root"] for e in events if e["type"] == "remote"] == [str(_remote_root(sc))]
    assert sc.fingerprint() == before


def test_without_uv_on_the_target_packages_are_not_bisected_and_say_why(
    tmp_path: Path,
) -> None:
    """A chain whose far PATH has no uv (the target venv has none either): said plainly."""
    sc = Scenario(tmp_path)
    sc.venv("ebwork==3.0")
    home = tmp_path / "far-home"
    home.mkdir()
    sc.write(
        good={"packages": {"ebwork": pkg("1.0")}, "env": {}},
        bad={"packages": {"ebwork": pkg("3.0")}, "env": {"EB_SLOW": str(SLOWDOWN)}},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    before = sc.fingerprint()
    out = tmp_path / "result.json"
    argv = [
        "run",
        "--config",
        str(sc.config),
        "--python",
        sc.python,
        "--session",
        str(tmp_path / "session"),
        "--json",
        str(out),
        "--bad",
        str(sc.bad),
        "--via",
        f"env PATH=/usr/bin:/bin HOME={home}",
        "--",
        sc.python,
        str(sc.repo / "train.py"),
    ]
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    doc = json.loads(out.read_text())
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    assert "uv is not available on the target" in doc["not_bisected"]["packages:ebwork"]
    assert sc.fingerprint() == before


def test_an_env_unit_set_here_too_is_said_on_the_far_side(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found as a user (sixth session): run from a shell that holds the bad state's variable
    (``MY_FLAG=1 envbisect run --via ssh …``), the far process never got it. The state's
    variables went as a difference from this machine's environment, and the ssh login on
    the far side holds none of it: the bad endpoint was "not faithful: env unset"."""
    monkeypatch.setenv("EB_SLOW", str(SLOWDOWN))  # here as in the bad state
    sc = Scenario(tmp_path)
    sc.venv("ebwork==3.0")
    sc.write(
        good={"packages": {"ebwork": pkg("3.0")}, "env": {}},
        bad={"packages": {"ebwork": pkg("3.0")}, "env": {"EB_SLOW": str(SLOWDOWN)}},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    res, doc = _run(sc, sshd_server, smoke=(sc.python, str(sc.repo / "train.py")))
    assert res.return_value == 0, (res.output, doc.get("message"))
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]


def test_builtin_smoke_gets_the_per_trial_environment_on_the_far_side(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The drafter shipped on stdin sees the state's variables (set and unset) over ssh+pct."""
    from envbisect.run.launch import SmokeCommand, run_once
    from envbisect.transport import Transport

    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # here, and unset by the state
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    far = tmp_path / "far-cache"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(far)
    transport = Transport.from_specs([sshd_server.via, "pct exec 200 --", "env OMP_NUM_THREADS=5"])
    m = run_once(
        SmokeCommand(drafter_params={"preset": "tiny", "device": "cpu", "steps": 2, "warmup": 1}),
        transport=transport,
        python=sys.executable,
        env=env,
        cwd=None,
        timeout_s=300,
        log_dir=tmp_path / "trial",
        name="run-1",
    )
    assert m.ok, (m.failure, (tmp_path / "trial" / "run-1.stderr").read_text()[-2000:])
    seen = m.result["env"]
    assert seen["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert seen["TORCHINDUCTOR_CACHE_DIR"] == str(far)
    assert "OMP_NUM_THREADS" not in seen  # unset by the state although the chain set it
    # the local result file path is not sent: the result came back on the channel
    assert not list((tmp_path / "trial").glob("*.result.json"))


def _spawn(sc: Scenario, ssh: SshServer, *extra: str) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "envbisect",
        "run",
        "--config",
        str(sc.config),
        "--python",
        sc.python,
        "--bad",
        str(sc.bad),
        "--session",
        str(sc.tmp / "session"),
        *_chain(sc, ssh),
        *extra,
        "--",
        "python",
        str(sc.repo / "train.py"),
    ]
    env = {**os.environ, "EB_TOKENS": "20000"}  # trials long enough to be caught mid-way
    return subprocess.Popen(
        argv,
        env=env,
        stdout=open(sc.tmp / "run.out", "wb"),  # noqa: SIM115 - closed with the process
        stderr=open(sc.tmp / "run.err", "wb"),  # noqa: SIM115
    )


@pytest.mark.parametrize("then", ["reset", "resume"])
def test_kill_9_with_a_file_swapped_on_the_target_then_reset_or_resume(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
    then: str,
) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0")
    sc.write(
        good={"env": {}},
        bad={"env": {"EB_SLOW": str(SLOWDOWN)}},
        loose_good=b"lr = 0.1\n",
        loose_bad=b"lr = 0.2\n",
    )
    before = sc.fingerprint()
    proc = _spawn(sc, sshd_server)
    deadline = time.monotonic() + 120
    while sc.loose.read_bytes() != b"lr = 0.1\n":
        assert proc.poll() is None, (tmp_path / "run.err").read_text()
        assert time.monotonic() < deadline, "no swap seen"
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert sc.loose.read_bytes() == b"lr = 0.1\n"  # left swapped on the target
    if then == "reset":
        out = _reset(sc).output
        assert f"restored {sc.loose} (via " in out
    else:
        resumed = _spawn(sc, sshd_server, "--resume", "--json", str(tmp_path / "result.json"))
        assert resumed.wait(timeout=300) == 0, (tmp_path / "run.err").read_text()
        doc = json.loads((tmp_path / "result.json").read_text())
        assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    assert sc.fingerprint() == before


def test_the_targets_own_load_is_read_there_warned_and_sizes_the_threads(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
) -> None:
    """Issue 47: a remote run looks at the target's /proc (through every layer), not this
    machine's: with one of its cores kept busy it warns at the start, naming the process,
    and --cpu-threads auto gives every trial the free cores, as a local run does."""
    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0")
    git = sc.git_entry(sc.commits[0])
    sc.write(
        good={"env": {}, "git": git},
        bad={"env": {"EB_SLOW": str(SLOWDOWN), "EB_OTHER": "1"}, "git": git},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    threshold = _threshold(sc)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        res, doc = _run(
            sc, sshd_server, "--until-ktoks", threshold, smoke=("python", str(sc.repo / "train.py"))
        )
    finally:
        busy.kill()
        busy.wait()
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"]
    cores = os.cpu_count() or 1
    if cores > 2:
        pytest.skip(f"one busy core of {cores} is under the warning's bar")
    # The target's /proc names the busy process (this machine's other work may add to it).
    warned = re.search(r"warning: (\d) of \d cores (?:is|are) \d+% busy \((.*)\)", res.output)
    assert warned is not None, res.output
    assert f"pid {busy.pid} " in warned.group(2), res.output
    assert re.search(r"every trial runs with OMP_NUM_THREADS=1 and MKL_NUM_THREADS=1", res.output)
    assert any(n.startswith("at the start: ") for n in doc["notes"]), doc["notes"]


def test_without_python_the_recorded_interpreter_is_used_when_the_target_has_it(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
) -> None:
    """Issue 47: through --via, a run that names no --python uses the interpreter the bad
    manifest recorded, checked by running it there; one the target lacks is said in one
    line before anything runs."""
    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0")
    git = sc.git_entry(sc.commits[0])
    version = ".".join(map(str, sys.version_info[:3]))
    python = {"executable": sc.python, "version": version}
    sc.write(
        good={"env": {}, "git": git, "python": python},
        bad={"env": {"EB_SLOW": str(SLOWDOWN)}, "git": git, "python": python},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    argv = [
        "run", "--config", str(sc.config), "--session", str(sc.tmp / "session"),
        "--bad", str(sc.bad), *_chain(sc, sshd_server), "--until-ktoks", _threshold(sc),
        "--report", str(tmp_path / "r.md"), "--", "python", str(sc.repo / "train.py"),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0, res.output
    assert f"--python {sc.python}" in (tmp_path / "r.md").read_text()
    gone = {"executable": str(tmp_path / "gone" / "bin" / "python"), "version": version}
    sc.write(
        good={"env": {}, "git": git, "python": gone},
        bad={"env": {"EB_SLOW": str(SLOWDOWN)}, "git": git, "python": gone},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", *argv], capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert f"the interpreter {sc.bad} recorded ({gone['executable']}) does not run" in line
    assert "give --python PATH" in line
