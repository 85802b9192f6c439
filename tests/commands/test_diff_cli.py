"""`envbisect diff` on the command line: exit codes like diff(1), formats, errors, fresh state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from envbisect.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "diff"
SEED_GOOD, SEED_BAD = str(FIX / "seed" / "good.yaml"), str(FIX / "seed" / "bad.yaml")
PY = sys.executable


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_different_exits_1_with_table_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["diff", SEED_GOOD, SEED_BAD], capsys)
    assert code == 1 and err == ""
    assert out.splitlines()[-1].startswith("48 changes in 7 sections → 7 bisectable units")
    assert "upgraded; CUDA variant cu128 → cu130" in out
    assert "\x1b[" not in out  # not a terminal: no colours


def test_identical_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["diff", SEED_GOOD, SEED_GOOD], capsys)
    assert code == 0 and out.rstrip().endswith("identical: no changes")


def test_volatile_only_is_identical_unless_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load(Path(SEED_GOOD).read_text())
    data["meta"]["created"] = "2031-01-01T00:00:00Z"
    other = tmp_path / "later.yaml"
    other.write_text(yaml.safe_dump(data, sort_keys=False))
    assert run(["diff", SEED_GOOD, str(other)], capsys)[0] == 0
    code, out, _ = run(["diff", SEED_GOOD, str(other), "--all"], capsys)
    assert code == 1 and "2031-01-01T00:00:00Z" in out


def test_json_is_clean_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["diff", SEED_GOOD, SEED_BAD, "--format", "json"], capsys)
    data = json.loads(out)
    assert code == 1
    assert [u["id"] for u in data["units"]][:2] == ["torch-stack", "packages:transformers"]
    assert data["units"][0]["changes"][0]["note"] == "CUDA variant cu128 → cu130"


@pytest.mark.parametrize("fmt", ["markdown", "yaml"])
def test_other_formats(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["diff", SEED_GOOD, SEED_BAD, "--format", fmt], capsys)
    assert code == 1
    if fmt == "yaml":
        assert yaml.safe_load(out)["units"][0]["id"] == "torch-stack"
    else:
        assert "<details>" in out


def test_section_filter_decides_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["diff", SEED_GOOD, SEED_BAD, "--section", "env"], capsys)
    assert code == 1 and "PYTORCH_CUDA_ALLOC_CONF" in out and "transformers" not in out
    code, out, _ = run(["diff", SEED_GOOD, SEED_BAD, "--section", "gpu"], capsys)
    assert code == 0 and "identical" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([str(FIX / "nope.yaml"), SEED_BAD], "nope.yaml: no such manifest file"),
        ([str(FIX / "broken" / "newer-schema.yaml"), SEED_BAD], "field 'schema'"),
        ([SEED_GOOD, str(FIX / "broken" / "no-schema.yaml")], "field 'schema' is missing"),
        ([SEED_GOOD, str(FIX / "broken" / "malformed.yaml")], "malformed YAML at line"),
        ([SEED_GOOD, str(FIX / "broken" / "bad-entry.yaml")], "field 'files./etc/hosts'"),
        ([SEED_GOOD, SEED_BAD, "--section", "bogus"], "--section 'bogus' is not a section"),
        ([SEED_GOOD, SEED_BAD, "--print-command"], "--print-command"),
    ],
)
def test_errors_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["diff", *args], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("envbisect: error: ") and message in err


def test_bad_format_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["diff", SEED_GOOD, SEED_BAD, "--format", "html"], capsys)
    assert code == 2 and "'html' is not one of" in err


def test_python_m_envbisect_diff_as_a_real_process() -> None:
    proc = subprocess.run(
        [PY, "-m", "envbisect", "diff", SEED_GOOD, str(FIX / "broken" / "malformed.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "malformed.yaml: malformed YAML" in proc.stderr
    proc = subprocess.run(
        [PY, "-m", "envbisect", "diff", SEED_GOOD, SEED_BAD, "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and json.loads(proc.stdout)["identical"] is False


def test_one_manifest_compares_with_a_fresh_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real collector in this interpreter: snapshot, change the env, diff against 'now'."""
    (tmp_path / "envbisect.yaml").write_text("files: [model.py]\nkeep_blobs: true\n")
    (tmp_path / "model.py").write_text("def forward(x):\n    return x\n")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(["snapshot", "--python", PY, "--label", "good", "-o", "good.yaml"], capsys)
    assert code == 0
    args = ["diff", "good.yaml", "--python", PY, "--section", "env", "--section", "files"]
    code, out, _ = run(args, capsys)
    assert code == 0, out
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    (tmp_path / "model.py").write_text("def forward(x):\n    return x * 2\n")
    code, out, _ = run([*args, "--format", "json"], capsys)
    assert code == 1
    data = json.loads(out)
    assert data["bad"]["path"] is None and data["bad"]["label"] == "now"
    units = {u["id"]: u for u in data["units"]}
    assert set(units) == {"env:PYTORCH_CUDA_ALLOC_CONF", f"files:{tmp_path / 'model.py'}"}
    assert units["env:PYTORCH_CUDA_ALLOC_CONF"]["changes"][0]["kind"] == "added"
    assert units[f"files:{tmp_path / 'model.py'}"]["bisectable"] is True  # good blob kept


def test_print_command_with_one_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["diff", SEED_GOOD, "--python", "/opt/py 3/bin/python", "--print-command"], capsys
    )
    assert code == 0 and out.strip() == "'/opt/py 3/bin/python' -"


def test_json_encoded_manifests_diff_like_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON is YAML: manifest.load takes a JSON-encoded manifest on its fast path."""
    paths = []
    for name in ("good", "bad"):
        data = yaml.safe_load((FIX / "seed" / f"{name}.yaml").read_text())
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        paths.append(str(path))
    code, out, _ = run(["diff", *paths, "--format", "json"], capsys)
    from_yaml = json.loads(run(["diff", SEED_GOOD, SEED_BAD, "--format", "json"], capsys)[1])
    assert code == 1
    assert json.loads(out)["units"] == from_yaml["units"]
