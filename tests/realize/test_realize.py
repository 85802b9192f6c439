"""The plan builder (``envbisect.realize.plan``): which parts a state's plan holds, and in
which order the section realizers add them. No I/O: the target's answers are given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envbisect import sections
from envbisect.model.manifest import Manifest
from envbisect.model.plan import Context, Facts, Plan, Sandbox
from envbisect.model.target import TargetEnv
from envbisect.realize.plan import make_plan, realizers
from envbisect.sections.git import worktree_name
from tests.helpers_run import file_entry, pkg

REPO = "/src/proj"
GOOD_HEAD = "a" * 40
BAD_HEAD = "b" * 40
SITE = "/opt/py/lib/python3.12/site-packages"
SCRIPT = f"{REPO}/train.py"  # in the repo: written into its worktree
CONF = "/etc/proj/app.conf"  # outside every repo: swapped in place
DATA = "/data/set"
OLD_DATA = "/archive/set-v1"

GOOD = Manifest(
    sections={
        "meta": {"label": "good"},
        "packages": {"ebwork": pkg("1.0")},
        "git": {REPO: {"head": GOOD_HEAD, "branch": "main", "dirty": False}},
        "files": {SCRIPT: file_entry(b"good script\n"), CONF: file_entry(b"good conf\n")},
        "env": {"FOO": "1", "BAR": "x", "PATH": "/good/bin"},
        "caches": {"inductor": {"path": "/home/u/.cache/ind", "exists": True, "files": 0}},
        "data": {DATA: {"size": 10}},
    }
)
BAD = Manifest(
    sections={
        "meta": {"label": "bad"},
        "packages": {"ebwork": pkg("2.0")},
        "git": {REPO: {"head": BAD_HEAD, "branch": "main", "dirty": False}},
        "files": {SCRIPT: file_entry(b"bad script\n"), CONF: file_entry(b"bad conf\n")},
        "env": {"FOO": "2", "BAR": None, "PATH": "/bad/bin"},
        "caches": {"inductor": {"path": "/home/u/.cache/ind", "exists": True, "files": 7}},
        "data": {DATA: {"size": 11}},
    }
)
CHANGED = [
    ("packages", "ebwork"),
    ("git", REPO),
    ("files", SCRIPT),
    ("files", CONF),
    ("env", "FOO"),
    ("env", "BAR"),
    ("env", "PATH"),
    ("caches", "inductor"),
    ("data", DATA),
]

# The target has the good state's ebwork installed (its files listed, so it can be hidden).
TARGET = TargetEnv(
    python="/opt/py/bin/python",
    base="/opt/py",
    version="3.12.0",
    sites=(SITE,),
    dists={"ebwork": {"name": "ebwork", "version": "1.0", "location": SITE, "files": ["w.py"]}},
)
SANDBOX = Sandbox(
    root="/sb/session",
    trial="/sb/session/trials/007",
    origin=Path(f"{REPO}/scripts"),  # the user ran the command inside the repo
    cwd=None,
    path="/usr/bin",
    in_venv=False,
)


def _context(dirs: dict[str, bool] | None = None) -> Context:
    facts = Facts(sha256={}, commits={}, revlists={}, dirs=dirs or {}, exists={})
    return Context(
        good=GOOD,
        bad=BAD,
        python=TARGET.python,
        facts=lambda: facts,
        target=lambda: TARGET,
        blob=lambda _m, entry: Path("/blobs") / str(entry.sha256),
        blob_places=lambda _m: "/blobs",
        env_holds=lambda _k, _v: False,
        uv_missing=lambda: False,
        data_map={DATA: OLD_DATA},
    )


def _plan(side: Manifest, **ctx: Any) -> Plan:
    """The plan of the state where every change has ``side``'s value."""
    values = {(s, k): (side, side.section(s).get(k)) for s, k in CHANGED}
    return make_plan(_context(**ctx), SANDBOX, values, {"HOME": "/home/u", "BAR": "outer"})


def test_realizers_come_in_plan_order() -> None:
    order = list(realizers())
    assert order == ["packages", "git", "files", "env", "caches", "data"]
    assert tuple(order) == sections.PLAN_ORDER  # the one table, not a number per module


