"""render.py: golden outputs for every format on the fixture pairs.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest tests/render/test_render.py``
and review the diff of tests/golden/ before committing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import pytest
import yaml

from envbisect.diff import DiffResult, diff_manifests
from envbisect.model import manifest
from envbisect.render.diff import FORMATS, render
from envbisect.run.shown import show_value

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SUFFIX = {"table": "txt", "markdown": "md", "json": "json", "yaml": "yaml"}


def result_for(pair: str, monkeypatch: pytest.MonkeyPatch, **kw: object) -> DiffResult:
    # Paths are shown as given: load them relative to the repo root so goldens are portable.
    monkeypatch.chdir(ROOT)
    good = manifest.load(f"fixtures/diff/{pair}/good.yaml")
    bad = manifest.load(f"fixtures/diff/{pair}/bad.yaml")
    return diff_manifests(good, bad, **kw)  # type: ignore[arg-type]


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("pair", ["seed", "kinds"])
def test_golden(pair: str, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check_golden(f"diff_{pair}.{SUFFIX[fmt]}", render(result_for(pair, monkeypatch), fmt))


def test_golden_all_and_section(monkeypatch: pytest.MonkeyPatch) -> None:
    result = result_for("seed", monkeypatch, include_volatile=True).select(["caches", "meta"])
    check_golden("diff_seed_all_caches_meta.txt", render(result, "table"))


def test_json_and_yaml_carry_the_same_data(monkeypatch: pytest.MonkeyPatch) -> None:
    result = result_for("kinds", monkeypatch)
    assert json.loads(render(result, "json")) == yaml.safe_load(render(result, "yaml"))
    assert json.loads(render(result, "json")) == json.loads(json.dumps(result.as_dict()))


def test_table_is_grouped_in_relevance_order(monkeypatch: pytest.MonkeyPatch) -> None:
    text = render(result_for("kinds", monkeypatch), "table")
    headers = ["torch stack", "packages", "files", "git repos", "environment", "data", "caches"]
    headers += ["probes", "python", "system", "gpu", "slurm"]
    positions = [text.index(f"\n{h}") for h in headers]
    assert positions == sorted(positions)
    assert text.rstrip().endswith(
        "→ 13 bisectable units, 12 not bisectable (6 volatile hidden; --all shows them)"
    )


def test_markdown_collapses_the_full_list(monkeypatch: pytest.MonkeyPatch) -> None:
    result = result_for("seed", monkeypatch)
    text = render(result, "markdown")
    details = text.index("<details><summary>All 48 changes</summary>")
    assert text.index("| `torch-stack`") < details < text.index("| packages  | nvidia-cublas ")
    assert text.rstrip().endswith("</details>")
    # One unit row per unit above the fold.
    assert text[:details].count("\n| `") == len(result.units)


def test_colours_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    result = result_for("kinds", monkeypatch)
    plain = render(result, "table", color=False)
    coloured = render(result, "table", color=True)
    assert "\x1b[" not in plain and "\x1b[" in coloured
    # Colours do not shift the columns (tabulate measures visible width).
    assert click.unstyle(coloured) == plain
    for fmt in ("markdown", "json", "yaml"):
        assert "\x1b[" not in render(result, fmt, color=True)


def test_secrets_never_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    result = result_for("kinds", monkeypatch)
    for fmt in ("table", "markdown"):
        text = render(result, fmt)
        assert "wandb-plain-value" not in text
        assert "<redacted>" in text


def test_no_format_shows_a_secret_a_hand_written_manifest_holds_outside_env() -> None:
    token = "hf_" + "HandWrittenToken" * 2 + "ab"
    url = "https://alice:pw-9!x@mirror.example.invalid/simple"
    good = manifest.Manifest(sections={"meta": {"label": "g"}, "site": {"index": "a", "t": "b"}})
    bad = manifest.Manifest(sections={"meta": {"label": "b"}, "site": {"index": url, "t": token}})
    result = diff_manifests(good, bad)
    assert token in repr(result.as_dict())  # the diff keeps what the manifest says...
    for fmt in FORMATS:  # ...no rendering of it shows it
        text = render(result, fmt)
        assert token not in text and "pw-9!x" not in text
        assert "mirror.example.invalid/simple" in text


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "-"),
        ({"redacted": "abcd1234"}, "<redacted>"),
        ("a" * 64, "a" * 12),
        ("0123456789abcdef0123456789abcdef01234567", "0123456789ab"),
        ("2.11.0+cu130", "2.11.0+cu130"),
        (91900, "91900"),
    ],
)
def test_show_value(value: object, shown: str) -> None:
    assert show_value(value) == shown


def test_identical_renders_summary_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    good = manifest.load("fixtures/diff/seed/good.yaml")
    result = diff_manifests(good, good)
    assert render(result, "table").rstrip().endswith("identical: no changes")
    assert "<details>" not in render(result, "markdown")
    assert json.loads(render(result, "json"))["identical"] is True


def test_cuda_wheels_fold_in_the_table_unless_the_section_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = result_for("seed", monkeypatch)
    folded = render(result, "table")
    assert "nvidia-nccl-cu13" not in folded
    assert "nvidia-*, cuda-* wheels  16 wheels     17 wheels" in folded
    assert "1 upgraded, 16 added, 15 removed" in folded
    full = render(result.select(["torch-stack"]), "table")
    assert "nvidia-nccl-cu13" in full and "nvidia-*, cuda-* wheels" not in full
    # The folded rows are still in every machine-readable format and in markdown's full list.
    assert "nvidia-nccl-cu13" in render(result, "json")
    assert "nvidia-nccl-cu13" in render(result, "markdown")


def test_json_and_yaml_name_their_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    result = result_for("kinds", monkeypatch)
    assert json.loads(render(result, "json"))["schema"] == "envbisect/diff@1"
    assert yaml.safe_load(render(result, "yaml"))["schema"] == "envbisect/diff@1"
