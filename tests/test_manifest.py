"""Loading and saving manifests: one clear line naming the file and the field on bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from envbisect.errors import ManifestError
from envbisect.manifest import SCHEMA, Manifest, load, save

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "manifests"


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
        "from envbisect.manifest import load\n"
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
    from envbisect import manifest as mf

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
