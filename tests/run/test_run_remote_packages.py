"""Below a guilty package on a target reached through layers (issue 33): the torch stack
split with torch's pins read on the target, and the first bad release, through a real sshd
on 127.0.0.1 (and the fake ``pct exec``). The scenarios are test_pkgrun's, run remotely;
``env HOME=... EB_WORK_MODULES=...`` as the innermost layer keeps the remote session dir in
the test's tmp dir and tells the far workload which modules do the work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers_ssh import (  # the same module object as test_transport_ssh's: one sshd
    SshServer,
    sshd_server,  # noqa: F401 - a pytest fixture, used by name
)

from envbisect.cli import cli
from tests.helpers_run import SLOWDOWN, Scenario, build_wheel, pkg

pytestmark = pytest.mark.slow

STACK_MODULES = "ebwork,torch,triton,nvidia_fake_ebstack"


def _run(sc: Scenario, via: list[str], modules: str | None = None) -> tuple[Any, dict[str, Any]]:
    home = sc.tmp / "far-home"
    home.mkdir(exist_ok=True)
    inner = f"env HOME={home}" + (f" EB_WORK_MODULES={modules}" if modules else "")
    out = sc.tmp / "result.json"
    argv = [
        "run", "--config", str(sc.config), "--python", sc.python,
        "--session", str(sc.tmp / "session"), "--json", str(out), "--bad", str(sc.bad),
        *[w for v in [*via, inner] for w in ("--via", v)],
        "--", "python", str(sc.repo / "train.py"),
    ]  # fmt: skip
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


def test_the_first_bad_release_is_found_through_ssh(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
) -> None:
    sc = Scenario(tmp_path)
    # ebwork: 1.0 and 2.0 fast, 3.0 slow (Scenario); in between 2.1 fast, 2.2 and 2.5 slow.
    build_wheel(sc.wheels, "ebwork", "2.1", "WORK = 1  # still fast\n")
    build_wheel(sc.wheels, "ebwork", "2.2", f"WORK = {SLOWDOWN}  # the slow one\n")
    build_wheel(sc.wheels, "ebwork", "2.5", f"WORK = {SLOWDOWN}  # slow since 2.2\n")
    sc.venv("ebwork==3.0", "ebonly==1.0")
    _write(sc, {"ebwork": pkg("1.0")}, {"ebwork": pkg("3.0"), "ebonly": pkg("1.0")})

    res, doc = _run(sc, [sshd_server.via])

    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["packages:ebwork"]
    release = doc["culprits"][0]["within"]["release"]
    assert release["releases"] == ["2.0", "2.1", "2.2", "2.5"]
    assert release["first_bad"] == "2.2" and release["last_good"] == "2.1", res.output
    assert "first bad release: ebwork 2.2 (2.1 is the last fast one)" in res.stdout
    rows = [t for t in doc["trials"] if t["purpose"] == "narrow: releases of ebwork"]
    assert rows and all(t["failure"] is None for t in rows), res.output
    # Each release was installed in a venv built on the target, by its uv.
    venvs = list((sc.tmp / "far-home").glob(".envbisect/session-*/venvs/*"))
    assert len(venvs) >= 2 + len(rows), venvs


@pytest.mark.parametrize("chain", ["ssh", "ssh+pct"])
def test_a_guilty_torch_stack_is_split_with_torchs_pins_read_on_the_target(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
    chain: str,
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
    sc.venv("ebwork==1.0", "torch==2.0+cpu", "triton==2.0", "nvidia-fake-ebstack==2.0")
    good = {"torch": pkg("1.0"), "triton": pkg("1.0"), "nvidia-fake-ebstack": pkg("1.0")}
    bad = {"torch": pkg("2.0+cpu"), "triton": pkg("2.0"), "nvidia-fake-ebstack": pkg("2.0")}
    _write(sc, {**good, "ebwork": pkg("1.0")}, {**bad, "ebwork": pkg("1.0")})
    via = {"ssh": [sshd_server.via], "ssh+pct": [sshd_server.via, "pct exec 200 --"]}[chain]

    res, doc = _run(sc, via, STACK_MODULES)

    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["torch-stack"], res.output
    stack_doc = doc["culprits"][0]["within"]["stack"]
    assert stack_doc["culprit"]["component"] == "triton", res.output
    # A mix outside torch's pins is said: the pins were read from the venv on the target.
    pin = "triton 1.0 with torch 2.0+cpu is outside torch's pin (==2.0): result may not be"
    assert any(pin in x for x in stack_doc["outside_pins"]), stack_doc
    assert pin in res.stderr
    assert list((sc.tmp / "session" / "remote").glob("pins*.stdout")), "asked on the target"


FAKE_TORCH_2 = """import nvidia_fake_ebstack
if nvidia_fake_ebstack.ABI != 2:
    raise ImportError("libtorch_fake.so: undefined symbol: ebstack_v2 (CUDA wheels too old)")
