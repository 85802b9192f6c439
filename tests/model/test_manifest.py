"""Loading and saving manifests: one clear line naming the file and the field on bad input."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbisect.model.errors import ManifestError
from envbisect.model.manifest import MAX_BYTES_ENV, SCHEMA, Manifest, load, save

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "manifests"


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("not-a-mapping.yaml", "top level"),
        ("missing-schema.yaml", "'schema' is missing"),
        ("newer-schema.yaml", "newer than this envbisect reads"),
        ("other-schema.yaml", "not an envbisect manifest"),
        ("bad-yaml.yaml", "malformed YAML at line"),
        ("packages-is-a-list.yaml", "field 'packages' must be a mapping"),
        ("package-entry-is-a-string.yaml", "field 'packages.torch' must be a mapping"),
        ("errors-not-a-list.yaml", "field 'meta.errors' must be a list"),
        ("env-value-is-a-list.yaml", "field 'env.PATH'"),
    ],
)
def test_malformed_manifest_is_one_line_naming_file_and_field(name: str, field: str) -> None:
    with pytest.raises(ManifestError) as info:
        load(FIXTURES / name)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(FIXTURES / name))
    assert field in message


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such manifest file"):
        load(tmp_path / "nope.yaml")
    with pytest.raises(ManifestError, match="is a directory"):
        load(tmp_path)


def test_unknown_extra_keys_are_kept(tmp_path: Path) -> None:
    m = load(FIXTURES / "valid-with-extras.yaml")
    assert m.label == "extras"
    assert m.section("packages")["torch"]["extra"] is True
    assert m.section("meta")["future_field"] == 3
    assert m.sections["tomorrow_section"] == {"anything": [1, 2]}
    out = save(m, tmp_path / "again.yaml")
    assert load(out).as_dict() == m.as_dict()


def test_save_is_atomic_and_ordered(tmp_path: Path) -> None:
    m = Manifest(sections={"env": {"A": "1"}, "meta": {"label": "x"}, "zzz": {}})
    path = save(m, tmp_path / "sub" / "m.yaml")
    assert list(yaml.safe_load(path.read_text())) == ["schema", "meta", "env", "zzz"]
    assert yaml.safe_load(path.read_text())["schema"] == SCHEMA
    assert [p.name for p in path.parent.iterdir()] == ["m.yaml"]  # no temp file left behind


def test_a_manifest_error_exits_2_with_one_line_from_a_real_process(tmp_path: Path) -> None:
    # Any command that loads a manifest goes through cli.main's mapping; drive it directly.
    code = (
        "import sys\n"
        "from envbisect.cli import cli, main\n"
        "import click\n"
        "from envbisect.model.manifest import load\n"
        "@cli.command('load-probe')\n"
        "@click.argument('path')\n"
        "def _probe(path):\n"
        "    load(path)\n"
        "main(['load-probe', sys.argv[1]])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(FIXTURES / "newer-schema.yaml")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "newer-schema.yaml" in proc.stderr and "Traceback" not in proc.stderr


def test_large_manifest_parse_cache_is_keyed_by_content(tmp_path: Path) -> None:
    from envbisect.model import manifest as mf

    packages = {f"pkg-{i:05d}": {"version": f"1.{i}.0", "installer": "uv"} for i in range(6000)}
    big = mf.Manifest(sections={"meta": {"label": "big"}, "packages": packages})
    path = mf.save(big, tmp_path / "big.yaml")
    raw = path.read_bytes()
    assert len(raw) >= mf.PARSE_CACHE_MIN_BYTES
    cached = mf._cache_path(raw)
    assert cached.exists(), "save() primes the parse cache of a large manifest"
    assert mf.load(path).sections["packages"] == packages
    # Editing the file changes its hash: the stale parsed copy is never used.
    path.write_text(path.read_text().replace("version: 1.7.0", "version: 9.9.9"))
    assert mf.load(path).sections["packages"]["pkg-00007"]["version"] == "9.9.9"
    # A corrupt cache entry is ignored, not trusted.
    cached.write_text("{not json")
    path.write_bytes(raw)
    assert mf.load(path).sections["packages"]["pkg-00007"]["version"] == "1.7.0"


def test_a_parse_cached_by_the_laxer_loader_does_not_hide_a_duplicate_key(tmp_path: Path) -> None:
    from envbisect.model import manifest as mf

    body = "".join(f"  pkg-{i:05d}: {{version: '1.{i}'}}\n" for i in range(9000))
    path = tmp_path / "dup.yaml"
    path.write_text(f"schema: {SCHEMA}\npackages:\n{body}  pkg-00001: {{version: '9'}}\n")
    raw = path.read_bytes()
    assert len(raw) >= mf.PARSE_CACHE_MIN_BYTES
    # What the loader before issue 17 cached for this file (the last duplicate won):
    legacy = mf.parse_cache_dir() / f"{hashlib.sha256(raw).hexdigest()}.json"
    legacy.parent.mkdir(parents=True, exist_ok=True)
    legacy.write_text(json.dumps({"schema": SCHEMA, "packages": {}}))
    with pytest.raises(ManifestError, match="duplicate key 'pkg-00001'"):
        mf.load(path)


def test_a_large_json_manifest_is_checked_once_then_read_plainly(tmp_path: Path) -> None:
    from envbisect.model import manifest as mf

    packages = {f"pkg-{i:05d}": {"version": f"1.{i}"} for i in range(9000)}
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"schema": SCHEMA, "packages": packages}))
    assert not mf._json_checked(path.read_bytes())
    assert mf.load(path).sections["packages"] == packages
    assert mf._json_checked(path.read_bytes())
    assert mf.load(path).sections["packages"] == packages
    # An edit changes the hash: the edited file is checked again, duplicates and all.
    path.write_text(path.read_text()[:-2] + ', "pkg-00001": {"version": "9"}}}')
    with pytest.raises(ManifestError, match="duplicate key 'pkg-00001'"):
        mf.load(path)


# ---- hostile files: refused in one line, never a hang -----------------------------------------

BILLION_LAUGHS = """\
schema: envbisect/manifest@1
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def _diff_in_a_real_process(a: Path | str, b: Path | str) -> subprocess.CompletedProcess[str]:
    # A hang fails the test through the timeout; the refusal itself takes milliseconds.
    return subprocess.run(
        [sys.executable, "-m", "envbisect", "diff", str(a), str(b)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda t: _written(t, BILLION_LAUGHS), "alias (*name)"),
        (lambda t: Path("/dev/zero"), "is a character device, not a regular file"),
        (lambda t: Path("/dev/urandom"), "is a character device, not a regular file"),
        (_fifo, "is a FIFO (named pipe), not a regular file"),
    ],
    ids=["billion-laughs", "dev-zero", "dev-urandom", "fifo-without-writer"],
)
def test_hostile_files_exit_2_with_one_line(tmp_path: Path, make: Any, fragment: str) -> None:
    path = make(tmp_path)
    good = _written(tmp_path, f"schema: {SCHEMA}\n", "good.yaml")
    proc = _diff_in_a_real_process(good, path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"envbisect: error: {path}: ") and fragment in proc.stderr


