"""Below a guilty package unit: the torch stack's component, the first bad release.

End-to-end runs with real uv venvs and real wheels built here: a "stack" of tiny wheels
named as torch's components (a fake ``torch`` only inside the test's own venv, which has no
real torch), and a package with several releases of which one in the middle makes the
workload really compute more. Pure parts (the stack's components and pins, the search over
ordered items, the wording of both directions) are tested without a run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from packaging.version import Version

from envbisect.cli import cli
from envbisect.model.changes import Change, ChangeKind, Unit
from envbisect.search.narrow import first_bad
from envbisect.search.pkgrun import ReleaseSearch, _cuda_note
from envbisect.search.releases import releases_between
from envbisect.search.verdict import Verdict
from envbisect.sections.torch_stack import components, outside_pins
from tests.helpers_run import SLOWDOWN, Scenario, build_wheel, pkg

STACK_MODULES = "ebwork,torch,triton,nvidia_fake_ebstack"


def _run(sc: Scenario, *extra: str) -> tuple[Any, dict[str, Any]]:
    out = sc.tmp / "result.json"
    argv = [
        "run",
        "--config",
        str(sc.config),
        "--python",
        sc.python,
        "--session",
        str(sc.tmp / "session"),
        "--json",
        str(out),
        "--report",
        str(sc.tmp / "report.md"),
        "--bad",
        str(sc.bad),
        *extra,
        "--",
        "python",
        str(sc.repo / "train.py"),
    ]
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    return res, json.loads(out.read_text()) if out.exists() else {}


def _write(sc: Scenario, good: dict[str, Any], bad: dict[str, Any]) -> None:
    git = sc.git_entry(sc.commits[0])
    sc.write(
        good={"packages": good, "git": git},
        bad={"packages": bad, "git": git},
        loose_good=b"lr = 0.1\n",
        loose_bad=b"lr = 0.1\n",
    )


@pytest.mark.slow
def test_a_guilty_torch_stack_is_split_to_the_component_that_made_it_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sc = Scenario(tmp_path)
    w = sc.wheels
    # torch pins its companions exactly, as real torch does; triton 2.0 computes 8x more.
    build_wheel(w, "torch", "1.0", "WORK = 1\n", ("triton==1.0", "nvidia-fake-ebstack==1.0"))
    build_wheel(
        w, "torch", "2.0+cpu", "WORK = 1  # b\n", ("triton==2.0", "nvidia-fake-ebstack==2.0")
    )
    build_wheel(w, "triton", "1.0", "WORK = 1\n")
    build_wheel(w, "triton", "2.0", f"WORK = {SLOWDOWN}  # slow\n")
    build_wheel(w, "nvidia-fake-ebstack", "1.0", "WORK = 1\n")
    build_wheel(w, "nvidia-fake-ebstack", "2.0", "WORK = 1  # same\n")
    build_wheel(w, "nvidia-fake-ebkept", "1.0", "X = 1\n")
    stack = ("torch==2.0+cpu", "triton==2.0", "nvidia-fake-ebstack==2.0", "nvidia-fake-ebkept==1.0")
    sc.venv("ebwork==1.0", *stack)
    monkeypatch.setenv("EB_WORK_MODULES", STACK_MODULES)
    kept = {"nvidia-fake-ebkept": pkg("1.0"), "ebwork": pkg("1.0")}
    good = {"torch": pkg("1.0"), "triton": pkg("1.0"), "nvidia-fake-ebstack": pkg("1.0")}
    bad = {"torch": pkg("2.0+cpu"), "triton": pkg("2.0"), "nvidia-fake-ebstack": pkg("2.0")}
    _write(sc, {**good, **kept}, {**bad, **kept})

    res, doc = _run(sc)

    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["torch-stack"]
    stack_doc = doc["culprits"][0]["within"]["stack"]
    assert stack_doc["culprit"]["component"] == "triton"
    sentence = "culprit within the torch stack: triton (1.0 → 2.0)"
    assert stack_doc["sentence"] == sentence
    assert sentence in res.stdout  # the text report
    assert sentence in res.stderr  # progress
    pin = "triton 1.0 with torch 2.0+cpu is outside torch's pin (==2.0): result may not be"
    assert any(pin in w for w in stack_doc["outside_pins"]), stack_doc
    assert pin in res.stderr
    # The CUDA wheels are said: changed, and one stayed beside a +cpu torch.
    assert "the CUDA runtime wheels changed (nvidia-fake-ebstack 1.0 → 2.0)" in res.stdout
    assert "1 CUDA wheel(s) stayed installed beside torch 2.0+cpu (nvidia-fake-ebkept)" in (
        res.stdout
    )
    # triton has only the two endpoint releases: no release search, said so.
    release = doc["culprits"][0]["within"]["release"]
    assert release["package"] == "triton" and release["releases"] == []
    assert release["trials"] == 0
    no_search = "no release of triton lies between 1.0 and 2.0 in the configured sources"
    assert no_search in res.stdout
    split_rows = [t for t in doc["trials"] if t["purpose"] == "narrow: torch stack"]
    # 3 components: dd needs at most 2 splits and the culprit alone.
    assert 1 <= len(split_rows) <= 3
    assert "torch-stack[triton]" in {a for t in split_rows for a in t["applied"]}
    assert "culprit within the torch stack: triton" in (sc.tmp / "report.md").read_text()


FAKE_TORCH_2 = """import nvidia_fake_ebstack
if nvidia_fake_ebstack.ABI != 2:
    raise ImportError("libtorch_fake.so: undefined symbol: ebstack_v2 (CUDA wheels too old)")
