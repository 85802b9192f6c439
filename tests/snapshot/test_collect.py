"""The collector agent and take_snapshot, run against real targets through the local transport."""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers_collect import (
    NOISY_SITECUSTOMIZE,
    git,
    make_cache_tree,
    make_fake_torch_venv,
    make_repo,
    site_packages,
    write_stand_in,
)

from envbisect.agent import collector as agent
from envbisect.agent.redact import redact_env
from envbisect.model.config import Config
from envbisect.model.errors import CollectError, UsageError
from envbisect.model.manifest import Manifest, load
from envbisect.model.trust import is_own
from envbisect.snapshot import agent_params, store_blobs, take_snapshot, write_snapshot
from envbisect.transport import Transport
from envbisect.transport.reply import BlobSink

PY = sys.executable


def snap(tmp_path: Path, python: str = PY, **config_fields: object):
    config = Config(root=tmp_path, manifests_dir=tmp_path / "manifests", **config_fields)
    return take_snapshot(config, Transport(), python, log_dir=tmp_path / "logs", timeout_s=60)


def errors_of(manifest, section: str) -> list[str]:
    return [e["error"] for e in manifest.section("meta")["errors"] if e["section"] == section]


@pytest.fixture(scope="module")
def fake_torch_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fake_torch_venv(tmp_path_factory.mktemp("faketorch"))


# -- whole snapshot ----------------------------------------------------------------------


def test_snapshot_has_every_section_with_sorted_keys(tmp_path: Path) -> None:
    m = snap(tmp_path)
    for name in ("meta", "system", "python", "packages", "torch", "gpu", "git", "files"):
        assert name in m.sections
    assert m.section("python")["executable"] == PY
    assert m.section("meta")["errors"] == []
    assert m.section("meta")["target"] == {"python": PY, "via": []}
    for name in ("system", "python", "packages", "torch", "env", "caches"):
        keys = list(m.section(name))
        assert keys == sorted(keys), name
    # JSON-safe as well as YAML-safe
    json.dumps(m.as_dict())


def test_volatile_fields_are_confined(tmp_path: Path) -> None:
    first = snap(tmp_path).as_dict()
    second = snap(tmp_path).as_dict()
    for m in (first, second):
        for key in ("created", "elapsed_s", "agent_elapsed_s", "host"):
            m["meta"].pop(key)
    assert first == second


def test_packages_match_importlib_metadata_of_this_venv(tmp_path: Path) -> None:
    packages = snap(tmp_path).section("packages")
    expected: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        expected.setdefault(re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower(), dist.version)
    assert {name: p["version"] for name, p in packages.items()} == expected
    assert packages["pyyaml"]["version"] == importlib.metadata.version("PyYAML")
    assert packages["gitpython"]["version"] == importlib.metadata.version("GitPython")
    assert packages["envbisect"]["editable"] is True
    assert all(name == name.lower() and "_" not in name for name in packages)


# -- torch -------------------------------------------------------------------------------


