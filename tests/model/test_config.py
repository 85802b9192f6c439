"""envbisect.yaml: discovery, path resolution, validation, CLI overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbisect.model.config import DEFAULT_BLOB_LIMIT, Config, Target
from envbisect.model.errors import ConfigError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_no_file_gives_defaults_rooted_at_cwd(tmp_path: Path) -> None:
    c = Config.load(cwd=tmp_path)
    assert c.path is None
    assert c.root == tmp_path
    assert c.manifests_dir == tmp_path / "manifests"
    assert c.repos == () and c.keep_blobs is None and c.label is None


def test_found_by_walking_up_and_paths_resolve_against_its_directory(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "proj" / "envbisect.yaml",
        """
label: good
repos: [., /abs/repo]
files: ["src/**/*.py"]
data: [data/train.jsonl]
caches: {mine: cache/x}
probes: [torch.fx._symbolic_trace.is_fx_symbolic_tracing]
env: [MY_FLAG]
keep_blobs: true
manifests_dir: out
targets:
  gpu: {via: ["ssh root@10.1.2.6", "pct exec 200 --"], python: /root/venv/bin/python3}
  local: {python: python3.12}
good: out/good.yaml
index_url: https://mirror.invalid/simple
extra_index_urls: [https://extra.invalid/simple]
find_links: [wheels, https://links.invalid/]
data_map: {/new/train.jsonl: old/train.jsonl}
smoke: [python, train.py, --steps, 20]
""",
    )
    deep = tmp_path / "proj" / "a" / "b"
    deep.mkdir(parents=True)
    c = Config.load(cwd=deep)
    root = tmp_path / "proj"
    assert c.path == cfg and c.root == root
    assert c.label == "good"
    assert c.repos == (root / ".", Path("/abs/repo"))
    assert c.files == (str(root / "src/**/*.py"),)
    assert c.data == (root / "data/train.jsonl",)
    assert c.caches == {"mine": root / "cache/x"}
    assert c.keep_blobs == DEFAULT_BLOB_LIMIT
    assert c.manifests_dir == root / "out"
    assert c.blobs_dir == root / "out" / "blobs"
    assert c.targets["gpu"] == Target(
        via=("ssh root@10.1.2.6", "pct exec 200 --"), python="/root/venv/bin/python3"
    )
    assert c.targets["local"] == Target(via=(), python="python3.12")
    assert c.good == root / "out/good.yaml"
    assert c.find_links == (str(root / "wheels"), "https://links.invalid/")
    assert c.data_map == {"/new/train.jsonl": str(root / "old/train.jsonl")}
    assert c.smoke == ("python", "train.py", "--steps", "20")
    assert c.env == ("MY_FLAG",)


def test_explicit_path_and_missing_path(tmp_path: Path) -> None:
    cfg = write(tmp_path / "x" / "custom.yaml", "keep_blobs: 4096\nsmoke: python t.py --n 2\n")
    c = Config.load(cfg)
    assert c.keep_blobs == 4096
    assert c.smoke == ("python", "t.py", "--n", "2")
    with pytest.raises(ConfigError, match="no such config file"):
        Config.load(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("repos: 3\n", "'repos'"),
        ("repos: [a, 3]\n", "'repos[1]'"),
        ("caches: [a]\n", "'caches'"),
        ("keep_blobs: -1\n", "'keep_blobs'"),
        ("keep_blobs: lots\n", "'keep_blobs'"),
        ("label: [a]\n", "'label'"),
        ("targets: {gpu: [ssh]}\n", "'targets.gpu'"),
        ("targets: {gpu: {via: 3}}\n", "'targets.gpu.via'"),
        ("targets: {gpu: {vai: [ssh x]}}\n", "'targets.gpu.vai'"),
        ("smoke: {a: 1}\n", "'smoke'"),
        ("repo: [.]\n", "'repo' (did you mean 'repos'?)"),
        ("- a\n", "top level"),
        ("label: [unclosed\n", "malformed YAML at line"),
        ("threshold: 15\n", "field threshold '15': a bare number below 1,000 is ambiguous"),
        ("threshold: 120%\n", "between 0% and 100%"),
        ("threshold: [1]\n", "'threshold'"),
        ("metric_regex: 'tok/s'\n", "'metric_regex': needs one group"),
        ("repeats: 0\n", "'repeats' must be a positive whole number"),
        ("index_url: 5\n", "'index_url' must be a string"),
        ("indexes: file:///x\n", "'indexes' must be a list"),
        ("indexes: [5]\n", "'indexes[0]' must be an index URL"),
        ("indexes: [ftp://x/simple]\n", "'indexes[0]' must be a file://, http:// or https://"),
        ("indexes: [{url: a, defualt: true}]\n", "unknown field 'indexes[0].defualt'"),
        ("indexes: [{url: a, default: yes please}]\n", "'indexes[0].default' must be true"),
        (
            "indexes: [{url: a, default: true}, {url: b, default: true}]\n",
            "'indexes[1].url': default: true, but another entry",
        ),
        (
            "index_url: file:///a\nindexes: [{url: b, default: true}]\n",
            "'indexes[0].url': default: true, but 'index_url'",
        ),
        ("index_strategy: first-match\n", "'index_strategy' must be first-index or"),
        ("offline: 1\n", "'offline' must be true or false"),
        ("pins: [einops]\n", "'pins' must be a mapping"),
        ("pins: {einops: '=>0.7'}\n", "'pins.einops' must be a version range"),
        ("pins: {einops: {version: '==0.7', idx: x}}\n", "unknown field 'pins.einops.idx'"),
        ("pins: {einops: {index: 7}}\n", "'pins.einops.index' must be an index URL"),
        ("pins: {'bad name!': '==1'}\n", "'pins' must be keyed by package names"),
        ("pins: {Einops: '==1', einops: '==2'}\n", "'pins.einops': 'einops' is pinned twice"),
        ("good: 5\n", "'good' must be a string"),
        ("label: a\nlabel: b\n", "line 2: duplicate key 'label' (first at line 1)"),
        ("repos: &r [a]\ndata: *r\n", "alias (*name)"),
    ],
)
def test_bad_config_is_one_line_naming_file_and_field(
    tmp_path: Path, text: str, field: str
) -> None:
    cfg = write(tmp_path / "envbisect.yaml", text)
    with pytest.raises(ConfigError) as info:
        Config.load(cwd=tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(cfg))
    assert field in message


def test_threshold_metric_regex_and_repeats_can_be_set(tmp_path: Path) -> None:
    write(
        tmp_path / "envbisect.yaml",
        "threshold: 70%\nmetric_regex: '([0-9.]+) tok/s'\nrepeats: 5\n",
    )
    c = Config.load(cwd=tmp_path)
    assert c.threshold.fraction == pytest.approx(0.7)
    assert c.threshold.source == "envbisect.yaml threshold"
    assert c.metric_regex == "([0-9.]+) tok/s" and c.repeats == 5


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    write(tmp_path / "envbisect.yaml", "")
    c = Config.load(cwd=tmp_path)
    assert c.path == tmp_path / "envbisect.yaml"
    assert c.keep_blobs is None


def test_with_overrides_extends_lists_against_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "proj" / "envbisect.yaml", "repos: [.]\nprobes: [a.b]\nlabel: base\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    c = Config.load(cwd=tmp_path / "proj").with_overrides(
        repos=("r2",), files=("*.py",), probes=("c.d",), data=(), label=None
    )
    assert c.repos == (tmp_path / "proj" / ".", work / "r2")
    assert c.files == (str(work / "*.py"),)
    assert c.probes == ("a.b", "c.d")
    assert c.label == "base"
    assert c.with_overrides(label="bad").label == "bad"
    with pytest.raises(TypeError):
        c.with_overrides(nonsense=1)
