"""Package sources: config → ``Sources`` → uv options; versions listed from real simple
indexes (file:// and http://) and find-links directories; overlay venvs installed from the
pinned index; bytecode for a target installed without it."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from envbisect.agent import actuate_remote
from envbisect.model.config import Config
from envbisect.model.listing import available_versions
from envbisect.model.needs import Need, missing_message, missing_needs
from envbisect.model.plan import VenvSpec
from envbisect.model.sources import SourceError, Sources, uv_args
from tests.helpers_run import build_wheel, make_venv, simple_index, tree_hashes, uv


def _config(tmp: Path, text: str) -> Config:
    path = tmp / "envbisect.yaml"
    path.write_text(text)
    return Config.load(path)


def test_config_sources_become_uv_options_in_uv_order(tmp_path: Path) -> None:
    c = _config(
        tmp_path,
        "indexes: [file:///fast/simple, {url: 'file:///main/simple', default: true}]\n"
        "extra_index_urls: [file:///old-extra/simple]\n"
        "find_links: [wheels]\n"
        "index_strategy: unsafe-best-match\n"
        "offline: true\n"
        "pins: {Einops: '0.7.0', tqdm: {index: 'file:///private/simple'}, six: '>=1,<2'}\n",
    )
    s = Sources.from_config(c)
    assert uv_args(s) == [
        "--index",
        "file:///fast/simple",
        "--index",
        "file:///old-extra/simple",
        "--default-index",
        "file:///main/simple",
        "--find-links",
        str(tmp_path / "wheels"),
        "--index-strategy",
        "unsafe-best-match",
        "--offline",
    ]
    # A package bound to an index comes from there alone (uv's explicit index).
    assert uv_args(s, "TQDM") == ["--default-index", "file:///private/simple", "--offline"]
    assert s.pin("einops") is not None and s.pin("einops").specifier == "==0.7.0"  # type: ignore[union-attr]
    assert s.pin("six").allows(Version("1.16")) and not s.pin("six").allows(Version("2.0"))  # type: ignore[union-attr]
    # The older fields alone: index_url is the default index, extras searched before it.
    old = Sources.from_config(
        _config(tmp_path, "index_url: file:///a/simple\nextra_index_urls: [file:///b/simple]\n")
    )
    assert uv_args(old) == ["--index", "file:///b/simple", "--default-index", "file:///a/simple"]
    assert Sources.from_dict(s.as_dict()) == s
    # A local directory is an index too, named by its file:// URL (relative to the file).
    local = Sources.from_config(_config(tmp_path, "indexes: [mirror/simple]\n"))
    assert local.indexes == ((tmp_path / "mirror" / "simple").as_uri(),)


@pytest.fixture
def releases(tmp_path: Path) -> dict[str, Path]:
    """Real wheels of ``ebrel``: finals, a pre-release, a yanked one, one for another
    Python only, one whose Requires-Python excludes every Python here."""
    built = tmp_path / "built"
    w = {v: build_wheel(built, "ebrel", v, f"V = {v!r}\n") for v in ("1.0", "1.1", "2.0rc1", "2.0")}
    cp27 = built / "ebrel-3.0-cp27-cp27mu-manylinux1_x86_64.whl"
    shutil.copy(w["2.0"], cp27)
    future = built / "ebrel-4.0-py3-none-any.whl"
    shutil.copy(w["2.0"], future)
    index = simple_index(
        tmp_path / "simple",
        {"ebrel": [(p, None) for p in (*w.values(), cp27, future)]},
        attrs={
            w["1.1"].name: ' data-yanked="broken upload"',
            future.name: ' data-requires-python="&gt;=3.99"',
        },
    )
    links = tmp_path / "links"
    build_wheel(links, "ebrel", "2.1", "V = '2.1'\n")
    build_wheel(links, "ebother", "9.0", "V = 9\n")
    (links / "ebrel-2.2.tar.gz").write_bytes(b"")  # an sdist counts: uv can build it
    return {"index": index, "links": links}


def test_available_versions_reads_a_file_index_and_a_find_links_dir(
    releases: dict[str, Path],
) -> None:
    s = Sources(default_index=releases["index"].as_uri(), find_links=(str(releases["links"]),))
    assert available_versions("EBRel", s) == [Version(v) for v in ("1.0", "2.0", "2.1", "2.2")]
    assert Version("2.0rc1") in available_versions("ebrel", s, finals_only=False)
    assert Version("1.1") in available_versions("ebrel", s, include_yanked=True)
    # Another interpreter: the py3 wheel with Requires-Python >=3.99 fits 3.99 only.
    four = Sources(default_index=releases["index"].as_uri(), target_python="3.99")
    assert Version("4.0") in available_versions("ebrel", four)
    assert Version("3.0") not in available_versions("ebrel", four)
    assert available_versions("no-such-project", s) == []


def test_index_strategy_and_a_pinned_index_decide_which_index_counts(
    tmp_path: Path, releases: dict[str, Path]
) -> None:
    other = simple_index(
        tmp_path / "other", {"ebrel": [(build_wheel(tmp_path / "o", "ebrel", "5.0", ""), None)]}
    )
    first = Sources(indexes=(other.as_uri(),), default_index=releases["index"].as_uri())
    assert available_versions("ebrel", first) == [Version("5.0")]  # first-index: uv's default
    best = Sources(
        indexes=first.indexes,
        default_index=first.default_index,
        index_strategy="unsafe-best-match",
    )
    assert available_versions("ebrel", best) == [Version(v) for v in ("1.0", "2.0", "5.0")]
    pinned = Config.from_mapping(
        {"indexes": [other.as_uri()], "pins": {"ebrel": {"index": releases["index"].as_uri()}}},
        tmp_path / "envbisect.yaml",
    )
    assert available_versions("ebrel", Sources.from_config(pinned)) == [
        Version("1.0"),
        Version("2.0"),
    ]


@contextlib.contextmanager
def _http(root: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_http_index_is_read_and_an_unreachable_one_is_one_line_without_secrets(
    releases: dict[str, Path],
) -> None:
    with _http(releases["index"]) as url:
        assert available_versions("ebrel", Sources(default_index=url + "/")) == [
            Version("1.0"),
            Version("2.0"),
        ]
        with _http(releases["links"]) as links:
            assert Version("2.1") in available_versions(
                "ebrel", Sources(default_index=url, find_links=(links + "/",))
            )
    dead = Sources(default_index="http://user:hunter2@127.0.0.1:9/simple")
    with pytest.raises(SourceError) as info:
        available_versions("ebrel", dead)
    assert "@127.0.0.1:9/simple/ebrel/: cannot be read (" in str(info.value)
    assert "hunter2" not in str(info.value) and "\n" not in str(info.value)


def test_missing_needs_lists_each_miss_and_spares_what_is_installed_or_on_disk(
    tmp_path: Path, releases: dict[str, Path]
) -> None:
    s = Sources(default_index=releases["index"].as_uri(), find_links=(str(releases["links"]),))
    wheel = next(releases["links"].glob("ebother-*.whl"))
    needs = [
        Need("ebrel", "2.0", "ebrel==2.0"),
        Need("ebrel", "1.1", "ebrel==1.1"),  # yanked: uv installs an exact pin of it
        Need("ebrel", "0.9", "ebrel==0.9"),
        Need("ebrel", "3.0", "ebrel==3.0"),  # only a wheel for another Python
        Need("ebgone", "1.0", "ebgone==1.0"),
        Need("ebhere", "7.0", "ebhere==7.0"),  # in no source, but installed
        Need("ebother", "9.0", f"ebother @ {wheel.as_uri()}"),
        Need("eblost", "1.0", f"eblost @ {(tmp_path / 'eblost-1.0-py3-none-any.whl').as_uri()}"),
    ]
    missing = missing_needs(needs, s, installed={"ebhere": "7.0"}, python="3.11")
    assert sorted(n.text() for n, _ in missing) == [
        "ebgone==1.0",
        "eblost @ " + (tmp_path / "eblost-1.0-py3-none-any.whl").as_uri(),
        "ebrel==0.9",
        "ebrel==3.0",
    ]
    line = missing_message(missing, tmp_path / "envbisect.yaml")
    assert line.startswith(f"{tmp_path / 'envbisect.yaml'}: 4 package versions the run needs")
    assert f"(looked at: default index {releases['index'].as_uri()}, find-links " in line
    assert "\n" not in line


def test_offline_a_version_only_an_http_index_holds_is_a_miss_unless_uv_has_it(
    tmp_path: Path, releases: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    offline = Sources(
        default_index="http://127.0.0.1:9/simple",
        find_links=(str(releases["links"]),),
        offline=True,
    )
    cache = tmp_path / "uv-cache"
    monkeypatch.setenv("UV_CACHE_DIR", str(cache))
    needs = [Need("ebrel", "2.1", "ebrel==2.1"), Need("ebrel", "2.0", "ebrel==2.0")]
    missing = missing_needs(needs, offline, uv=uv(), python="3.11")
    assert [n.text() for n, _ in missing] == ["ebrel==2.0"]  # 2.1 is in find-links, on disk
    assert "offline: uv's cache" in missing[0][1]
    # Once uv's cache holds ebrel 2.0 from that index (a real install while it was up),
    # offline finds it there.
    target = make_venv(tmp_path / "v", releases["links"])
    with _http(releases["index"]) as url:
        subprocess.run(
            [uv(), "pip", "install", "-q", "--python", str(target / "bin" / "python")]
            + ["--default-index", url, "ebrel==2.0"],
            check=True,
        )
    cached = Sources(default_index=url, offline=True)
    assert missing_needs([needs[1]], cached, uv=uv(), python="3.11") == []
    assert len(missing_needs([Need("ebrel", "1.0", "ebrel==1.0")], cached, uv=uv())) == 1


def _venv_params(path: Path, base: Path, install: dict[str, str], sources: Sources) -> dict:  # type: ignore[type-arg]
    site = next((base / "lib").glob("python*/site-packages"))
    spec = VenvSpec(
        path=str(path),
        base=os.path.realpath(base / "bin" / "python"),
        install=tuple(install.values()),
        sites=(os.path.realpath(site),),
        excluded={},
        spec={"install": install, "sources": sources.as_dict()},
    )
    return {**spec.params(), "uv": [uv()], "where": ""}


def _run(argv: list[str], _name: str) -> tuple[int, str, None]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr, None


def test_an_overlay_installs_a_pinned_package_from_its_index_alone(tmp_path: Path) -> None:
    a = simple_index(
        tmp_path / "a",
        {"ebpin": [(build_wheel(tmp_path / "wa", "ebpin", "1.0", "FROM = 'a'\n"), None)]},
    )
    b = simple_index(
        tmp_path / "b",
        {"ebpin": [(build_wheel(tmp_path / "wb", "ebpin", "1.0", "FROM = 'b'\n"), None)]},
    )
    base = make_venv(tmp_path / "target", tmp_path / "wa")
    plain = Sources(indexes=(a.as_uri(),), default_index=b.as_uri())
    pinned = Config.from_mapping(
        {
            "indexes": [a.as_uri(), {"url": b.as_uri(), "default": True}],
            "pins": {"ebpin": {"index": b.as_uri()}},
        },
        tmp_path / "envbisect.yaml",
    )
    for name, sources, expected in (
        ("plain", plain, "a"),
        ("pinned", Sources.from_config(pinned), "b"),
    ):
        venv = tmp_path / "session" / "venvs" / name
        out = actuate_remote.op_venv(
            _venv_params(venv, base, {"ebpin": "ebpin==1.0"}, sources), _run
        )
        assert out["failure"] is None, out
        got = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import ebpin; print(ebpin.FROM)"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert got.stdout.strip() == expected


def test_a_target_without_bytecode_gets_it_in_the_overlay_not_in_the_target(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "ebpkg", "1.0", "X = 1\n", package=True)
    build_wheel(wheels, "ebmod", "1.0", "Y = 1\n")
    build_wheel(wheels, "ebnew", "1.0", "Z = 1\n")
    base = make_venv(tmp_path / "target", wheels, "ebpkg==1.0", "ebmod==1.0", bytecode=False)
    assert not list(base.rglob("ebpkg/**/*.pyc"))
    before = tree_hashes(base)
    sources = Sources(
        find_links=(str(wheels),), offline=True, default_index=(tmp_path / "none").as_uri()
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    for name in ("one", "two"):
        venv = tmp_path / "session" / "venvs" / name
        out = actuate_remote.op_venv(
            _venv_params(venv, base, {"ebnew": "ebnew==1.0"}, sources), _run
        )
        assert out["failure"] is None, out
        verbose = subprocess.run(
            [str(venv / "bin" / "python"), "-v", "-c", "import ebpkg.sub.more, ebmod"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stderr
        tag = sys.implementation.cache_tag
        for module in ("ebpkg/__init__", "ebpkg/sub/more", "ebmod"):
            # importlib's own words when it loads bytecode instead of compiling the source.
            folder, _, stem = f"{venv}/base-site/{module}".rpartition("/")
            line = f"# {folder}/__pycache__/{stem}.{tag}.pyc matches {folder}/{stem}.py"
            assert line in verbose.splitlines(), (line, verbose[-2000:])
        assert f"code object from '{venv}/base-site/ebpkg/__init__.py'" not in verbose
    store = list((tmp_path / "session" / "bytecode").rglob("*.pyc"))
    assert {p.name.split(".")[0] for p in store} >= {"__init__", "more", "ebmod"}
    assert tree_hashes(base) == before  # nothing written into the target


def test_the_target_state_itself_runs_in_an_empty_overlay_when_the_target_lacks_bytecode(
    tmp_path: Path,
) -> None:
    from envbisect.diff import diff_manifests
    from envbisect.model import manifest as mf
    from envbisect.model.session import Session
    from envbisect.realize.actuate import Actuator
    from tests.helpers_run import manifest, pkg

    wheels = tmp_path / "wheels"
    build_wheel(wheels, "ebpkg", "1.0", "X = 1\n", package=True)
    build_wheel(wheels, "ebwork", "1.0", "W = 1\n")
    build_wheel(wheels, "ebwork", "2.0", "W = 2\n")
    target = make_venv(tmp_path / "target", wheels, "ebpkg==1.0", "ebwork==2.0", bytecode=False)
    before = tree_hashes(target)
    good = manifest(
        tmp_path / "m" / "good.yaml", packages={"ebpkg": pkg("1.0"), "ebwork": pkg("1.0")}
    )
    bad = manifest(
        tmp_path / "m" / "bad.yaml", packages={"ebpkg": pkg("1.0"), "ebwork": pkg("2.0")}
    )
    g, b = mf.load(good), mf.load(bad)
    act = Actuator(
        good=g,
        bad=b,
        units=diff_manifests(g, b).units,
        session=Session.start(tmp_path / "session", {}),
        python=str(target / "bin" / "python"),
        sources=Sources(find_links=(str(wheels),), default_index=(tmp_path / "none").as_uri()),
    )
    assert set(act.target().no_bytecode) == {"ebpkg", "ebwork"}
    with act.realize(frozenset({"packages:ebwork"}), {}, tmp_path / "t1") as state:
        assert state.failure is None, state.failure
        assert state.venv is not None  # the target's packages, through a farm with bytecode
        verbose = subprocess.run(
            [state.python, "-v", "-c", "import ebpkg, ebwork; print(ebwork.W)"],
            capture_output=True,
            text=True,
            env={**os.environ, **state.env},
            check=True,
        )
        assert verbose.stdout.strip() == "2"
        init = f"{state.venv}/base-site/ebpkg/__init__.py"
        tag = sys.implementation.cache_tag
        assert f"# {state.venv}/base-site/ebpkg/__pycache__/__init__.{tag}.pyc matches {init}" in (
            verbose.stderr
        )
    assert tree_hashes(target) == before
    assert (tmp_path / "session" / "bytecode").is_dir()
    act.session.reset()  # `envbisect reset` removes the store with the venvs
    assert not (tmp_path / "session" / "bytecode").exists()