WORK = %d
"""


@pytest.mark.slow
def test_torch_itself_then_its_first_bad_release_with_mixes_that_do_not_import_unresolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sc = Scenario(tmp_path)
    w = sc.wheels
    old_pins = ("triton==1.0", "nvidia-fake-ebstack==1.0")
    mid_pins = ("triton==2.0", "nvidia-fake-ebstack==1.5")  # neither endpoint's CUDA wheel
    new_pins = ("triton==2.0", "nvidia-fake-ebstack==2.0")
    build_wheel(w, "torch", "1.0", "WORK = 1\n", old_pins)
    build_wheel(w, "torch", "1.5", "WORK = 1  # still fast\n", mid_pins)
    build_wheel(w, "torch", "1.8", f"WORK = {SLOWDOWN}  # the slow one\n", mid_pins)
    build_wheel(w, "torch", "2.0+cpu", FAKE_TORCH_2 % SLOWDOWN, new_pins)
    build_wheel(w, "triton", "1.0", "WORK = 1\n")
    build_wheel(w, "triton", "2.0", "WORK = 1  # same speed\n")
    build_wheel(w, "nvidia-fake-ebstack", "1.0", "WORK = 1\nABI = 1\n")
    build_wheel(w, "nvidia-fake-ebstack", "1.5", "WORK = 1\nABI = 1  # 1.5\n")
    build_wheel(w, "nvidia-fake-ebstack", "2.0", "WORK = 1\nABI = 2  # new\n")
    sc.venv("ebwork==1.0", "torch==2.0+cpu", "triton==2.0", "nvidia-fake-ebstack==2.0")
    monkeypatch.setenv("EB_WORK_MODULES", STACK_MODULES)
    good = {"torch": pkg("1.0"), "triton": pkg("1.0"), "nvidia-fake-ebstack": pkg("1.0")}
    bad = {"torch": pkg("2.0+cpu"), "triton": pkg("2.0"), "nvidia-fake-ebstack": pkg("2.0")}
    _write(sc, {**good, "ebwork": pkg("1.0")}, {**bad, "ebwork": pkg("1.0")})

    res, doc = _run(sc)

    assert res.return_value == 0, res.output
    within = doc["culprits"][0]["within"]
    assert within["stack"]["culprit"]["component"] == "torch itself"
    assert "culprit within the torch stack: torch itself (1.0 → 2.0+cpu)" in res.stdout
    # torch 2.0 on the old CUDA wheels does not import: unresolved, never taken as slow.
    split = [t for t in doc["trials"] if t["purpose"] == "narrow: torch stack"]
    failed = [t for t in split if t["failure"]]
    assert failed and all(t["verdict"] == "unresolved" for t in failed), split
    assert "does not import" in failed[0]["failure"]
    assert "undefined symbol: ebstack_v2" in failed[0]["failure"]
    release = within["release"]
    assert release["releases"] == ["1.5", "1.8"]
    assert release["first_bad"] == "1.8"
    assert "first bad release: torch 1.8 (1.5 is the last fast one)" in res.stdout
    assert release["trials"] <= math.ceil(math.log2(2)) + 1
    # Each release ran with the companions it pins (CUDA wheel 1.5, which neither endpoint
    # has), resolved by uv against the sources: inside its pins (the state check verified
    # the versions installed).
    assert "resolved for each release with uv pip compile" in release["note"]
    assert "1.8: nvidia-fake-ebstack 1.5, triton 2.0" in release["note"]
    assert release["outside_pins"] == []


@pytest.mark.slow
def test_the_first_bad_release_between_the_endpoints_is_named_within_the_bound(
    tmp_path: Path,
) -> None:
    sc = Scenario(tmp_path)
    # ebwork: 1.0 and 2.0 fast, 3.0 slow (Scenario); in between 2.1 fast, 2.2 and 2.5 slow.
    build_wheel(sc.wheels, "ebwork", "2.1", "WORK = 1  # still fast\n")
    build_wheel(sc.wheels, "ebwork", "2.2", f"WORK = {SLOWDOWN}  # the slow one\n")
    build_wheel(sc.wheels, "ebwork", "2.5", f"WORK = {SLOWDOWN}  # slow since 2.2\n")
    build_wheel(sc.wheels, "ebwork", "2.6rc1", "WORK = 1  # a pre-release: never tried\n")
    sc.venv("ebwork==3.0", "ebonly==1.0")
    _write(sc, {"ebwork": pkg("1.0")}, {"ebwork": pkg("3.0"), "ebonly": pkg("1.0")})

    res, doc = _run(sc)

    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["packages:ebwork"]
    release = doc["culprits"][0]["within"]["release"]
    assert release["releases"] == ["2.0", "2.1", "2.2", "2.5"]
    assert release["first_bad"] == "2.2" and release["last_good"] == "2.1"
    assert "first bad release: ebwork 2.2 (2.1 is the last fast one)" in res.stdout
    rows = [t for t in doc["trials"] if t["purpose"] == "narrow: releases of ebwork"]
    r = len(release["releases"])
    assert 1 <= len(rows) == release["trials"] <= math.ceil(math.log2(r)) + 1
    assert {a for t in rows for a in t["applied"]} <= {
        f"packages:ebwork[ebwork=={v}]" for v in release["releases"]
    }
    assert "first bad release: ebwork 2.2" in (sc.tmp / "report.md").read_text()


@pytest.mark.slow
def test_with_find_all_each_guilty_package_gets_its_release_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sc = Scenario(tmp_path)
    build_wheel(sc.wheels, "ebwork", "2.1", "WORK = 1  # still fast\n")
    build_wheel(sc.wheels, "ebwork", "2.2", f"WORK = {SLOWDOWN}  # the slow one\n")
    build_wheel(sc.wheels, "ebslow", "1.0", "WORK = 1\n")
    build_wheel(sc.wheels, "ebslow", "1.5", f"WORK = {SLOWDOWN}  # slow from here\n")
    build_wheel(sc.wheels, "ebslow", "2.0", f"WORK = {SLOWDOWN}  # still slow\n")
    sc.venv("ebwork==3.0", "ebslow==2.0")
    monkeypatch.setenv("EB_WORK_MODULES", "ebwork,ebslow")
    monkeypatch.setenv("EB_TOKENS", "2000")
    good = {"ebwork": pkg("1.0"), "ebslow": pkg("1.0")}
    _write(sc, good, {"ebwork": pkg("3.0"), "ebslow": pkg("2.0")})

    res, doc = _run(sc, "--find-all", "--until", "50%")  # each alone is 8x slower, both 64x

    assert res.return_value == 0, res.output
    within = {c["unit"]: c["within"]["release"] for c in doc["culprits"]}
    assert set(within) == {"packages:ebwork", "packages:ebslow"}, res.output
    assert within["packages:ebwork"]["first_bad"] == "2.2"
    assert within["packages:ebslow"]["first_bad"] == "1.5"
    assert "first bad release: ebslow 1.5 (1.0 is the last fast one)" in res.stdout


@pytest.mark.slow
def test_the_release_search_counts_in_max_trials(tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    build_wheel(sc.wheels, "ebwork", "2.1", "WORK = 1  # still fast\n")
    build_wheel(sc.wheels, "ebwork", "2.2", f"WORK = {SLOWDOWN}  # the slow one\n")
    sc.venv("ebwork==3.0", "ebonly==1.0")
    _write(sc, {"ebwork": pkg("1.0")}, {"ebwork": pkg("3.0"), "ebonly": pkg("1.0")})

    res, doc = _run(sc, "--max-trials", "5")

    assert res.return_value == 0, res.output
    assert len(doc["trials"]) == 5  # 2 endpoints, 2 to isolate and confirm, 1 release
    release = doc["culprits"][0]["within"]["release"]
    assert release["trials"] == 1 and release["budget_spent"]
    assert release["first_bad"] is None
    assert len(release["candidates"]) >= 2
    assert "first bad release of ebwork: one of " in res.stdout
    assert "(--max-trials reached)" in res.stdout
    # --resume replays the five (the release trial by its position too) and goes on.
    res, doc = _run(sc, "--resume")
    assert res.return_value == 0, res.output
    assert res.stderr.count("replayed from the session log") == 5
    release = doc["culprits"][0]["within"]["release"]
    assert release["first_bad"] == "2.2", release


# ---------------------------------------------------------------------------- pure parts


def _change(key: str, old: str | None, new: str | None) -> Change:
    return Change("packages", key, old, new, ChangeKind.UPGRADED)


def test_stack_components_torch_first_then_triton_cuda_and_the_rest() -> None:
    unit = Unit(
        "torch-stack",
        "torch-stack",
        "torch stack",
        (
            _change("torchvision", "0.28.0", "0.29.0"),
            _change("torch", "2.13.0+cpu", "2.14.1"),
            Change("torch", "version", "2.13.0+cpu", "2.14.1", ChangeKind.CHANGED),
            _change("nvidia-cublas-cu12", None, "12.9"),
            _change("cuda-bindings", None, "13.0"),
            _change("pytorch-triton", "3.6.0", "3.7.0"),
        ),
        True,
    )
    comps = components(unit)
    assert [c.name for c in comps] == [
        "torch itself",
        "triton",
        "the CUDA runtime wheels",
        "torchvision",
    ]
    assert comps[0].describe() == "torch itself (2.13.0+cpu → 2.14.1)"
    assert comps[2].keys == ("nvidia-cublas-cu12", "cuda-bindings")
    assert comps[2].describe().startswith("the CUDA runtime wheels (2 changed: ")


def test_cuda_wheels_beside_a_cpu_torch_are_said_even_when_unchanged() -> None:
    from envbisect.model.manifest import Manifest

    bad = Manifest.from_dict(
        {
            "schema": "envbisect/manifest@1",
            "packages": {
                "torch": {"version": "2.13.0+cpu"},
                "nvidia-cublas": {"version": "13.1.0.3"},
                "cuda-bindings": {"version": "13.0.3"},
            },
        },
        "bad.yaml",
    )
    torch_only = Unit(
        "torch-stack", "torch-stack", "t", (_change("torch", "2.14.1", "2.13.0+cpu"),), True
    )
    note = _cuda_note(components(torch_only), bad)
    assert note == (
        "2 CUDA wheel(s) stayed installed beside torch 2.13.0+cpu (cuda-bindings, "
        "nvidia-cublas): a +cpu torch does not use them"
    )


def test_outside_pins_reads_requires_dist_and_skips_extras() -> None:
    requires = [
        'pytorch-triton==3.7.0; platform_system == "Linux"',
        'nvidia-cublas-cu12==12.9; platform_system == "Linux"',
        'opt-einsum>=3.3; extra == "opt-einsum"',
    ]
    versions = {"pytorch-triton": "3.6.0", "nvidia-cublas-cu12": None, "opt-einsum": "1.0"}
    lines = outside_pins("2.14.1", requires, versions)
    import sys

    if sys.platform != "linux":  # the markers say Linux
        assert lines == []
        return
    assert lines == [
        "nvidia-cublas-cu12 is absent with torch 2.14.1, which pins it (==12.9): result may "
        "not be meaningful",
        "pytorch-triton 3.6.0 with torch 2.14.1 is outside torch's pin (==3.7.0): result may "
        "not be meaningful",
    ]
    assert outside_pins("2.14.1+cpu", requires, {"pytorch-triton": "3.7.0"}) == []


def test_releases_between_compare_public_versions_and_follow_the_direction() -> None:
    available = [Version(v) for v in ("2.12.0", "2.13.0", "2.13.0+cpu", "2.14.0", "2.14.1")]
    assert releases_between("2.13.0+cpu", "2.14.1", available) == ["2.14.0"]
    assert releases_between("2.14.1", "2.13.0+cpu", available) == ["2.14.0"]
    more = [*available, Version("2.13.1"), Version("2.14.0rc1")]
    assert releases_between("2.14.1", "2.12.0", more) == ["2.14.0", "2.13.1", "2.13.0"]
    assert releases_between("1.0", "2.0", [Version("1.0"), Version("2.0")]) == []
    # Between two +cpu builds, the +cpu build of a release; else the plain one.
    builds = [Version(v) for v in ("2.14.0", "2.14.0+cpu", "2.14.0+cu130", "2.14.1+cu130")]
    assert releases_between("2.13.0+cpu", "2.15.0+cpu", builds) == ["2.14.0+cpu", "2.14.1+cu130"]
    assert releases_between("2.13.0", "2.15.0", builds) == ["2.14.0", "2.14.1+cu130"]


def test_first_bad_is_binary_search_and_skips_unresolved_items() -> None:
    truth = [Verdict.GOOD, Verdict.GOOD, Verdict.BAD, Verdict.BAD, Verdict.BAD]
    calls: list[int] = []

    def test(p: int) -> Verdict:
        calls.append(p)
        return truth[p]

    found = first_bad(len(truth), test)
    assert found.first_bad == 2
    assert len(calls) <= math.ceil(math.log2(len(truth)))
    assert 4 not in calls  # the last item is the bad endpoint: never tested
    mixed = [Verdict.GOOD, Verdict.UNRESOLVED, Verdict.GOOD, Verdict.BAD, Verdict.BAD]
    skipping = first_bad(len(mixed), lambda p: mixed[p])
    assert skipping.first_bad == 3  # item 1 skipped, item 2 measured good past it
    assert (1, Verdict.UNRESOLVED) in skipping.tested
    hidden = first_bad(3, lambda p: Verdict.UNRESOLVED)
    assert hidden.first_bad is None and hidden.candidates == (0, 1, 2)
    assert first_bad(8, lambda p: Verdict.GOOD, budget=1).spent


def test_release_wording_in_both_directions() -> None:
    up = ReleaseSearch("torch", "2.13.0+cpu", "2.14.1", ("2.14.0",), first_bad="2.14.0")
    assert up.sentence() == "first bad release: torch 2.14.0 (2.13.0+cpu is the last fast one)"
    down = ReleaseSearch("torch", "2.14.1", "2.13.0+cpu", ("2.14.0",), first_bad="2.13.0+cpu")
    assert down.sentence() == (
        "first bad release going down from 2.14.1: torch 2.13.0+cpu is the newest slow "
        "release; torch 2.14.0 fixed it (every release from 2.14.0 up is fast)"
    )
    assert down.as_dict()["direction"] == "downgrade"
    assert down.as_dict()["last_good"] == "2.14.0"