def _written(tmp_path: Path, text: str, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_alias_bomb_is_refused_before_anything_walks_it(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"line 2: an anchor \(&name\) used again"):
        load(_written(tmp_path, BILLION_LAUGHS))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            f"schema: {SCHEMA}\nmeta: {{label: a}}\nmeta: {{label: b}}\n",
            "line 3: duplicate key 'meta' (first at line 2)",
        ),
        (
            f"schema: {SCHEMA}\npackages:\n  torch: {{version: '1', version: '2'}}\n",
            "duplicate key 'version'",
        ),
        (f'{{"schema": "{SCHEMA}", "env": {{"A": "1", "A": "2"}}}}', "duplicate key 'A'"),
        (f"schema: {SCHEMA}\nmeta:\n  <<: {{label: x}}\n", "merge key"),
    ],
    ids=["yaml-top", "yaml-nested", "json", "merge-key"],
)
def test_duplicate_and_merge_keys_are_refused(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ManifestError, match=re.escape(fragment)):
        load(_written(tmp_path, text))


def test_a_manifest_over_the_size_limit_says_its_size_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _written(tmp_path, f"schema: {SCHEMA}\n# {'x' * 3000}\n")
    monkeypatch.setenv(MAX_BYTES_ENV, "2000")
    with pytest.raises(ManifestError) as info:
        load(path)
    message = str(info.value)
    assert "is 3.0 KB, over the 2.0 KB envbisect reads for a manifest" in message
    assert f"{path}: is " in message and "probably data" in message and MAX_BYTES_ENV in message
    monkeypatch.setenv(MAX_BYTES_ENV, "4000")
    assert load(path).sections == {}