def test_the_bad_state_plan_has_every_part() -> None:
    plan = _plan(BAD, dirs={"/home/u/.cache/ind": True})
    assert plan.failure is None
    # packages: an overlay venv installing the bad version and hiding the target's one.
    assert plan.venv is not None
    assert plan.venv.path.startswith("/sb/session/venvs/")
    assert plan.venv.install == ("ebwork==2.0",)
    assert plan.venv.excluded == {SITE: ("w.py",)}
    assert plan.python == f"{plan.venv.path}/bin/python"
    # git: one worktree at the bad commit, under the session dir.
    worktree = f"/sb/session/worktrees/{worktree_name(REPO, BAD_HEAD)}"
    assert plan.worktrees == ((REPO, BAD_HEAD, worktree),)
    # files (after git): the script lands in the worktree, the conf is swapped in place.
    swaps = {s.key: s for s in plan.swaps}
    assert swaps[SCRIPT].path == f"{worktree}/train.py"
    assert swaps[CONF].path == CONF
    assert swaps[SCRIPT].sha256 == BAD.section("files")[SCRIPT]["sha256"]
    assert swaps[CONF].blob == Path("/blobs") / str(BAD.section("files")[CONF]["sha256"])
    # the cwd moves into the worktree.
    assert plan.cwd == Path(worktree) / "scripts"
    assert plan.env["PWD"] == f"{worktree}/scripts"
    # env (after packages): its values win, PATH included; BAR is unset.
    assert plan.env["FOO"] == "2"
    assert "BAR" not in plan.env
    assert plan.env["PATH"] == "/bad/bin"
    assert plan.env["VIRTUAL_ENV"] == plan.venv.path
    assert plan.env["HOME"] == "/home/u"  # the environment trials start from
    # caches: the warm recorded dir copied into the trial (it still holds files).
    assert [(c.name, c.dest, c.src, c.fill) for c in plan.caches] == [
        ("inductor", "/sb/session/trials/007/caches/inductor", "/home/u/.cache/ind", False)
    ]
    assert plan.env["TORCHINDUCTOR_CACHE_DIR"] == "/sb/session/trials/007/caches/inductor"
    # data: the bad state's data is where it is (no rewrite), named in the environment.
    assert plan.env["ENVBISECT_DATA_0"] == DATA
    # ... mapped to itself, so that a dataset inside a repo is never the worktree's copy
    assert plan.path_map == ((REPO, worktree), (DATA, DATA))


def test_the_good_state_plan_uses_the_target_and_the_mapped_data() -> None:
    plan = _plan(GOOD, dirs={"/home/u/.cache/ind": True})
    assert plan.failure is None
    assert plan.venv is None  # the target already has ebwork 1.0
    assert plan.python == TARGET.python
    worktree = f"/sb/session/worktrees/{worktree_name(REPO, GOOD_HEAD)}"
    assert plan.worktrees == ((REPO, GOOD_HEAD, worktree),)
    assert plan.env["FOO"] == "1" and plan.env["BAR"] == "x" and plan.env["PATH"] == "/good/bin"
    # A cold cache: a fresh empty dir of the trial.
    assert [(c.name, c.src) for c in plan.caches] == [("inductor", None)]
    # data_map: the old dataset replaces the path, longest prefixes first.
    assert plan.env["ENVBISECT_DATA_0"] == OLD_DATA
    assert plan.path_map == ((REPO, worktree), (DATA, OLD_DATA))
    assert plan.map_argv(["python", f"{DATA}/x.bin", f"{REPO}/train.py"]) == [
        "python",
        f"{OLD_DATA}/x.bin",
        f"{worktree}/train.py",
    ]


def test_a_warm_cache_whose_files_are_gone_is_filled_by_a_run() -> None:
    plan = _plan(BAD, dirs={"/home/u/.cache/ind": False})
    assert [(c.src, c.fill) for c in plan.caches] == [(None, True)]


def test_a_failing_part_stops_the_plan_before_later_parts() -> None:
    values = {(s, k): (BAD, BAD.section(s).get(k)) for s, k in CHANGED}
    values[("git", REPO)] = (BAD, {"head": None})
    plan = make_plan(_context(), SANDBOX, values, {})
    assert plan.failure == f"build: git {REPO}: the state has no commit"
    assert plan.venv is not None  # packages came first
    assert plan.worktrees == () and plan.swaps == () and plan.caches == ()
    assert "FOO" not in plan.env


def test_the_plan_is_data_the_executor_can_send() -> None:
    ops = _plan(BAD).ops()
    assert [w[0] for w in ops["worktrees"]] == [REPO]
    assert sorted(s["key"] for s in ops["swaps"]) == sorted([SCRIPT, CONF])
    assert [c["name"] for c in ops["caches"]] == ["inductor"]
