"""`envbisect snapshot` on the command line: output places, summary, errors, print-command."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers_collect import make_repo

from envbisect.cli import cli, main
from envbisect.model.manifest import load

PY = sys.executable


def test_stdout_output_is_a_loadable_manifest(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    repo = make_repo(tmp_path / "repo")
    result = CliRunner().invoke(
        cli, ["snapshot", "--python", PY, "-o", "-", "--repo", "repo", "--label", "good"]
    )
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert data["schema"] == "envbisect/manifest@1"
    assert data["meta"]["label"] == "good"
    assert str(repo) in data["git"]
    assert "snapshot 'good'" in result.stderr
    assert not (tmp_path / "manifests").exists()


def test_default_output_goes_to_manifests_dir_of_the_config(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "envbisect.yaml").write_text(
        "label: base\nfiles: [train.py]\nkeep_blobs: true\nmanifests_dir: snaps\n"
    )
    (tmp_path / "train.py").write_text("print('hi')\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    result = CliRunner().invoke(cli, ["snapshot", "--python", PY])
    assert result.exit_code == 0, result.output
    path = Path(result.stdout.strip())
    assert path.parent == tmp_path / "snaps" and path.name.startswith("base-")
    m = load(path)
    entry = m.section("files")[str(tmp_path / "train.py")]
    assert (tmp_path / "snaps" / "blobs" / entry["blob"]).read_text() == "print('hi')\n"
    assert "1 file(s)" in result.stderr


def test_print_command_prints_the_composed_argv_and_runs_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["snapshot", "--python", "/opt/py 3/bin/python", "--print-command"]
    )
    assert result.exit_code == 0
    assert shlex.split(result.stdout) == ["/opt/py 3/bin/python", "-"]


def test_bad_config_exits_2_with_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "envbisect.yaml").write_text("repos: 3\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["snapshot", "--python", PY, "-o", "-"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "envbisect.yaml: field 'repos'" in err


def test_unreachable_python_exits_2_with_one_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["snapshot", "--python", str(tmp_path / "no-python"), "-o", "-"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-python" in err


def test_python_m_envbisect_snapshot_as_a_real_process(tmp_path: Path) -> None:
    out = tmp_path / "m.yaml"
    proc = subprocess.run(
        [PY, "-m", "envbisect", "snapshot", "--python", PY, "-o", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    assert load(out).section("python")["executable"] == PY
    assert "packages" in proc.stderr