def test_fake_cuda_torch_in_a_uv_venv_without_envbisect(
    tmp_path: Path, fake_torch_python: Path
) -> None:
    m = snap(tmp_path, str(fake_torch_python))
    torch = m.section("torch")
    # The fake torch/__init__.py raises on import: reading it proves it was never imported.
    assert torch["version"] == "2.9.1+cu128"
    assert torch["cuda"] == "12.8"
    assert torch["hip"] is None
    assert torch["git_version"] == "d38164a545b4a4e4e0cf73ce67173f70574890b6"
    assert torch["cudnn"] == "9.10.2.21"
    assert torch["triton"] == "3.5.1"
    packages = m.section("packages")
    assert "envbisect" not in packages
    assert packages["private-pkg"]["installer"] == "uv"
    assert packages["torch"]["version"] == "2.9.1+cu128"
    assert m.section("python")["executable"] == str(fake_torch_python)


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="real CPU torch is not installed"
)
def test_real_cpu_torch_is_read_without_importing_it(tmp_path: Path) -> None:
    probe = "torch.fx._symbolic_trace.is_fx_symbolic_tracing"
    m = snap(tmp_path, probes=(probe,))
    assert m.section("probes")[probe]["status"] == "original"
    torch = m.section("torch")
    assert torch["version"] == importlib.metadata.version("torch")
    assert torch["cuda"] is None
    assert len(torch["git_version"]) == 40
    out = subprocess.run(
        [
            PY,
            "-c",
            "import torch, json; print(json.dumps([torch.__version__, torch.version.cuda,"
            " torch.version.git_version]))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout.splitlines()[-1]) == [
        torch["version"],
        torch["cuda"],
        torch["git_version"],
    ]


def test_no_torch_is_a_fact(tmp_path: Path, fake_torch_python: Path) -> None:
    (site_packages(fake_torch_python) / "torch" / "__init__.py").rename(tmp_path / "x.py")
    try:
        m = snap(tmp_path, str(fake_torch_python))
    finally:
        (tmp_path / "x.py").rename(site_packages(fake_torch_python) / "torch" / "__init__.py")
    assert m.section("torch")["version"] is None
    assert errors_of(m, "torch") == []


# -- git ---------------------------------------------------------------------------------


def test_git_clean_dirty_detached_and_not_a_repo(tmp_path: Path) -> None:
    clean = make_repo(tmp_path / "clean")
    dirty = make_repo(tmp_path / "dirty")
    (dirty / "train.py").write_text("STEPS = 99\n")
    (dirty / "new1.txt").write_text("u")
    (dirty / "sub").mkdir()
    (dirty / "sub" / "new2.txt").write_text("u")
    detached = make_repo(tmp_path / "detached", commits=3)
    first = git(detached, "rev-list", "--max-parents=0", "HEAD")
    git(detached, "checkout", "-q", "--detach", first)
    plain = tmp_path / "plain"
    plain.mkdir()

    g = snap(tmp_path, repos=(clean, dirty, detached, plain)).section("git")
    assert g[str(clean)] == {
        "branch": "main",
        "diff_sha256": None,
        "dirty": False,
        "head": git(clean, "rev-parse", "HEAD"),
        "untracked": 0,
    }
    diff = subprocess.run(
        ["git", "-C", str(dirty), "diff", "HEAD", "--binary"], capture_output=True, check=True
    ).stdout
    assert g[str(dirty)]["dirty"] is True
    assert g[str(dirty)]["untracked"] == 2
    assert g[str(dirty)]["diff_sha256"] == hashlib.sha256(diff).hexdigest()
    assert g[str(detached)]["branch"] is None
    assert g[str(detached)]["head"] == first
    assert "not a git repository" in g[str(plain)]["error"]


def test_git_diff_digest_moves_with_the_diff_and_status_leaves_index_alone(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "r")
    (repo / "train.py").write_text("STEPS = 5\n")
    index = repo / ".git" / "index"
    before = index.stat().st_mtime_ns
    a = snap(tmp_path, repos=(repo,)).section("git")[str(repo)]["diff_sha256"]
    (repo / "train.py").write_text("STEPS = 6\n")
    b = snap(tmp_path, repos=(repo,)).section("git")[str(repo)]["diff_sha256"]
    assert a != b
    assert index.stat().st_mtime_ns == before


# -- files, data -------------------------------------------------------------------------


def test_files_globs_hashes_and_blobs(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "a.py").write_text("A = 1\n")
    (src / "pkg" / "b.py").write_text("B = 2\n")
    (src / "big.py").write_text("#" * 5000)
    m = snap(
        tmp_path,
        files=(str(src / "**" / "*.py"), str(src / "gone.py"), str(src / "*.none")),
        keep_blobs=1000,
    )
    files = m.section("files")
    a_sha = hashlib.sha256(b"A = 1\n").hexdigest()
    assert files[str(src / "a.py")] == {"blob": a_sha, "sha256": a_sha, "size": 6}
    assert files[str(src / "big.py")]["blob"] is None  # over the size limit
    assert files[str(src / "gone.py")]["exists"] is False
    assert (tmp_path / "manifests" / "blobs" / a_sha).read_bytes() == b"A = 1\n"
    assert str(src / "pkg" / "b.py") in files
    assert any("no file matches" in e for e in errors_of(m, "files"))


def test_data_records_and_bounded_fingerprint(tmp_path: Path) -> None:
    small = tmp_path / "train.jsonl"
    small.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(1000)))
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (8 << 20))
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "s0.jsonl").write_text("{}\n")

    def facts():
        return snap(tmp_path, data=(small, big, folder, tmp_path / "missing.jsonl")).section("data")

    d1 = facts()
    assert d1[str(small)]["records"] == 1000
    assert d1[str(small)]["size"] == small.stat().st_size
    assert d1[str(folder)]["files"] == 1
    assert d1[str(tmp_path / "missing.jsonl")]["exists"] is False
    # A byte changed far from the sampled head/middle/tail leaves the fingerprint: the
    # fingerprint never read it. Appending a record moves it.
    with open(big, "r+b") as fh:
        fh.seek(1 << 20)
        fh.write(b"\1")
    with open(small, "a") as fh:
        fh.write('{"i": 1000}\n')
    d2 = facts()
    assert d2[str(big)]["fingerprint"] == d1[str(big)]["fingerprint"]
    assert d2[str(small)]["fingerprint"] != d1[str(small)]["fingerprint"]
    assert d2[str(small)]["records"] == 1001


