"""``snapshot --as-of`` / ``run --good-as-of``: a real git history with dated reflog entries,
a real uv venv whose packages were installed on both sides of the time (install times set
on the dist-info with os.utime to when they happened), a uv cache, a local package index
whose files carry upload times, files and a dataset modified on both sides.

The world is built in time order: everything dated before ``T`` is done, a real snapshot of
that state is taken (the reference the reconstruction is checked against), then the
changes dated after ``T`` are made.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from envbisect.cli import cli, main
from envbisect.model import manifest as mf
from envbisect.model.config import Config
from envbisect.model.errors import ReconstructError
from envbisect.snapshot import take_snapshot
from envbisect.snapshot.reconstruct import AGENT, Confidence, rebuild
from envbisect.snapshot.when import iso, parse_as_of
from envbisect.transport import Transport
from tests.helpers_run import WORKLOAD, build_wheel, run_workload, simple_index, uv

DAY = 86400.0
NOW = time.time()
T0 = NOW - 20 * DAY  # the environment and repo are set up
T = NOW - 10 * DAY  # the time asked about: training was fast
T2 = NOW - 5 * DAY  # the changes


def _git(repo: Path, *args: str, when: float) -> str:
    stamp = f"@{int(when)} +0000"
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e",
        # Commits *and reflog entries* take the committer date: each is dated when it happens.
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_DATE": stamp,
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def _commit(repo: Path, message: str, when: float) -> str:
    _git(repo, "add", "-A", when=when)
    _git(repo, "commit", "-q", "-m", message, when=when)
    return _git(repo, "rev-parse", "HEAD", when=when)


def _write(path: Path, text: str, when: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (when, when))
    return path


class World:
    """The user's machine, built in time order (see the module docstring)."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp
        self.uv_cache = tmp / "uv-cache"
        monkeypatch.setenv("UV_CACHE_DIR", str(self.uv_cache))
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp / "inductor"))
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp / "triton"))
        monkeypatch.setenv("PIP_CACHE_DIR", str(tmp / "pip-cache"))
        w = tmp / "built"
        slow = 8
        wheel = {
            ("ebwork", "1.0"): build_wheel(w, "ebwork", "1.0", "WORK = 1\n"),
            ("ebwork", "3.0"): build_wheel(w, "ebwork", "3.0", f"WORK = {slow}  # slow build\n"),
            ("ebhelp", "1.0"): build_wheel(w, "ebhelp", "1.0", "X = 1\n"),
            ("eblate", "1.0"): build_wheel(w, "eblate", "1.0", "Y = 1\n"),
            ("eblate", "2.0"): build_wheel(w, "eblate", "2.0", "Y = 2  # same speed\n"),
        }
        self.index = simple_index(
            tmp / "index",
            {
                "ebwork": [(wheel["ebwork", "1.0"], T0 - DAY), (wheel["ebwork", "3.0"], T2 - DAY)],
                "ebhelp": [(wheel["ebhelp", "1.0"], T0 - DAY)],
                # 2.0 was published after the time and installed later still.
                "eblate": [(wheel["eblate", "1.0"], T0 - DAY), (wheel["eblate", "2.0"], T + DAY)],
            },
        )
        self.repo = tmp / "repo"
        self.mdir = tmp / "manifests"
        self.config = tmp / "envbisect.yaml"
        self.venv = tmp / "venv"
        self.python = str(self.venv / "bin" / "python")
        self.train_cfg = tmp / "etc" / "train.cfg"
        self.sched_cfg = tmp / "etc" / "sched.cfg"
        self.data = tmp / "data" / "train.jsonl"
        self.data_old = tmp / "data-old" / "train.jsonl"

    # -- before T ------------------------------------------------------------------------

    def before(self) -> None:
        self.repo.mkdir()
        _git(self.repo, "init", "-q", "-b", "main", when=T0)
        _write(self.repo / "train.py", WORKLOAD, T0)
        _write(self.repo / "knob.txt", "1\n", T0)
        _write(self.repo / "requirements.txt", "ebwork\nebhelp\neblate\n", T0)
        self.a = _commit(self.repo, "workload", T0)
        _write(self.repo / "README", "b\n", T0 + DAY)
        self.b = _commit(self.repo, "readme", T0 + DAY)
        # The day before, the user went back to the first commit to compare: HEAD at T is
        # a, though the last commit before T on main is b.
        _git(self.repo, "checkout", "-q", "--detach", self.a, when=T - DAY)
        subprocess.run([uv(), "venv", "-q", str(self.venv)], check=True)
        self.install("ebwork==1.0", "ebhelp==1.0", "eblate==1.0", when=T0 + 3600)
        _write(self.train_cfg, "lr = 0.1\n", T0)
        _write(self.sched_cfg, "warmup = 100\n", T0)
        rows = "".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(50))
        _write(self.data, rows, T0)
        _write(self.data_old, rows, T0)  # the copy the user kept, named in data_map
        self.config.write_text(
            yaml.safe_dump(
                {
                    "repos": [str(self.repo)],
                    "files": [
                        str(self.train_cfg),
                        str(self.sched_cfg),
                        str(self.repo / "knob.txt"),
                    ],
                    "data": [str(self.data)],
                    "data_map": {str(self.data): str(self.data_old)},
                    "keep_blobs": True,
                    "manifests_dir": str(self.mdir),
                    "index_url": self.index.as_uri(),
                }
            )
        )

    def install(self, *reqs: str, when: float, venv: Path | None = None) -> None:
        """``uv pip install`` from the index, then date the install (and what uv cached)."""
        venv = venv or self.venv
        cached = set(self.uv_cache.glob("archive-v*/*"))
        subprocess.run(
            [
                uv(),
                "pip",
                "install",
                "-q",
                "--python",
                str(venv / "bin" / "python"),
                "--no-deps",
                "--index-url",
                self.index.as_uri(),
                *reqs,
            ],
            check=True,
        )
        for archive in set(self.uv_cache.glob("archive-v*/*")) - cached:
            os.utime(archive, (when, when))
        site = next(venv.glob("lib/python*/site-packages"))
        for req in reqs:
            name, _, version = req.partition("==")
            info = site / f"{name}-{version}.dist-info"
            for path in (info / "INSTALLER", info / "RECORD", info):
                os.utime(path, (when, when))

    def reference(self, *, earlier_copy: bool) -> mf.Manifest:
        """A real snapshot of the state at T; with ``earlier_copy``, one also kept in
        manifests_dir (dated when it was taken), as a user who once ran snapshot has."""
        ref = take_snapshot(Config.load(self.config), Transport(), self.python, label="ref")
        if earlier_copy:
            meta = {**ref.section("meta"), "created": iso(T - DAY / 2)}
            mf.save(mf.Manifest({**ref.sections, "meta": meta}), self.mdir / "earlier.yaml")
        return ref

    # -- after T -------------------------------------------------------------------------

    def after(self) -> None:
        _git(self.repo, "checkout", "-q", "main", when=T2)
        _write(self.repo / "README", "c\n", T2)
        self.c = _commit(self.repo, "readme again", T2)
        self.install("ebwork==3.0", "eblate==2.0", when=T2)
        # The user cleaned eblate out of uv's cache since: no older build of it is kept.
        subprocess.run([uv(), "cache", "clean", "-q", "eblate"], check=True)
        _write(self.sched_cfg, "warmup = 400\n", T2)
        with self.data.open("a") as fh:
            fh.write(json.dumps({"text": "new row"}) + "\n")
        os.utime(self.data, (T2, T2))


