"""The endpoints' guard (``run.cmdcheck``) stops a run whose command fails the same way in
both endpoints, and only then. Found on the H100 (issue 31, the user's own threaded script):
the good state crashed once with the field's race (warm cache), the full drift hung until its
timeout, and the run ended "the smoke command fails the same way in both endpoints", quoting
a DeprecationWarning both runs printed first. A crash is not a hang, a warning is no error
line, and a crash of the good state is judged by the search's crash regime until it crashed
in every one of ``GOOD_TRIES`` runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.cli import cli, main
from envbisect.model.errors import CommandFailed
from envbisect.model.failure import Failure
from envbisect.run import cmdcheck
from envbisect.search.crashes import GOOD_TRIES
from tests.helpers_run import env_scenario

WARNING = (
    "/w/train.py:66: DeprecationWarning: _compile flag on create_block_mask was originally"
    " added to work around a torch.compile limitation\n"
    "  mask = create_block_mask(causal, 1, 1, s, s, device=dev, _compile=True)\n"
)

# The good state's first process crashes (the race strikes a warm cache now and then), its
# later ones run clean; with EB_HANG set the program hangs (the drift's deadlock).
SCRIPT = """\
import os, sys, time, warnings
from pathlib import Path

warnings.warn("_compile flag on create_block_mask was originally added", DeprecationWarning)
if os.environ.get("EB_HANG"):
    time.sleep(600)
tries = Path(sys.argv[1])
n = int(tries.read_text()) if tries.exists() else 0
tries.write_text(str(n + 1))
if n == 0:
    print("RuntimeError: Detected that you are using FX to symbolically trace", flush=True)
    raise SystemExit("1 of 3 training threads died")
print("throughput: 8000 tok/s", flush=True)
"""


def _facts(stderr: str, failure: Failure) -> cmdcheck.RunFacts:
    return cmdcheck.RunFacts(("python", "t.py"), None, "python", True, 1, "", stderr, failure)


def test_a_warning_is_not_the_error_line() -> None:
    assert cmdcheck.first_error_line(WARNING * 2 + "1 of 3 training threads died\n") == (
        "1 of 3 training threads died"
    )
    assert cmdcheck.first_error_line(WARNING + "Timeout (0:02:41.5)!\nThread 0x7f (most\n") == (
        "Timeout (0:02:41.5)!"
    )


def test_a_crash_and_a_timeout_are_not_the_same_failure() -> None:
    crash = _facts(WARNING, Failure.crash("exit 1: 1 of 3 training threads died"))
    hang = _facts(WARNING, Failure.timeout("after 170s"))
    assert not cmdcheck.same_failure(crash, hang)
    assert cmdcheck.same_failure(crash, _facts(WARNING, crash.failure))


def test_a_hang_is_told_by_how_it_ended_not_by_its_stacks_first_line() -> None:
    # The H100, own script, fifth session: both endpoints hung (a deadlock of threads
    # compiling at once) and the run said "fails the same way in both endpoints: Thread
    # 0x00007fa524ccf6c0 (most recent call first):", the first line of the stacks.
    stacks = 'Thread 0x00007fa524ccf6c0 (most recent call first):\n  File "t.py", line 3 in f\n'
    hung = Failure.timeout("(hung: no CPU time used in its last 30s; --hang-after)")
    run = _facts(WARNING + stacks, hung)
    assert run.line == str(hung)
    said = cmdcheck.message("good", run, both=True)
    assert said.startswith(f"the smoke command fails the same way in both endpoints: {hung}")


def test_a_good_state_that_crashed_once_and_a_hanging_bad_state_are_bisected(
    tmp_path: Path,
) -> None:
    sc, script = env_scenario(tmp_path, SCRIPT, {"A1": "y", "EB_HANG": "1"})
    argv = [
        "run", "--config", str(sc.config), "--python", sc.python, "--bad", str(sc.bad),
        "--session", str(tmp_path / "session"), "--json", str(tmp_path / "result.json"),
        "--timeout", "4", "--metric-regex", r"throughput: ([0-9.]+) tok/s",
        "--", "python", str(script), str(tmp_path / "tries"),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    out = res.output
    assert "fails the same way" not in out, out
    assert res.return_value == 0, out
    doc = json.loads((tmp_path / "result.json").read_text())
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_HANG"], out
    assert "timeout" in doc["culprits"][0]["crash"], out


def test_a_command_failing_alike_in_every_run_of_both_endpoints_stops_the_run(
    tmp_path: Path,
) -> None:
    broken = "raise RuntimeError('CUDA error: no kernel image')\n"
    sc, script = env_scenario(tmp_path, broken, {"A1": "y"})
    argv = [
        "run", "--config", str(sc.config), "--python", sc.python, "--bad", str(sc.bad),
        "--session", str(tmp_path / "session"), "--", "python", str(script),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False)
    assert isinstance(res.exception, CommandFailed), res.output  # the CLI's exit 2
    assert "fails the same way in both endpoints: RuntimeError: CUDA error" in str(res.exception)
    good_dir = tmp_path / "session" / "trials" / "001"
    assert len(list(good_dir.glob("run-*.stderr"))) == GOOD_TRIES  # a race would have shown


def test_how_a_failing_command_was_run_is_told_on_lines_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Tried as a user (no --metric-regex for a script that prints one line): the error came
    # as one line with literal "\n  argv: ... \n  cwd: ..." in it. (A token rate is read with
    # no regex now: this script prints a count, which is no rate.)
    sc, script = env_scenario(tmp_path, "print('finished: 8000 tokens')\n", {"A1": "y"})
    argv = [
        "run", "--config", str(sc.config), "--python", sc.python, "--good", str(sc.good),
        "--bad", str(sc.bad), "--session", str(tmp_path / "s"), "--", "python", str(script),
    ]  # fmt: skip
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "envbisect: error: the smoke command gives no throughput in the good state" in err
    assert "\\n" not in err
    lines = err.splitlines()
    assert any(line.startswith("  argv: ") for line in lines), err
    assert any(line.startswith("  logs: ") for line in lines), err