# -- caches ------------------------------------------------------------------------------


def test_compile_caches_default_env_and_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inductor = make_cache_tree(tmp_path / "inductor", 300)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "no-triton"))
    extra = make_cache_tree(tmp_path / "extra", 10, subdirs=("x",))
    caches = snap(tmp_path, caches={"mine": extra}).section("caches")
    ind = caches["inductor"]
    assert ind["source"] == "env TORCHINDUCTOR_CACHE_DIR"
    assert ind["path"] == str(inductor)
    assert ind["exists"] is True
    assert ind["files"] == 300
    assert ind["bytes"] == sum(i % 13 for i in range(300))
    assert ind["subdirs"]["fxgraph"]["files"] == 150
    assert caches["triton"]["exists"] is False
    assert caches["triton"]["files"] == 0
    assert caches["mine"]["source"] == "config"
    assert caches["mine"]["files"] == 10

    # The digest covers (relpath, size, mtime): stable when nothing changes, moves on a touch.
    again = snap(tmp_path, caches={"mine": extra}).section("caches")["inductor"]["digest"]
    assert again == ind["digest"]
    victim = next((inductor / "triton").rglob("*.bin"))
    os.utime(victim, ns=(1, 1))
    moved = snap(tmp_path, caches={"mine": extra}).section("caches")["inductor"]["digest"]
    assert moved != ind["digest"]


def test_default_cache_locations_follow_torch_and_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_HOME", raising=False)
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    import tempfile

    caches = agent.default_caches()
    assert caches["inductor"][0] == os.path.join(tempfile.gettempdir(), "torchinductor_alice")
    assert caches["triton"][0] == os.path.join(os.path.expanduser("~"), ".triton", "cache")


# -- env and secrets ---------------------------------------------------------------------


