"""Foreign manifests are reviewed, own ones are not (envbisect.model.trust); git without side
effects. Each attack plants a canary that the attacker's code would create."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from envbisect.cli import cli, main
from envbisect.model import trust
from envbisect.model.errors import TrustError
from envbisect.model.manifest import Manifest
from tests.helpers_run import Scenario, commit_all, git, make_foreign, store_blob


def _run(
    sc: Scenario, *extra: str, smoke: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "envbisect",
            "run",
            "--config",
            str(sc.config),
            "--python",
            sys.executable,
            "--session",
            str(sc.tmp / "session"),
            "--bad",
            str(sc.bad),
            "--until-ktoks",
            "12k",
            "--repeats",
            "1",
            "--metric-regex",
            "([0-9.]+) tok/s",  # the smoke below prints its figure as a log line
            *extra,
            "--",
            *(smoke or (sys.executable, "-c", "print('1 tok/s')")),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=sc.tmp,
        timeout=300,
    )


def _scenario(tmp_path: Path, bad: dict[str, Any], good: dict[str, Any] | None = None) -> Scenario:
    sc = Scenario(tmp_path)
    sc.write(good=good or {}, bad=bad, loose_good=b"a\n", loose_bad=b"a\n")
    make_foreign(sc.good, sc.bad)
    return sc


def _payload(tmp_path: Path) -> tuple[Path, Path]:
    """A sitecustomize.py that leaves a canary when any Python starts with its dir on
    PYTHONPATH; returns (its dir, the canary)."""
    evil = tmp_path / "evil"
    evil.mkdir()
    canary = tmp_path / "PWNED"
    (evil / "sitecustomize.py").write_text(f"open({str(canary)!r}, 'a').write('x')\n")
    return evil, canary


def _refused(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("envbisect: error: ") and "Traceback" not in proc.stderr
    for word in words:
        assert word in last, last
    return last


def test_code_loading_env_vars_of_a_foreign_manifest_are_refused_then_trust_runs_them(
    tmp_path: Path,
) -> None:
    evil, canary = _payload(tmp_path)
    env = {
        "PYTHONPATH": str(evil),
        "LD_PRELOAD": str(evil / "x.so"),
        "BROWSER": f"touch {canary}",
        "PYTHONWARNINGS": "error::antigravity.X",
        "BASH_ENV": str(evil / "rc"),
        "OMP_NUM_THREADS": "1",
        "EB_OWN_KNOB": "1",
        "CXX": f"sh -c 'touch {canary}'",  # run by inductor on every CPU compile
        "HOME": str(evil),  # moves Python's user site: a planted .pth there runs
    }
    sc = _scenario(tmp_path, bad={"env": env})
    last = _refused(
        _run(sc),
        "not made by you",
        "env PYTHONPATH",
        "env LD_PRELOAD",
        "env BROWSER",
        "env PYTHONWARNINGS",
        "env BASH_ENV",
        "env EB_OWN_KNOB: not on the list of env vars known to load no code",
        "env CXX: not on the list",
        "env HOME: not on the list",
        f"--trust {sc.bad}",
    )
    assert "OMP_NUM_THREADS" not in last
    assert not canary.exists()
    assert '"type": "trial"' not in (tmp_path / "session" / "log.jsonl").read_text()
    # --trust names the manifest: the user accepted it, and then it does run.
    proc = _run(sc, "--fresh", "--trust", str(sc.bad))
    assert "not made by you" not in proc.stderr
    assert "note: trusted with --trust" in proc.stderr
    assert canary.exists(), proc.stderr


def test_own_manifests_need_no_trust(tmp_path: Path) -> None:
    evil, canary = _payload(tmp_path)
    sc = _scenario(tmp_path, bad={"env": {"PYTHONPATH": str(evil)}})
    for path in (sc.good, sc.bad):
        signed = trust.sign(Manifest(sections=yaml.safe_load(path.read_text())))
        path.write_text(signed.to_yaml())
    proc = _run(sc)
    assert "not made by you" not in proc.stderr
    # Changing one byte of a signed manifest makes it foreign again.
    text = sc.bad.read_text().replace(str(evil), str(evil) + "x")
    sc.bad.write_text(text)
    _refused(_run(sc, "--fresh"), "env PYTHONPATH")


def test_a_key_that_is_not_private_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "own-config"))
    trust.sign(Manifest(sections={"meta": {}}))
    key = trust.key_path()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    key.chmod(0o644)
    with pytest.raises(TrustError, match="must be yours and private"):
        trust.is_own(Manifest(sections={"meta": {"signature": "hmac-sha256:00"}}))
    key.chmod(0o600)
    real = key.with_name("elsewhere")
    key.rename(real)
    key.symlink_to(real)  # never followed
    with pytest.raises(TrustError, match="cannot read the manifest key"):
        trust.is_own(Manifest(sections={"meta": {"signature": "hmac-sha256:00"}}))


def test_xdg_config_home_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert trust.key_path() == tmp_path / "cfg" / "envbisect" / "manifest.key"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/ignored")
    assert trust.key_path() == Path.home() / ".config" / "envbisect" / "manifest.key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("scheme", ["file", "http"])
def test_a_package_from_a_direct_url_is_refused_before_anything_is_fetched(
    tmp_path: Path, scheme: str
) -> None:
    served = tmp_path / "served"
    served.mkdir()
    port = _free_port()
    log = tmp_path / "http.log"
    with log.open("w") as fh:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "http.server",
                str(port),
                "--bind",
                "127.0.0.1",
                "--directory",
                str(served),
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        url = (
            f"http://127.0.0.1:{port}/evil-1.0.tar.gz"
            if scheme == "http"
            else (served / "evil").as_uri()
        )
        pkg = {
            "version": "1.0",
            "installer": "pip",
            "editable": False,
            "direct_url": {"url": url, "dir_info": {}},
        }
        sc = _scenario(tmp_path, bad={"packages": {"evil": pkg}})
        _refused(_run(sc), f"packages evil: installs from {url}")
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert "GET" not in log.read_text()
    # diff always shows where a package comes from, and marks it for a foreign manifest.
    res = CliRunner().invoke(cli, ["diff", str(sc.good), str(sc.bad)])
    assert f"packages evil: installs from {url}" in res.output
    assert f"source index → {url}" in res.output


def test_a_pth_file_of_a_foreign_manifest_is_refused(tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    site = tmp_path / "etc" / "site"
    site.mkdir(parents=True)
    pth = site / "zz-evil.pth"
    sc.write(good={}, bad={}, loose_good=b"a\n", loose_bad=b"a\n")
    make_foreign(sc.good, sc.bad)
    bad = yaml.safe_load(sc.bad.read_text())
    bad["files"][str(pth)] = store_blob(sc.mdir, b"import os; os.system('touch PWNED')\n")
    sc.bad.write_text(yaml.safe_dump(bad))
    cfg = yaml.safe_load(sc.config.read_text())
    cfg["files"].append(f"{site}/*.pth")  # in scope: only trust stands in the way
    sc.config.write_text(yaml.safe_dump(cfg))
    _refused(_run(sc), f"files {pth}: a file Python or the loader runs at start-up")
    assert not pth.exists()


def _hooked_repo(sc: Scenario) -> Path:
    canary = sc.tmp / "HOOK-RAN"
    hook = sc.repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {canary}\n")
    hook.chmod(0o755)
    monitor = sc.tmp / "fsmonitor.sh"
    monitor.write_text(f"#!/bin/sh\ntouch {canary}.fsmonitor\n")
    monitor.chmod(0o755)
    git(sc.repo, "config", "core.fsmonitor", str(monitor))
    return canary


def test_a_repo_with_hooks_is_listed_and_worktrees_never_run_them(tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    first = sc.commits[0]
    second = sc.commit("second", readme="x")
    canary = _hooked_repo(sc)
    sc.write(
        good={"git": sc.git_entry(first)},
        bad={"git": sc.git_entry(second)},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    make_foreign(sc.good, sc.bad)
    _refused(_run(sc), f"git {sc.repo}: a repo with hooks post-checkout; core.fsmonitor set")
    proc = _run(sc, "--fresh", "--trust", str(sc.bad), "--trust", str(sc.good))
    assert "not made by you" not in proc.stderr, proc.stderr
    log = (tmp_path / "session" / "log.jsonl").read_text()
    assert '"type": "trial"' in log or '"type":"trial"' in log.replace(" ", ""), proc.stderr
    assert not canary.exists() and not Path(f"{canary}.fsmonitor").exists()


def test_a_repo_git_refuses_as_unsafe_is_said_as_such(tmp_path: Path) -> None:
    from envbisect.agent import actuate_remote

    if os.geteuid() != 0:
        pytest.skip("needs root to make a repo owned by another user")
    repo = tmp_path / "theirs"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "f").write_text("x")
    head = commit_all(repo, "one")
    for p in [repo, *repo.rglob("*")]:
        os.lchown(p, 65534, 65534)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    os.environ.clear()
    os.environ.update(env)
    out = actuate_remote.op_inspect({"commits": [[str(repo), head]]})
    assert out["commits"] == [False]
    assert "dubious ownership" in out["unsafe"][str(repo)]
    from envbisect.model.plan import Facts
    from envbisect.sections.git import GitRealizer

    facts = Facts.from_answer(
        {"commits": [[str(repo), head]], "revlists": [], "dirs": [], "exists": []},
        {**out, "revlists": [], "dirs": [], "exists": []},
    )

    class Ctx:
        def facts(self) -> Facts:
            return facts

    why = GitRealizer().blocker(Ctx(), str(repo), {"head": head}, {"head": head})  # type: ignore[arg-type]
    assert why is not None and "refuses the repo as unsafe" in why and "not in that repo" not in why


def _diff(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return int(info.value.code or 0), capsys.readouterr().out


def test_diff_marks_code_loading_entries_of_a_foreign_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sc = _scenario(tmp_path, bad={"env": {"LD_PRELOAD": "/x.so", "EB_SLOW": "8"}})
    code, out = _diff(["diff", str(sc.good), str(sc.bad)], capsys)
    assert code == 1
    assert "env LD_PRELOAD: an env var that loads code" in out
    assert "env EB_SLOW: not on the list of env vars known to load no code" in out
    code, out = _diff(["diff", "--format", "json", str(sc.good), str(sc.bad)], capsys)
    doc = json.loads(out)
    assert sorted(r["key"] for r in doc["review"]["can_run_code"]) == ["EB_SLOW", "LD_PRELOAD"]
    # The same manifests, signed by this user: nothing to mark.
    for path in (sc.good, sc.bad):
        path.write_text(trust.sign(Manifest(sections=yaml.safe_load(path.read_text()))).to_yaml())
    code, out = _diff(["diff", str(sc.good), str(sc.bad)], capsys)
    assert "LD_PRELOAD: an env var" not in out


def _canary_package(where: Path, canary: Path) -> Path:
    """A source tree whose in-tree PEP 517 backend leaves ``canary`` when any installer
    builds it (needs no index: the backend requires nothing)."""
    where.mkdir(parents=True)
    (where / "pyproject.toml").write_text(
        "[build-system]\nrequires = []\nbuild-backend = 'backend'\nbackend-path = ['.']\n"
        "[project]\nname = 'evil'\nversion = '1.0'\n"
    )
    (where / "backend.py").write_text(
        f"open({str(canary)!r}, 'a').write('built')\n"
        "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
        "def build_wheel(wd, config_settings=None, metadata_directory=None):\n"
        "    raise SystemExit('canary package: never installs')\n"
    )
    return where


@pytest.mark.parametrize("escape", ["..", "%2e%2e", "%252e%252e"])
def test_a_url_that_only_looks_under_a_configured_index_is_reviewed(
    tmp_path: Path, escape: str
) -> None:
    """``<index>/../x`` is not under the index: a real uv build of a real backend would run."""
    canary = tmp_path / "BUILT"
    _canary_package(tmp_path / "elsewhere" / "evil", canary)
    sc = Scenario(tmp_path)
    url = f"{sc.index.as_uri()}/{escape}/elsewhere/evil"
    assert trust._from_index(sc.index.as_uri() + "/ok/pkg.whl", [sc.index.as_uri()])
    pkg = {"version": "1.0", "installer": "uv", "direct_url": {"url": url, "dir_info": {}}}
    sc.write(good={}, bad={"packages": {"evil": pkg}}, loose_good=b"a\n", loose_bad=b"a\n")
    make_foreign(sc.good, sc.bad)
    _refused(_run(sc), f"packages evil: installs from {url} (not a configured index)")
    assert not canary.exists()
    if escape == "%252e%252e":
        return  # decoded twice it escapes too: refused, though uv decodes only once
    # The attack is real: with --trust the trial's uv builds that URL, and the backend runs.
    proc = _run(sc, "--fresh", "--trust", str(sc.bad))
    assert canary.exists(), proc.stderr