def test_nesting_deeper_than_any_manifest_is_refused(tmp_path: Path) -> None:
    for n, why in ((200, "nested deeper than 64 levels"), (100_000, "nest")):
        deep = "[" * n + "]" * n
        with pytest.raises(ManifestError, match=why):
            load(_written(tmp_path, f"schema: {SCHEMA}\nmeta: {{x: {deep}}}\n"))
        with pytest.raises(ManifestError, match=why):
            load(_written(tmp_path, f'{{"schema": "{SCHEMA}", "meta": {{"x": {deep}}}}}'))


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            "packages: {torch: {version: [1, 2]}}",
            "field 'packages.torch.version' must be a string, got a list",
        ),
        (
            "packages: {torch: {version: {a: 1}}}",
            "field 'packages.torch.version' must be a string, got a mapping",
        ),
        (
            "packages: {torch: {version: 5}}",
            "field 'packages.torch.version' must be a string, got an integer",
        ),
        (
            "packages: {torch: {version: '5', editable: 'yes'}}",
            "'packages.torch.editable' must be true/false",
        ),
        ("gpu: {devices: 5}", "field 'gpu.devices' must be a list, got an integer"),
        ("gpu: {devices: [5]}", "field 'gpu.devices[0]' must be a mapping, got an integer"),
        ("files: {/etc/x: {sha256: 12}}", "field 'files./etc/x.sha256' must be a string"),
        ("git: {/r: {head: [1]}}", "field 'git./r.head' must be a string"),
        # A colleague's hand edit deleting the version: refused, not read as "unknown".
        ("git: {/r: {branch: main, dirty: false}}", "field 'git./r.head' is missing"),
        ("files: {/etc/x: {size: 3, blob: null}}", "field 'files./etc/x.sha256' is missing"),
        ("files: {/etc/x: {sha256: null, size: 3}}", "field 'files./etc/x.sha256' is missing"),
        ("caches: {inductor: {files: many}}", "field 'caches.inductor.files' must be an integer"),
        ("python: {version: 3.11}", "field 'python.version' must be a string, got a number"),
        # A colleague emptying a repo's entry: said in YAML's words, not "got NoneType".
        ("git: {/r: null}", "field 'git./r' must be a mapping, got null"),
        # A key with a line break (found by the fuzz test below): escaped, one line.
        ('packages: {"a\\nb": null}', "field 'packages.a\\nb' must be a mapping, got null"),
    ],
)
def test_wrong_leaf_types_are_refused_naming_the_field(
    tmp_path: Path, body: str, fragment: str
) -> None:
    with pytest.raises(ManifestError, match=re.escape(fragment)):
        load(_written(tmp_path, f"schema: {SCHEMA}\n{body}\n"))


@pytest.mark.parametrize(
    "body",
    [
        "git: {/r: {head: null, branch: main}}",  # a repo with no commit yet
        "git: {/r: {error: not a git repository}}",  # the snapshot could not read it
        "files: {/etc/x: {sha256: null, size: null, blob: null, exists: false}}",
    ],
)
def test_what_a_snapshot_writes_without_a_version_still_loads(tmp_path: Path, body: str) -> None:
    load(_written(tmp_path, f"schema: {SCHEMA}\n{body}\n"))


# ---- fuzz: whatever the bytes, a Manifest or one ManifestError --------------------------------

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
_tree = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_section_names = st.sampled_from(
    [
        "meta",
        "system",
        "python",
        "torch",
        "gpu",
        "packages",
        "git",
        "files",
        "data",
        "caches",
        "env",
        "probes",
        "other",
    ]
)
_manifests = st.dictionaries(_section_names, _tree, max_size=6).map(
    lambda d: {"schema": SCHEMA, **d}
)


def _load_or_refuse(path: Path) -> Manifest | None:
    try:
        return load(path)
    except ManifestError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path))
        return None


def _usable(a: Manifest, b: Manifest) -> None:
    """What loads must be usable by the commands that read it: diffed and rendered."""
    from envbisect.diff import diff_manifests
    from envbisect.render.diff import render

    for fmt in ("table", "json", "markdown", "yaml"):
        render(diff_manifests(a, b), fmt)


_FUZZ = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_FUZZ
@given(docs=st.tuples(_manifests, _manifests), as_json=st.booleans())
def test_fuzz_structures_load_or_fail_in_one_line(
    tmp_path: Path, docs: tuple[dict[str, Any], dict[str, Any]], as_json: bool
) -> None:
    loaded = []
    for name, doc in zip(("a.yaml", "b.yaml"), docs, strict=True):
        path = tmp_path / name
        text = json.dumps(doc) if as_json else yaml.safe_dump(doc, allow_unicode=True)
        path.write_text(text)
        loaded.append(_load_or_refuse(path))
    a, b = loaded
    if a is not None and b is not None:
        _usable(a, b)


@_FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.text(alphabet=st.sampled_from(list("&*:-[]{}!|>'\"#%@` \n\tab1<?,")), max_size=200).map(
            lambda t: (f"schema: {SCHEMA}\n" + t).encode()
        ),
    )
)
def test_fuzz_bytes_load_or_fail_in_one_line(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    manifest = _load_or_refuse(path)
    if manifest is not None:
        _usable(manifest, Manifest(sections={"packages": {"x": {"version": "1"}}}))