WORK = %d
"""


def test_torchs_first_bad_release_runs_with_companions_the_targets_uv_resolved(
    tmp_path: Path,
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
) -> None:
    """torch itself is guilty; each of its releases between the endpoints is tried with the
    companions it pins, resolved by ``uv pip compile`` on the target (a CUDA wheel 1.5 that
    neither endpoint has)."""
    sc = Scenario(tmp_path)
    w = sc.wheels
    mid_pins = ("triton==2.0", "nvidia-fake-ebstack==1.5")
    build_wheel(w, "torch", "1.0", "WORK = 1\n", ("triton==1.0", "nvidia-fake-ebstack==1.0"))
    build_wheel(w, "torch", "1.5", "WORK = 1  # still fast\n", mid_pins)
    build_wheel(w, "torch", "1.8", f"WORK = {SLOWDOWN}  # the slow one\n", mid_pins)
    build_wheel(
        w, "torch", "2.0+cpu", FAKE_TORCH_2 % SLOWDOWN, ("triton==2.0", "nvidia-fake-ebstack==2.0")
    )
    build_wheel(w, "triton", "1.0", "WORK = 1\n")
    build_wheel(w, "triton", "2.0", "WORK = 1  # same speed\n")
    build_wheel(w, "nvidia-fake-ebstack", "1.0", "WORK = 1\nABI = 1\n")
    build_wheel(w, "nvidia-fake-ebstack", "1.5", "WORK = 1\nABI = 1  # 1.5\n")
    build_wheel(w, "nvidia-fake-ebstack", "2.0", "WORK = 1\nABI = 2  # new\n")
    sc.venv("ebwork==1.0", "torch==2.0+cpu", "triton==2.0", "nvidia-fake-ebstack==2.0")
    good = {"torch": pkg("1.0"), "triton": pkg("1.0"), "nvidia-fake-ebstack": pkg("1.0")}
    bad = {"torch": pkg("2.0+cpu"), "triton": pkg("2.0"), "nvidia-fake-ebstack": pkg("2.0")}
    _write(sc, {**good, "ebwork": pkg("1.0")}, {**bad, "ebwork": pkg("1.0")})

    res, doc = _run(sc, [sshd_server.via], STACK_MODULES)

    assert res.return_value == 0, res.output
    within = doc["culprits"][0]["within"]
    assert within["stack"]["culprit"]["component"] == "torch itself", res.output
    release = within["release"]
    assert release["releases"] == ["1.5", "1.8"]
    assert release["first_bad"] == "1.8", res.output
    assert "resolved for each release with uv pip compile" in release["note"]
    assert "1.8: nvidia-fake-ebstack 1.5, triton 2.0" in release["note"]
    assert release["outside_pins"] == []
    # Resolved by the target's uv, through the chain.
    assert list((sc.tmp / "session" / "remote").glob("resolve*.stdout"))