def _snapshot_as_of(world: World, when: str, *extra: str) -> tuple[Any, mf.Manifest | None]:
    out = world.tmp / "asof.yaml"
    res = CliRunner().invoke(
        cli,
        [
            "snapshot",
            "--config",
            str(world.config),
            "--python",
            world.python,
            "--as-of",
            when,
            "-o",
            str(out),
            *extra,
        ],
    )
    return res, (mf.load(out) if res.exit_code == 0 else None)


def _confidence(m: mf.Manifest, section: str, key: str) -> tuple[str, str]:
    fact = m.section("reconstructed")["facts"][section][key]
    return fact["confidence"], fact["method"]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    w = World(tmp_path, monkeypatch)
    w.before()
    return w


def test_snapshot_as_of_reconstructs_what_was_there(world: World) -> None:
    ref = world.reference(earlier_copy=True)
    world.after()
    res, rec = _snapshot_as_of(world, iso(T))
    assert res.exit_code == 0, res.output
    assert rec is not None
    # What was really there (the reference snapshot taken at the time).
    assert rec.section("git")[str(world.repo)]["head"] == world.a
    assert ref.section("git")[str(world.repo)]["head"] == world.a
    versions = {k: v["version"] for k, v in rec.section("packages").items()}
    assert versions == {k: v["version"] for k, v in ref.section("packages").items()}
    for path in (world.train_cfg, world.sched_cfg, world.repo / "knob.txt"):
        assert (
            rec.section("files")[str(path)]["sha256"] == ref.section("files")[str(path)]["sha256"]
        )
    assert (
        rec.section("data")[str(world.data)]["fingerprint"]
        == (ref.section("data")[str(world.data)]["fingerprint"])
    )
    # How each was found, and how sure.
    assert _confidence(rec, "git", str(world.repo)) == ("high", "reflog")
    assert _confidence(rec, "packages", "ebhelp") == ("high", "installed-before")
    assert _confidence(rec, "packages", "ebwork") == ("medium", "kept-wheel")
    assert _confidence(rec, "packages", "eblate") == ("low", "resolved")
    assert _confidence(rec, "files", str(world.train_cfg)) == ("high", "unchanged")
    assert _confidence(rec, "files", str(world.sched_cfg)) == ("medium", "earlier-snapshot")
    assert _confidence(rec, "files", str(world.repo / "knob.txt")) == ("high", "repo-commit")
    assert _confidence(rec, "data", str(world.data)) == ("high", "data-map-copy")
    assert _confidence(rec, "env", "*") == ("unknown", "today")
    facts = rec.section("reconstructed")["facts"]
    assert "uv cache holds ebwork 1.0" in facts["packages"]["ebwork"]["evidence"]
    assert "requirements.txt at " + world.a[:12] in facts["packages"]["eblate"]["evidence"]
    assert rec.section("reconstructed")["as_of"] == iso(T)
    assert mf.RECONSTRUCTED_SCHEMA in (world.tmp / "asof.yaml").read_text()
    assert "reconstructed as of " + iso(T) in res.stderr
    assert "packages eblate: low" in res.stderr

    # diff marks the reconstructed facts and their confidence.
    today = world.tmp / "today.yaml"
    mf.save(take_snapshot(Config.load(world.config), Transport(), world.python), today)
    out = CliRunner().invoke(
        cli, ["diff", str(world.tmp / "asof.yaml"), str(today)], standalone_mode=False
    )
    assert out.return_value == 1, out.output
    assert f"reconstructed as of {iso(T)}" in out.output
    assert "good reconstructed (medium, kept-wheel)" in out.output
    assert "good reconstructed (low, resolved)" in out.output
    doc = json.loads(
        CliRunner()
        .invoke(cli, ["diff", "--format", "json", str(world.tmp / "asof.yaml"), str(today)])
        .output
    )
    assert doc["good"]["reconstructed_as_of"] == iso(T)
    notes = {c["key"]: c["note"] for u in doc["units"] for c in u["changes"]}
    assert "good reconstructed (high, reflog)" in notes[str(world.repo)]


