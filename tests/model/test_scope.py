"""A manifest says values; envbisect.yaml says what a run may touch (envbisect.model.scope).

Each attack is a foreign manifest naming a canary under tmp_path outside the config's paths:
the run must refuse it with its key, exit 2, one line, before the first trial, and leave the
canary as it was.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbisect.diff import diff_manifests
from envbisect.model import scope
from envbisect.model.config import Config
from envbisect.model.guard import check_run, realized_changes
from envbisect.model.manifest import Manifest
from tests.helpers_run import Scenario, manifest, resign, store_blob


def _run(sc: Scenario, *extra: str) -> subprocess.CompletedProcess[str]:
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
            *extra,
            "--",
            sys.executable,
            "-c",
            f"open({str(sc.tmp / 'TRIAL-RAN')!r}, 'w').write('ran')",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=sc.tmp,
        timeout=120,
    )


def _scenario(tmp_path: Path, files: dict[str, tuple[bytes, bytes]], **extra: Any) -> Scenario:
    """Good/bad manifests whose ``files:`` put (good, bad) contents at the given keys."""
    sc = Scenario(tmp_path)
    sc.write(good={}, bad={}, loose_good=b"a\n", loose_bad=b"b\n")
    good = yaml.safe_load(sc.good.read_text())
    bad = yaml.safe_load(sc.bad.read_text())
    for key, (g, b) in files.items():
        good["files"][key] = store_blob(sc.mdir, g)
        bad["files"][key] = store_blob(sc.mdir, b)
    for section, (g_value, b_value) in extra.items():
        good[section] = g_value
        bad[section] = b_value
    sc.good.write_text(yaml.safe_dump(good))
    sc.bad.write_text(yaml.safe_dump(bad))
    resign(sc.good, sc.bad)
    return sc


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _refused(proc: subprocess.CompletedProcess[str], sc: Scenario, words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("envbisect: error: ") and words in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (sc.tmp / "TRIAL-RAN").exists()


@pytest.mark.parametrize("how", ["absolute", "dotdot"])
def test_a_files_key_outside_the_config_is_refused_before_the_first_trial(
    tmp_path: Path, how: str
) -> None:
    canary = tmp_path / "outside" / "canary.txt"
    canary.parent.mkdir()
    canary.write_text("keep me\n")
    before = _sha(canary)
    etc = tmp_path / "etc"
    key = str(canary) if how == "absolute" else f"{etc}/../outside/canary.txt"
    sc = _scenario(tmp_path, {key: (b"evil-good\n", b"evil-bad\n")})
    proc = _run(sc)
    _refused(proc, sc, f"files {key}: outside the paths {sc.config}")
    assert _sha(canary) == before


def test_a_relative_files_key_is_refused(tmp_path: Path) -> None:
    sc = _scenario(tmp_path, {"victim.txt": (b"x\n", b"y\n")})
    (tmp_path / "victim.txt").write_text("keep\n")
    proc = _run(sc)
    _refused(proc, sc, "files victim.txt: outside the paths")
    assert (tmp_path / "victim.txt").read_text() == "keep\n"


def test_a_symlink_under_the_config_is_not_swapped(tmp_path: Path) -> None:
    secret = tmp_path / "private.key"
    secret.write_text("PRIVATE\n")
    secret.chmod(0o600)
    sc = _scenario(tmp_path, {})
    sc.loose.unlink()
    sc.loose.symlink_to(secret)
    proc = _run(sc)
    _refused(proc, sc, f"files {sc.loose}: is a symlink; only regular files are swapped")
    assert secret.read_text() == "PRIVATE\n" and oct(secret.stat().st_mode & 0o777) == "0o600"
    assert not list((tmp_path / "session").rglob("*private*"))


def test_dev_zero_under_files_does_not_hang(tmp_path: Path) -> None:
    sc = _scenario(tmp_path, {"/dev/zero": (b"x\n", b"y\n")})
    cfg = yaml.safe_load(sc.config.read_text())
    cfg["files"].append("/dev/zero")  # even when the config names it
    sc.config.write_text(yaml.safe_dump(cfg))
    proc = _run(sc)
    _refused(proc, sc, "files /dev/zero: is a device; only regular files are swapped")


def test_a_cache_path_outside_the_config_is_not_copied(tmp_path: Path) -> None:
    loot = tmp_path / "home" / ".ssh"
    loot.mkdir(parents=True)
    (loot / "id_ed25519").write_text("PRIVATE\n")
    cache = {"inductor": {"path": str(loot), "exists": True, "files": 1, "bytes": 8}}
    sc = _scenario(tmp_path, {}, caches=(cache, cache))
    proc = _run(sc)
    _refused(proc, sc, f"caches inductor at {loot}: outside the paths")
    assert not list((tmp_path / "session").rglob("id_ed25519"))


def test_a_data_key_outside_the_config_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "data.jsonl"
    sc = _scenario(
        tmp_path,
        {},
        data=({str(other): {"size": 1, "records": 1}}, {str(other): {"size": 2, "records": 2}}),
    )
    cfg = yaml.safe_load(sc.config.read_text())
    cfg["data_map"] = {str(tmp_path / "mine.jsonl"): str(tmp_path / "old.jsonl")}
    sc.config.write_text(yaml.safe_dump(cfg))
    proc = _run(sc)
    _refused(proc, sc, f"data {other}: outside the paths")


def test_a_snapshots_own_file_arguments_widen_the_scope_of_its_own_manifest(
    tmp_path: Path,
) -> None:
    """``snapshot --file X`` records X: the user's own manifest may swap X; a foreign
    manifest claiming the same recorded scope may not."""
    from envbisect.model import trust

    extra = tmp_path / "extra.cfg"
    extra.write_text("x\n")
    config = Config(root=tmp_path, files=())
    good = Manifest(
        sections={
            "meta": {"label": "g", "scope": {"files": [str(extra)]}},
            "files": {str(extra): {"sha256": "a" * 64, "size": 1, "blob": "a" * 64}},
        }
    )
    bad = Manifest(
        sections={
            "meta": {"label": "b", "scope": {"files": [str(extra)]}},
            "files": {str(extra): {"sha256": "b" * 64, "size": 1, "blob": "b" * 64}},
        }
    )
    diff = diff_manifests(good, bad)
    with pytest.raises(Exception, match="outside the paths"):
        check_run(config, good, bad, diff)
    own_good, own_bad = trust.sign(good), trust.sign(bad)
    assert check_run(config, own_good, own_bad, diff_manifests(own_good, own_bad)) == []


def test_glob_match_keeps_star_within_one_component() -> None:
    assert scope.glob_match("/p/*.py", "/p/a.py")
    assert not scope.glob_match("/p/*.py", "/p/sub/a.py")
    assert scope.glob_match("/p/**/*.py", "/p/sub/deep/a.py")
    assert scope.glob_match("/p/**/*.py", "/p/a.py")
    assert not scope.is_plain_absolute("/p/../etc/passwd")
    assert not scope.is_plain_absolute("p/a")
    assert not scope.is_plain_absolute("//p/a")


# ---- property: nothing outside the config is ever planned ------------------------------------

ROOT = "/srv/proj"
_names = st.sampled_from(["a", "b", "..", ".", "", "etc", "proj", "x.pth", "passwd", "*"])
_INSIDE = {
    "files": [f"{ROOT}/a.cfg", f"{ROOT}/conf/x/y.pth", f"{ROOT}/repo/train.py"],
    "git": [f"{ROOT}/repo"],
    "data": [f"{ROOT}/data/part-0", f"{ROOT}/data"],
    "caches": [f"{ROOT}/cache", f"{ROOT}/cache/sub"],
}
_outside = st.one_of(
    st.lists(_names, min_size=0, max_size=4).map(lambda ps: "/" + "/".join(ps)),
    st.lists(_names, min_size=1, max_size=4).map(lambda ps: ROOT + "/" + "/".join(ps)),
    st.lists(_names, min_size=1, max_size=3).map("/".join),  # relative
    st.text(min_size=1, max_size=12),
)


def _paths(section: str) -> st.SearchStrategy[str]:
    """Mostly paths the config allows for ``section`` (so accepted plans are seen too)."""
    return st.one_of(*([st.sampled_from(_INSIDE[section])] * 12), _outside)


_file = st.fixed_dictionaries(
    {"sha256": st.sampled_from(["a" * 64, "b" * 64]), "size": st.integers(0, 9)}
).map(lambda d: {**d, "blob": d["sha256"]})
_cache = st.fixed_dictionaries(
    {
        "path": _paths("caches"),
        "exists": st.booleans(),
        "files": st.integers(0, 3),
        "bytes": st.just(8),
    }
)


def _side() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "meta": st.just({"label": "m", "scope": {"files": ["/"], "repos": ["/"]}}),
            "files": st.dictionaries(_paths("files"), _file, max_size=4),
            "data": st.dictionaries(_paths("data"), st.just({"size": 1}), max_size=2).map(
                lambda d: {k: {"size": v["size"] + (len(k) % 3)} for k, v in d.items()}
            ),
            "caches": st.dictionaries(st.sampled_from(["inductor", "triton"]), _cache, max_size=2),
            "git": st.dictionaries(
                _paths("git"),
                st.fixed_dictionaries({"head": st.sampled_from(["1" * 40, "2" * 40])}),
                max_size=2,
            ),
        }
    )


CONFIG = Config(
    root=Path(ROOT),
    files=(f"{ROOT}/*.cfg", f"{ROOT}/conf/**"),
    repos=(f"{ROOT}/repo",),
    data=(f"{ROOT}/data",),
    caches={"inductor": Path(f"{ROOT}/cache")},
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(good=_side(), bad=_side())
def test_random_manifests_never_plan_a_path_outside_the_config(
    good: dict[str, Any], bad: dict[str, Any]
) -> None:
    g = Manifest(sections=good, path=Path("/nowhere/g.yaml"))
    b = Manifest(sections=bad, path=Path("/nowhere/b.yaml"))
    diff = diff_manifests(g, b)  # diff takes any manifest
    allowed = scope.Scope.of_config(CONFIG, default_caches=False)
    try:
        check_run(CONFIG, g, b, diff, local=False)
    except Exception as exc:  # refused: it must be one of ours, naming a key
        from envbisect.model.errors import ScopeError, TrustError

        assert isinstance(exc, (ScopeError, TrustError)), exc
        assert "\n" not in str(exc)
        return
    # Accepted: every path the run's realizers could touch lies inside the config.
    for t in scope.touched(g, b, realized_changes(diff)):
        if t.section == "caches" and t.path in allowed.caches:
            continue
        assert allowed.allows(t.section, t.path) or _default_cache(t.path), t
        assert os.path.normpath(t.path) == t.path and t.path.startswith("/")
    # And the plan the realizers make of the all-bad and the all-good state says the same.
    for side in (g, b):
        plan = _plan(g, b, side, diff)
        for swap in plan.swaps:
            inside_worktree = swap.path.startswith("/sandbox/")
            assert inside_worktree or allowed.allows("files", swap.path), swap
        for cache in plan.caches:
            assert cache.dest.startswith("/sandbox/"), cache
            assert (
                cache.src is None
                or allowed.allows("caches", cache.src)
                or _default_cache(cache.src)
            ), cache
        for repo, _head, path in plan.worktrees:
            assert allowed.allows("git", repo) and path.startswith("/sandbox/"), repo
        for old, new in plan.path_map:
            # a path mapped to itself (a data: file kept out of a worktree) moves nothing
            kept = new == old or new.startswith("/sandbox/")
            assert kept or new in CONFIG.data_map.values(), (old, new)


def _plan(g: Manifest, b: Manifest, side: Manifest, diff: Any) -> Any:
    """The realizers' plan of the state where every realized change has ``side``'s value
    (no I/O: facts answered as if every commit, dir and path were there)."""
    from envbisect.model.plan import Context, Facts, Sandbox
    from envbisect.realize.plan import make_plan

    facts = Facts(sha256={}, commits={}, revlists={}, dirs={}, exists={})
    ctx = Context(
        good=g,
        bad=b,
        python="/usr/bin/python3",
        facts=lambda: facts,
        target=lambda: None,  # type: ignore[arg-type,return-value]
        blob=lambda _m, _e: None,
        blob_places=lambda _m: "",
        env_holds=lambda _k, _v: False,
        uv_missing=lambda: False,
        data_map=CONFIG.data_map,
    )
    sandbox = Sandbox(
        root="/sandbox/session",
        trial="/sandbox/session/trials/001",
        origin=Path("/sandbox/cwd"),
        cwd=None,
        path="/usr/bin",
        in_venv=False,
    )
    values = {
        (c.section, c.key): (side, side.section(c.section).get(c.key))
        for c in realized_changes(diff)
        if c.section != "packages"
    }
    return make_plan(ctx, sandbox, values, {})


def _default_cache(path: str) -> bool:
    from envbisect.agent.collector import default_caches

    return any(path.startswith(os.path.abspath(p)) for p, _ in default_caches().values())


def test_the_recorded_scope_of_a_foreign_manifest_counts_for_nothing(tmp_path: Path) -> None:
    """The property test's manifests claim ``scope: {files: [/]}``; without the user's
    signature that claim is ignored (the canary at /etc/passwd-like path is refused)."""
    g = manifest(tmp_path / "g.yaml", meta={"label": "g", "scope": {"files": ["/"]}})
    assert scope.Scope.recorded(Manifest(sections=yaml.safe_load(g.read_text()))).files == ("/",)
    from envbisect.model.guard import run_scope

    sc = run_scope(CONFIG, [Manifest(sections=yaml.safe_load(g.read_text()))])
    assert not sc.allows("files", "/etc/passwd")


def test_snapshot_of_dev_zero_under_files_ends(tmp_path: Path) -> None:
    (tmp_path / "envbisect.yaml").write_text("files: [/dev/zero]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "snapshot", "-o", str(tmp_path / "m.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "error [files]: /dev/zero: not a regular file" in proc.stderr
