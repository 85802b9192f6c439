"""``run --cpu-threads``: a user's CPU command on a machine where another process keeps a
core busy gets OMP_NUM_THREADS/MKL_NUM_THREADS of the free cores in every trial (a real busy
loop, a real run); a number, ``off``, and states that set the variables themselves."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.cli import cli
from tests.helpers_run import SLOWDOWN, Scenario, pkg

# Records the thread variables each trial's process saw, then runs the workload.
RECORDER = """
import os, runpy, sys
with open(sys.argv[1], "a") as fh:
    fh.write("%s %s\\n" % (os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS")))
runpy.run_path(sys.argv[2], run_name="__main__")
"""


@pytest.fixture
def busy_core() -> Iterator[None]:
    proc = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _scenario(tmp_path: Path, bad_env: dict[str, str] | None = None) -> Scenario:
    sc = Scenario(tmp_path)
    sc.venv("ebwork==1.0")
    git = sc.git_entry(sc.commits[0])
    good = {"packages": {"ebwork": pkg("1.0")}, "env": {"A1": "x"}, "git": git}
    env = {"A1": "x", "EB_SLOW": str(SLOWDOWN), **(bad_env or {})}
    bad = {"packages": {"ebwork": pkg("1.0")}, "env": env, "git": git}
    sc.write(good=good, bad=bad, loose_good=b"lr = 0.2\n", loose_bad=b"lr = 0.2\n")
    (tmp_path / "recorder.py").write_text(RECORDER)
    return sc


def _run(sc: Scenario, *extra: str) -> tuple[object, str, list[str]]:
    seen = sc.tmp / "threads.txt"
    seen.unlink(missing_ok=True)
    argv = [
        "run",
        "--config", str(sc.config),
        "--python", sc.python,
        "--session", str(sc.tmp / "session"),
        "--fresh",
        "--bad", str(sc.bad),
        "--until", "50%",
        *extra,
        "--", "python", str(sc.tmp / "recorder.py"), str(seen), str(sc.repo / "train.py"),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    lines = seen.read_text().splitlines() if seen.exists() else []
    return res.return_value, res.output, lines


def test_a_busy_core_gives_every_trial_the_free_cores(
    tmp_path: Path, busy_core: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    sc = _scenario(tmp_path)
    code, out, seen = _run(sc)
    assert code == 0, out
    line = next(x for x in out.splitlines() if "every trial runs with OMP_NUM_THREADS=" in x)
    n = int(line.split("OMP_NUM_THREADS=")[1].split()[0])
    assert 1 <= n < (os.cpu_count() or 2) and "cores busy at the start" in line
    assert seen and set(seen) == {f"{n} {n}"}
    # off: the environment's (unset) in every trial, with the same busy core.
    code, out, seen = _run(sc, "--cpu-threads", "off")
    assert code == 0, out
    assert "every trial runs with" not in out and set(seen) == {"None None"}


def test_a_number_is_used_as_asked_and_states_that_set_it_keep_theirs(tmp_path: Path) -> None:
    sc = _scenario(tmp_path)
    code, out, seen = _run(sc, "--cpu-threads", "3")
    assert code == 0, out
    assert "OMP_NUM_THREADS=3 and MKL_NUM_THREADS=3 (--cpu-threads)" in out
    assert set(seen) == {"3 3"}
    sc = _scenario(tmp_path / "own", bad_env={"OMP_NUM_THREADS": "1"})
    code, out, seen = _run(sc, "--cpu-threads", "3")
    assert "trials keep the states' own OMP_NUM_THREADS; --cpu-threads is not applied" in out
    assert not any(x.endswith(" 3") for x in seen)


def test_a_bad_value_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["run", "--cpu-threads", "many", "--", "python", "x.py"])
    assert res.exit_code == 2
    assert "'many': expected auto, off or a number of threads ≥ 1" in res.output