def test_planted_secrets_never_reach_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_torch_python: Path
) -> None:
    secrets = {
        "HF_TOKEN": "hf_plantedSecret111",
        "WANDB_API_KEY": "plantedSecret222",
        "AWS_SECRET_ACCESS_KEY": "plantedSecret333",
        "TORCH_HUB_AUTH": "plantedSecret444",
        "MY_SESSION_ID": "plantedSecret555",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    url = "https://alice:plantedSecret666@mirror.example.invalid/simple"
    monkeypatch.setenv("PYTORCH_INDEX", url)
    monkeypatch.setenv("PATH", os.environ["PATH"] + ":https://bob:plantedSecret777@h.invalid/x")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/lib")
    # A package installed from an authenticated URL records it in direct_url.json.
    site = site_packages(fake_torch_python)
    direct = next(site.glob("*rivate*kg-1.0.dist-info")) / "direct_url.json"
    direct.write_text(
        json.dumps(
            {
                "url": "https://carol:plantedSecret888@pkgs.example.invalid/private_pkg-1.0.whl",
                "archive_info": {},
            }
        )
    )
    config = Config(
        root=tmp_path,
        manifests_dir=tmp_path / "manifests",
        env=("MY_SESSION_ID", "WANDB_API_KEY", "HF_TOKEN"),
    )
    m = take_snapshot(config, Transport(), str(fake_torch_python), log_dir=tmp_path / "logs")
    out = write_snapshot(m, str(tmp_path / "m.yaml"), config)
    assert out is not None
    text = out.read_text()
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").iterdir())
    for n in range(1, 9):
        assert f"plantedSecret{n}" not in text
        assert f"plantedSecret{n}" not in logs
    env = load(out).section("env")
    digest = hashlib.sha256(b"hf_plantedSecret111").hexdigest()[:8]
    assert env["HF_TOKEN"] == {"redacted": digest}
    assert "AWS_SECRET_ACCESS_KEY" not in env  # neither allowlisted nor configured
    assert env["PYTORCH_INDEX"]["masked"] == "https://mirror.example.invalid/simple"
    assert "https://h.invalid/x" in env["PATH"]["masked"]
    assert env["LD_LIBRARY_PATH"] == "/opt/lib"
    assert env["TORCH_HUB_AUTH"]["redacted"]
    pkg = load(out).section("packages")["private-pkg"]
    assert pkg["direct_url"] == "https://pkgs.example.invalid/private_pkg-1.0.whl"


def test_the_collector_bundle_carries_the_redaction_rules() -> None:
    from envbisect.transport.bundle import build_bundle

    bundle = build_bundle("envbisect.agent.collector", {})
    assert b"envbisect.agent.redact" in bundle.source
    ast.parse(bundle.source, feature_version=(3, 8))  # the target may be an old Python
    assert agent.redact_env is redact_env  # one implementation, not a copy


# -- hostile targets ---------------------------------------------------------------------


def test_noisy_target_still_returns_the_whole_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NOISY_SITECUSTOMIZE)
    # Noise during collection too: a probed module that prints megabytes on import.
    (site / "chatty.py").write_text(
        "import os\nprint('x' * 3000000)\nos.write(1, b'y' * 3000000)\ndef f():\n    return 1\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    quiet = snap(tmp_path / "q")
    m = snap(tmp_path, probes=("chatty.f",))
    assert m.section("packages") == quiet.section("packages")
    assert m.section("probes")["chatty.f"]["status"] == "original"
    stderr = (tmp_path / "logs" / "snapshot.stderr").read_bytes()
    assert b"y" * 1000 in stderr  # the C-level noise went to stderr, kept in full


def test_hanging_nvidia_smi_is_timed_out_and_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "smi.pid"
    bin_dir = tmp_path / "bin"
    write_stand_in(bin_dir, "nvidia-smi", f"echo $$ > {pid_file}\nexec sleep 300\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    config = Config(root=tmp_path, manifests_dir=tmp_path / "manifests")
    m = take_snapshot(
        config,
        Transport(),
        PY,
        log_dir=tmp_path / "logs",
        timeout_s=30,
        params={"gpu_timeout_s": 0.5},
    )
    assert m.section("gpu")["devices"] == []
    assert any("timed out" in e for e in errors_of(m, "gpu"))
    assert m.section("packages")  # the rest of the snapshot completed
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_gpu_facts_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    write_stand_in(
        bin_dir,
        "nvidia-smi",
        'case "$1" in\n'
        "  --query-gpu=index,name,memory.total,driver_version)\n"
        '    [ "$2" = "--format=csv,noheader,nounits" ] || exit 9\n'
        "    echo '0, NVIDIA H200, 143771, 570.86.15'\n"
        "    echo '1, NVIDIA H200, 143771, 570.86.15' ;;\n"
        "  '') echo '| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8 |';;\n"
        "  *) exit 6 ;;\n"
        "esac\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    gpu = snap(tmp_path).section("gpu")
    assert gpu["driver"] == "570.86.15"
    assert gpu["cuda_driver"] == "12.8"
    assert gpu["devices"] == [
        {"index": 0, "memory_mib": 143771, "name": "NVIDIA H200"},
        {"index": 1, "memory_mib": 143771, "name": "NVIDIA H200"},
    ]


def test_no_gpu_is_a_fact_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    m = snap(tmp_path)
    assert m.section("gpu")["devices"] == []
    assert errors_of(m, "gpu") == []


def test_a_target_that_cannot_start_is_one_collect_error(tmp_path: Path) -> None:
    with pytest.raises(CollectError) as info:
        snap(tmp_path, python=str(tmp_path / "nope" / "python3"))
    assert "\n" not in str(info.value)


# -- probes ------------------------------------------------------------------------------


def test_probes_original_patched_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "mylib.py").write_text(
        "def kept(x):\n    return x + 1\n\n"
        "def hot(x):\n    return x * 2\n\n"
        "class Tracer:\n    def trace(self):\n        return 'orig'\n"
    )
    (site / "sitecustomize.py").write_text(
        "import mylib\n"
        "def hot(x):\n    return x * 3\n"
        "mylib.hot = hot\n"
        "def trace(self):\n    return 'patched'\n"
        "mylib.Tracer.trace = trace\n"
        "mylib.alias = mylib.kept\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    names = ("mylib.kept", "mylib.hot", "mylib.Tracer.trace", "mylib.alias", "mylib.nope")
    names += ("nolib.f",)
    probes = snap(tmp_path, probes=names).section("probes")
    assert probes["mylib.kept"]["status"] == "original"
    assert probes["mylib.kept"]["module_file"] == str(site / "mylib.py")
    assert probes["mylib.hot"]["status"] == "patched"
    assert probes["mylib.Tracer.trace"]["status"] == "patched"
    assert probes["mylib.alias"]["status"] == "patched"
    assert probes["mylib.nope"]["status"] == "missing"
    assert probes["nolib.f"]["status"] == "missing"


def test_probes_are_not_imported_unless_configured(tmp_path: Path) -> None:
    assert "probes" not in snap(tmp_path).sections
    assert agent_params(Config(root=tmp_path))["probes"] == []


def test_written_manifest_loads_back_equal(tmp_path: Path) -> None:
    config = Config(root=tmp_path, manifests_dir=tmp_path / "manifests", label="good")
    m = take_snapshot(config, Transport(), PY, log_dir=tmp_path / "logs")
    path = write_snapshot(m, None, config)
    assert path is not None and path.parent == tmp_path / "manifests"
    assert path.name.startswith("good-") and path.suffix == ".yaml"
    loaded = load(path)
    # Written signed: the manifest is this user's own (envbisect.model.trust), and otherwise equal.
    assert is_own(loaded) and not is_own(m)
    meta = {k: v for k, v in loaded.section("meta").items() if k != "signature"}
    assert {**loaded.as_dict(), "meta": meta} == m.as_dict()
    assert yaml.safe_load(path.read_text())["schema"] == "envbisect/manifest@1"
    second = write_snapshot(m, None, config)
    assert second != path  # same second, same label: never overwritten


def test_store_blobs_checks_content_and_never_rewrites(tmp_path: Path) -> None:
    good = b"contents"
    sha = hashlib.sha256(good).hexdigest()
    wrong = hashlib.sha256(b"other").hexdigest()
    blobs = {
        sha: base64.b64encode(good).decode(),
        wrong: base64.b64encode(good).decode(),
        "f" * 64: "not base64!",
    }
    errors = store_blobs(blobs, tmp_path / "blobs")
    assert (tmp_path / "blobs" / sha).read_bytes() == good
    assert not (tmp_path / "blobs" / wrong).exists()
    assert sorted(e["error"].split(": ")[1] for e in errors) == [
        "content does not match",
        "not base64",
    ]
    (tmp_path / "blobs" / sha).chmod(0o400)
    assert store_blobs({sha: blobs[sha]}, tmp_path / "blobs") == []


def test_write_snapshot_refuses_a_directory(tmp_path: Path) -> None:
    config = Config(root=tmp_path, manifests_dir=tmp_path / "manifests")
    m = Manifest(sections={"meta": {"label": "x"}})
    with pytest.raises(UsageError, match="is a directory"):
        write_snapshot(m, str(tmp_path), config)


def test_through_a_layer_only_the_content_the_store_lacks_travels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found as a user through --via ssh: every snapshot sent the whole kept compile cache
    back (308 MB of a stale inductor cache, 35.8 s a snapshot), though the blob store held
    all of it from the last one. Now the target is told what the store holds (0.8 s)."""
    import envbisect.snapshot as snapshot

    (tmp_path / "a.py").write_text("A = 1\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "kernel.bin").write_bytes(b"k" * 4000)
    config = Config(
        root=tmp_path,
        manifests_dir=tmp_path / "manifests",
        files=(str(tmp_path / "a.py"),),
        caches={"mine": cache},
        keep_blobs=1000,
        keep_caches=1 << 20,
    )
    sinks: list[BlobSink] = []

    class Spy(BlobSink):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            sinks.append(self)

    monkeypatch.setattr(snapshot, "BlobSink", Spy)
    layer = Transport.from_specs(["sh -c"])  # a real layer: the content travels as on ssh

    def take() -> dict:
        return take_snapshot(config, layer, PY, log_dir=tmp_path / "logs", timeout_s=60).sections

    first = take()
    sent = [set(sinks[0].stored)]
    a_sha = hashlib.sha256(b"A = 1\n").hexdigest()
    kernel = hashlib.sha256(b"k" * 4000).hexdigest()
    tree = first["caches"]["mine"]["kept"]["tree"]
    assert sent == [{a_sha, kernel, tree}]
    (cache / "new.bin").write_bytes(b"new")  # the cache grew by one file
    second = take()
    sent.append(set(sinks[1].stored))
    new_tree = second["caches"]["mine"]["kept"]["tree"]
    assert sent[1] == {hashlib.sha256(b"new").hexdigest(), new_tree}  # nothing sent twice
    assert second["files"][str(tmp_path / "a.py")]["blob"] == a_sha
    assert {p.name for p in config.blobs_dir.iterdir()} == sent[0] | sent[1]
