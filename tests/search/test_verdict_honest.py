"""Honest verdicts (issue 24): a state that cannot be built is never "bad"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.cli import cli
from tests.helpers_run import Scenario, pkg, resign

pytestmark = pytest.mark.slow


def test_a_package_that_cannot_be_built_is_unresolved_never_the_culprit(tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==2.0")
    # 9.9 is listed where the run looks (so the sources' pre-check passes) but its wheel is
    # not a zip archive: the bad side cannot be built here.
    (sc.wheels / "ebwork-9.9-py3-none-any.whl").write_bytes(b"not a wheel\n")
    sc.write(
        good={"packages": {"ebwork": pkg("2.0")}},
        bad={"packages": {"ebwork": pkg("9.9")}},
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    out = tmp_path / "result.json"
    argv = [
        "run", "--config", str(sc.config), "--python", sc.python,
        "--session", str(tmp_path / "session"), "--json", str(out), "--bad", str(sc.bad),
        "--repeats", "1", "--", "python", str(sc.repo / "train.py"),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    doc = json.loads(out.read_text())
    assert doc["culprits"] == [], doc
    assert res.return_value != 0 and doc["outcome"] != "found"
    trials = doc["trials"]
    built = [t for t in trials if "build:" in str(t.get("failure") or "")]
    assert built and all(t["verdict"] == "unresolved" for t in built), trials


def test_a_cache_dir_that_moved_between_snapshots_is_one_cache_unit(tmp_path: Path) -> None:
    import yaml

    sc = Scenario(tmp_path)
    sc.venv("ebwork==2.0")
    old_cache = tmp_path / "old-inductor"
    (old_cache / "fx").mkdir(parents=True)
    (old_cache / "fx" / "entry").write_text("compiled\n")
    sc.write(
        good={
            "packages": {"ebwork": pkg("2.0")},
            "env": {"TORCHINDUCTOR_CACHE_DIR": str(old_cache)},
        },
        bad={
            "packages": {"ebwork": pkg("2.0")},
            "env": {"TORCHINDUCTOR_CACHE_DIR": str(sc.inductor), "EB_SLOW": "8"},
        },
        loose_good=b"a\n",
        loose_bad=b"a\n",
    )
    good = yaml.safe_load(sc.good.read_text())
    good["caches"]["inductor"]["path"] = str(old_cache)
    sc.good.write_text(yaml.safe_dump(good))
    resign(sc.good)
    cfg = yaml.safe_load(sc.config.read_text())
    cfg["caches"] = {"inductor": str(sc.inductor), "old": str(old_cache)}
    sc.config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "result.json"
    argv = [
        "run", "--config", str(sc.config), "--python", sc.python,
        "--session", str(tmp_path / "session"), "--json", str(out), "--bad", str(sc.bad),
        "--repeats", "1", "--", "python", str(sc.repo / "train.py"),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    doc = json.loads(out.read_text())
    assert "not faithful" not in res.output and "unfaithful" not in doc["outcome"], res.output
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_SLOW"], res.output
    units = {u["id"]: u for u in doc["diff"]["units"]} if "diff" in doc else {}
    if units:
        assert "env:TORCHINDUCTOR_CACHE_DIR" not in units