def test_a_fresh_clone_and_no_requirements_fall_back_and_say_so(
    world: World, tmp_path: Path
) -> None:
    world.after()
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(world.repo), str(clone)], check=True)
    (world.repo / "requirements.txt").unlink()
    cfg = yaml.safe_load(world.config.read_text())
    cfg.update(repos=[str(clone)], files=[str(world.sched_cfg)], data=[], data_map={})
    world.config.write_text(yaml.safe_dump(cfg))
    res, rec = _snapshot_as_of(world, iso(T))
    assert res.exit_code == 0, res.output
    assert rec is not None
    # The clone's reflog starts today: the last commit before the time on today's HEAD.
    assert rec.section("git")[str(clone)]["head"] == world.b
    assert _confidence(rec, "git", str(clone)) == ("medium", "last-commit-before")
    evidence = rec.section("reconstructed")["facts"]["git"][str(clone)]["evidence"]
    assert "the reflog starts at" in evidence
    assert "a branch checked out then may differ" in evidence
    # No earlier snapshot: the changed file is unknown, today's content taken.
    assert _confidence(rec, "files", str(world.sched_cfg)) == ("unknown", "today")
    assert rec.section("files")[str(world.sched_cfg)]["size"] == len("warmup = 400\n")


def test_an_older_venv_kept_beside_the_target_is_evidence(world: World) -> None:
    old = world.tmp / "venv-old"
    subprocess.run([uv(), "venv", "-q", str(old)], check=True)
    world.install("eblate==1.0", when=T0, venv=old)
    world.after()
    res, rec = _snapshot_as_of(world, iso(T))
    assert res.exit_code == 0, res.output
    assert rec is not None
    assert rec.section("packages")["eblate"]["version"] == "1.0"
    assert _confidence(rec, "packages", "eblate") == ("medium", "kept-wheel")
    evidence = rec.section("reconstructed")["facts"]["packages"]["eblate"]["evidence"]
    assert evidence.startswith("previous venv holds eblate 1.0 since " + iso(T0))
    assert str(old) in evidence


