"""``diff`` called as its own click command: return values like diff(1), formats, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.commands import diff
from envbisect.model.errors import UsageError

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "diff" / "seed"
GOOD, BAD = str(FIX / "good.yaml"), str(FIX / "bad.yaml")


def _diff(*argv: str) -> tuple[int, str]:
    done = CliRunner().invoke(
        diff.command, list(argv), standalone_mode=False, catch_exceptions=False
    )
    return done.return_value, done.output


def test_two_manifests_give_units_and_1_the_same_one_gives_0() -> None:
    code, out = _diff(GOOD, BAD)
    assert code == 1
    assert "48 changes in 7 sections → 7 bisectable units" in out
    code, out = _diff(GOOD, GOOD)
    assert code == 0 and "identical: no changes" in out


def test_json_and_section_selection() -> None:
    code, out = _diff(GOOD, BAD, "--format", "json", "--section", "env")
    doc = json.loads(out)
    assert code == 1
    assert [u["id"] for u in doc["units"]] == ["env:PYTORCH_CUDA_ALLOC_CONF"]
    assert doc["units"][0]["changes"][0]["new"] == "expandable_segments:True"


def test_print_command_with_two_manifests_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--print-command prints the snapshot command"):
        _diff(GOOD, BAD, "--print-command")