def test_without_requirements_the_newest_release_before_the_time(world: World) -> None:
    world.after()
    cfg = yaml.safe_load(world.config.read_text())
    cfg.update(repos=[])
    world.config.write_text(yaml.safe_dump(cfg))
    res, rec = _snapshot_as_of(world, iso(T))
    assert res.exit_code == 0, res.output
    assert rec is not None
    assert rec.section("packages")["eblate"]["version"] == "1.0"
    fact = rec.section("reconstructed")["facts"]["packages"]["eblate"]
    assert fact["confidence"] == "low"
    assert "the packages installed since, against those installed before" in fact["evidence"]


@pytest.mark.parametrize(
    ("when", "says"),
    [
        ("yesterday-ish", "not a date"),
        (iso(NOW + DAY), "is in the future"),
        (iso(T0 - DAY), "no commit before"),
        # The repo existed (its first commit), the venv's packages not yet.
        (iso(T0 + 60), "the environment did not exist then"),
    ],
)
def test_bad_times_are_one_line_exit_2(
    world: World, when: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["snapshot", "--config", str(world.config), "--python", world.python]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--as-of", when, "-o", str(world.tmp / "x.yaml")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not (world.tmp / "x.yaml").exists()
    # run --good-as-of refuses the same way, before any trial.
    with pytest.raises(SystemExit) as info:
        main(
            [
                "run",
                *argv[1:],
                "--good-as-of",
                when,
                "--until",
                "50%",
                "--session",
                str(world.tmp / "s"),
                "--",
                "python",
                "-c",
                "pass",
            ]
        )
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_parse_as_of_reads_local_and_zoned_times() -> None:
    assert iso(parse_as_of("2026-11-20T09:00Z")) == "2026-11-20T09:00:00Z"
    assert iso(parse_as_of("2026-11-20 09:00+01:00")) == "2026-11-20T08:00:00Z"
    local = parse_as_of("2026-11-20 09:00")
    assert local.utcoffset() is not None
    with pytest.raises(ReconstructError, match="not a date"):
        parse_as_of("20/11/2026")


def test_a_schema_1_manifest_still_loads_and_plain_snapshots_stay_schema_1(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("schema: envbisect/manifest@1\nmeta: {label: old}\npackages: {}\n")
    assert mf.load(old).label == "old"
    assert not mf.load(old).reconstructed
    mf.save(mf.load(old), tmp_path / "again.yaml")
    assert (tmp_path / "again.yaml").read_text().startswith("schema: envbisect/manifest@1\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "schema: envbisect/manifest@2\nreconstructed:\n  facts:\n"
        "    packages: {x: {confidence: sure}}\n"
    )
    with pytest.raises(mf.ManifestError, match="reconstructed.facts.packages.x.confidence"):
        mf.load(bad)


@pytest.mark.slow
def test_run_good_as_of_names_the_upgrade(world: World) -> None:
    world.reference(earlier_copy=True)
    world.after()
    out = world.tmp / "result.json"
    argv = [
        "run",
        "--config",
        str(world.config),
        "--python",
        world.python,
        "--good-as-of",
        iso(T),
        "--until",
        "50%",
        "--session",
        str(world.tmp / "session"),
        "--json",
        str(out),
    ]
    smoke = ["--", "python", str(world.repo / "train.py")]

    def run(*extra: str) -> Any:
        return CliRunner().invoke(
            cli, [*argv, *extra, *smoke], standalone_mode=False, catch_exceptions=False
        )

    # Stopped after the endpoints and one trial (as an interruption would), then resumed.
    first = run("--max-trials", "3")
    assert json.loads(out.read_text())["outcome"] == "aborted", first.output
    assert f"reconstructed as of {iso(T)}" in first.stderr
    written = sorted(world.mdir.glob("good-as-of-*.yaml"))
    assert len(written) == 1
    res = run("--resume")
    doc = json.loads(out.read_text())
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["packages:ebwork"]
    assert doc["culprits"][0]["changes"] == [{"key": "ebwork", "old": "1.0", "new": "3.0"}]
    assert f"good state: {written[0]} (reconstructed when the session started)" in res.stderr
    assert sorted(world.mdir.glob("good-as-of-*.yaml")) == written  # not rebuilt
    assert any("env vars taken as today's, compile caches cold" in n for n in doc["notes"])


@pytest.mark.slow
def test_run_good_as_of_that_is_not_fast_names_the_doubtful_facts(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slowdown is an env var set since: env vars leave no history, so the
    reconstructed good state takes today's value and is slow too; the run says why."""
    # The speed the user remembers: the workload as it ran at the time.
    fast = run_workload(world.python, world.repo / "train.py", env=dict(os.environ))
    world.after()
    cfg = yaml.safe_load(world.config.read_text())
    cfg.update(env=["EB_SLOW"])
    world.config.write_text(yaml.safe_dump(cfg))
    monkeypatch.setenv("EB_SLOW", "8")
    out = world.tmp / "result.json"
    res = CliRunner().invoke(
        cli,
        [
            "run",
            "--config",
            str(world.config),
            "--python",
            world.python,
            "--good-as-of",
            iso(T),
            "--until-ktoks",
            f"{fast / 3:.0f}tok/s",
            "--session",
            str(world.tmp / "session"),
            "--json",
            str(out),
            "--max-trials",
            "4",
            "--",
            "python",
            str(world.repo / "train.py"),
        ],
        standalone_mode=False,
        catch_exceptions=False,
    )
    doc = json.loads(out.read_text())
    assert res.return_value == 1, res.output
    assert doc["outcome"] == "not-reproduced", doc["message"]
    doubtful = [n for n in doc["notes"] if "the reconstructed good state was not good" in n]
    assert len(doubtful) == 1
    assert "env *: unknown (environment variables leave no history" in doubtful[0]
    assert "packages eblate: low" in doubtful[0]


OLD_PYTHONS = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))


def test_the_history_agent_is_python_38_and_stdlib_only(tmp_path: Path) -> None:
    from envbisect.transport.bundle import build_bundle

    ast.parse(build_bundle(AGENT, {}).source, feature_version=(3, 8))
    if not OLD_PYTHONS:
        pytest.skip("no Python 3.8 interpreter on this machine")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main", when=T0)
    _write(repo / "a.txt", "a\n", T0)
    sha = _commit(repo, "a", T0)
    params = {"as_of": T, "repos": [str(repo)], "files": [str(repo / "a.txt")]}
    held = Transport().run_agent(OLD_PYTHONS[0], AGENT, params, timeout_s=60, log_dir=tmp_path)
    assert held["repos"][str(repo)]["head"] == sha
    assert held["repos"][str(repo)]["method"] == "reflog"
    assert held["repos"][str(repo)]["files"][str(repo / "a.txt")]["size"] == 2


# -- the weighing alone, on what an agent could return (no uv, no target) -------------------


def _today() -> mf.Manifest:
    return mf.Manifest(
        {
            "meta": {"label": "today", "created": iso(NOW)},
            "python": {"executable": "/venv/bin/python"},
            "packages": {
                "torch": {"version": "2.13.0", "editable": False},
                "mine": {"version": "0.1", "editable": True},
                "numpy": {"version": "2.3.0", "editable": False},
                "setuptools": {"version": "80.0", "editable": False},
            },
            "torch": {"version": "2.13.0", "git_version": "abc", "cuda": "13.0"},
        }
    )


def _held(**kept: list[dict[str, Any]]) -> dict[str, Any]:
    info = "/venv/lib/python3.11/site-packages/{}.dist-info"
    return {
        "packages": {
            "torch": {"version": "2.13.0", "installed": T2, "dist_info": info.format("torch")},
            "mine": {"version": "0.1", "installed": T2, "dist_info": info.format("mine")},
            "numpy": {"version": "2.3.0", "installed": T2, "dist_info": info.format("numpy")},
            "setuptools": {"version": "80.0", "installed": T0, "dist_info": info.format("st")},
        },
        "kept_wheels": kept,
    }


def test_the_torch_stack_replaced_since_takes_its_kept_build_and_drops_todays_build_facts(
    tmp_path: Path,
) -> None:
    kept = {"torch": [{"version": "2.12.0", "source": "uv cache", "path": "/c/t", "time": T0}]}
    calls: list[tuple[str, str, list[str]]] = []

    def resolver(name: str, text: str, cons: list[str], when: Any) -> dict[str, str]:
        calls.append((name, text, cons))
        return {"numpy": "2.2.0"}

    config = Config(root=tmp_path, manifests_dir=tmp_path)
    rec = rebuild(config, _today(), parse_as_of(iso(T)), _held(**kept), resolver)
    packages = rec.manifest.section("packages")
    assert packages["torch"]["version"] == "2.12.0"
    assert rec.manifest.section("torch") == {"version": "2.12.0", "git_version": None, "cuda": None}
    # No requirements: what was installed since, against what was there before.
    assert calls == [("requirements.in", "numpy\ntorch\n", ["setuptools==80.0"])]
    assert packages["numpy"]["version"] == "2.2.0"
    # An editable install keeps no history: today's, said so.
    assert packages["mine"]["version"] == "0.1"
    facts = {(f.section, f.key): f for f in rec.facts}
    assert facts["packages", "mine"].confidence is Confidence.UNKNOWN
    assert facts["packages", "setuptools"].confidence is Confidence.HIGH


def test_a_resolver_that_fails_leaves_todays_version_as_unknown(tmp_path: Path) -> None:
    def resolver(name: str, text: str, cons: list[str], when: Any) -> dict[str, str]:
        raise ReconstructError("uv pip compile: no index reachable")

    config = Config(root=tmp_path, manifests_dir=tmp_path)
    rec = rebuild(config, _today(), parse_as_of(iso(T)), _held(), resolver)
    assert rec.manifest.section("packages")["numpy"]["version"] == "2.3.0"
    fact = next(f for f in rec.facts if f.key == "numpy")
    assert fact.confidence is Confidence.UNKNOWN
    assert "no index reachable" in fact.evidence
    assert rec.manifest.section("torch")["git_version"] == "abc"  # torch kept: unchanged


def test_a_reconstructed_block_of_the_wrong_type_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: envbisect/manifest@2\nreconstructed: [1, 2]\n")
    with pytest.raises(mf.ManifestError, match="field 'reconstructed' must be a mapping"):
        mf.load(bad)
