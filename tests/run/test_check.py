from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.cli import cli
from tests.helpers_run import SLOWDOWN, WORKLOAD, commit_all, git, init_repo, run_workload


def _threshold(fast: float) -> float:
    # Geometric middle between the fast rate and the SLOWDOWN-times slower one.
    return fast / SLOWDOWN**0.5


def _repo_with_slow_commit(tmp_path: Path) -> tuple[Path, list[str]]:
    repo = init_repo(tmp_path / "repo")
    (repo / "train.py").write_text(WORKLOAD)
    (repo / "knob.txt").write_text("1\n")
    shas = [commit_all(repo, "workload")]
    (repo / "README").write_text("docs\n")
    shas.append(commit_all(repo, "docs"))
    (repo / "knob.txt").write_text(f"{SLOWDOWN}\n")
    shas.append(commit_all(repo, "more work per token"))
    (repo / "README").write_text("more docs\n")
    shas.append(commit_all(repo, "docs again"))
    return repo, shas


def test_check_exit_codes_good_bad_and_cannot_test(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(WORKLOAD)
    fast = run_workload(sys.executable, script)
    runner = CliRunner()
    args = ["check", "--until-ktoks", f"{_threshold(fast):.0f}", "--", sys.executable, str(script)]
    good = runner.invoke(cli, args, standalone_mode=False)
    assert good.exception is None and good.return_value == 0, good.output
    assert good.stdout.startswith("good: ")
    (tmp_path / "knob.txt").write_text(f"{SLOWDOWN}\n")
    bad = runner.invoke(cli, args, standalone_mode=False)
    assert bad.return_value == 1 and bad.stdout.startswith("bad: ")
    crash = runner.invoke(
        cli,
        ["check", "--until-ktoks", "1k", "--", sys.executable, "-c", "raise SystemExit(3)"],
        standalone_mode=False,
    )
    assert crash.return_value == 125
    assert "cannot test: crash: exit 3" in crash.stdout


def test_check_with_metric_regex_in_ktoks(tmp_path: Path) -> None:
    runner = CliRunner()
    cmd = [sys.executable, "-c", "print('step 9: 12.8 Ktok/s')"]
    base = ["check", "--metric-regex", r"([0-9.]+) Ktok/s", "--"]
    hi = runner.invoke(
        cli, ["check", "--until-ktoks", "12k", *base[1:], *cmd], standalone_mode=False
    )
    assert hi.return_value == 0, hi.output
    lo = runner.invoke(
        cli, ["check", "--until-ktoks", "13k", *base[1:], *cmd], standalone_mode=False
    )
    assert lo.return_value == 1
    assert "12,800 tok/s (12.8 Ktok/s)" in lo.stdout


def test_check_bad_threshold_is_exit_2_without_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "check", "--until-ktoks", "fast", "--", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "envbisect: error: --until-ktoks 'fast': expected a throughput like 12000, 12k, 12.8k "
        "or 12.8 Ktok/s"
    ]


def test_check_takes_three_samples_and_says_when_the_median_is_within_noise(
    tmp_path: Path,
) -> None:
    """Found 5: check took one sample by default and said nothing when it sat within noise
    of the line."""
    counter = tmp_path / "n"
    script = (
        "import os\n"
        f"p = {str(counter)!r}\n"
        "n = int(open(p).read()) if os.path.exists(p) else 0\n"
        "open(p, 'w').write(str(n + 1))\n"
        "print('%.1f tok/s' % (12000 * (1.1, 0.9, 1.02)[n % 3]))\n"
    )
    res = CliRunner().invoke(
        cli,
        ["check", "--until-ktoks", "12k", "--metric-regex", r"([0-9.]+) tok/s", "--"]
        + [sys.executable, "-c", script],
        standalone_mode=False,
    )
    assert res.return_value == 0, res.output
    assert counter.read_text() == "3"
    assert res.stdout == "good: median 12,240 tok/s (12.2 Ktok/s) ≥ 12,000 tok/s (12.0 Ktok/s)\n"
    assert "note: within the noise of the threshold" in res.stderr
    assert "per sample over 3 samples): the verdict may flip" in res.stderr
    far = CliRunner().invoke(
        cli,
        ["check", "--until-ktoks", "6k", "--metric-regex", r"([0-9.]+) tok/s", "--"]
        + [sys.executable, "-c", script],
        standalone_mode=False,
    )
    assert far.return_value == 0 and "within the noise" not in far.stderr


def test_check_reads_threshold_repeats_and_metric_regex_from_the_config(tmp_path: Path) -> None:
    (tmp_path / "envbisect.yaml").write_text(
        "threshold: 12k\nrepeats: 2\nmetric_regex: '([0-9.]+) Ktok/s'\n"
    )
    counter = tmp_path / "n"
    script = (
        "import os\n"
        f"p = {str(counter)!r}\n"
        "n = int(open(p).read()) if os.path.exists(p) else 0\n"
        "open(p, 'w').write(str(n + 1))\n"
        "print('step: 12.8 Ktok/s')\n"
    )
    res = CliRunner().invoke(
        cli,
        ["check", "--config", str(tmp_path / "envbisect.yaml"), "--", sys.executable, "-c", script],
        standalone_mode=False,
    )
    assert res.return_value == 0, res.output
    assert counter.read_text() == "2"
    assert "good means ≥ 12,000 tok/s (12.0 Ktok/s), from envbisect.yaml threshold" in res.stderr


def test_check_refuses_a_percentage_and_a_missing_threshold(tmp_path: Path) -> None:
    from envbisect.model.errors import UsageError

    for argv, match in (
        (["check", "--until", "70%", "--", "true"], "a percentage needs a measured good state"),
        (["check", "--", "true"], "check needs a threshold"),
        (["check", "--until-ktoks", "15", "--", "true"], "ambiguous"),
    ):
        res = CliRunner().invoke(cli, argv, standalone_mode=False)
        assert isinstance(res.exception, UsageError) and match in str(res.exception), argv


def test_git_bisect_run_finds_the_commit_that_made_tokens_expensive(tmp_path: Path) -> None:
    repo, shas = _repo_with_slow_commit(tmp_path)
    git(repo, "checkout", "-q", shas[0])
    fast = run_workload(sys.executable, repo / "train.py")
    git(repo, "checkout", "-q", "main")
    git(repo, "bisect", "start", shas[-1], shas[0])
    proc = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "bisect",
            "run",
            sys.executable,
            "-m",
            "envbisect",
            "check",
            "--until-ktoks",
            f"{_threshold(fast):.0f}",
            "--",
            sys.executable,
            "train.py",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=repo,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{shas[2]} is the first bad commit" in proc.stdout
    git(repo, "bisect", "reset")


def test_check_with_the_built_in_drafter_on_cpu(tmp_path: Path) -> None:
    """The default smoke test, shipped on stdin to the target python (real torch, CPU)."""
    from envbisect.run.check import check
    from envbisect.run.launch import SmokeCommand
    from envbisect.transport import Transport

    smoke = SmokeCommand(
        drafter_params={"preset": "tiny", "device": "cpu", "warmup": 1, "steps": 2, "seq_len": 64}
    )
    result = check(
        smoke,
        threshold=1.0,
        transport=Transport(),
        python=sys.executable,
        timeout_s=300,
        log_root=tmp_path,
    )
    assert result.failure is None, result.failure
    assert result.verdict == "good" and result.exit_code == 0
    assert result.median is not None and result.median > 1.0
    assert not list(tmp_path.iterdir())  # logs of a clean run are not kept


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    """A hung command (and the child it started) is killed at --timeout: exit 125."""
    pidfile = tmp_path / "grandchild.pid"
    hang = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "while True: pass\n"
    )
    res = CliRunner().invoke(
        cli,
        [
            "check",
            "--until-ktoks",
            "1tok/s",
            "--timeout",
            "3",
            "--repeats",
            "1",
            "--",
            sys.executable,
            "-c",
            hang,
        ],
        standalone_mode=False,
    )
    assert res.return_value == 125
    assert "cannot test: timeout after 3s" in res.stdout
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


WINDOWS = """
import json, os, sys
with open(sys.argv[1], "a") as fh:
    fh.write("start\\n")
n = int(os.environ["ENVBISECT_SAMPLES"])
rates = [1000.0 + 10 * k for k in range(n)]
with open(os.environ["ENVBISECT_RESULT"], "w") as fh:
    json.dump({"ok": True, "tok_per_s": sum(rates) / n, "samples": rates}, fh)
"""


def test_check_takes_its_samples_from_one_process(tmp_path: Path) -> None:
    script, starts = tmp_path / "windows.py", tmp_path / "starts.txt"
    script.write_text(WINDOWS)
    from envbisect.run.check import check
    from envbisect.run.launch import SmokeCommand
    from envbisect.transport import Transport

    res = check(
        SmokeCommand(argv=(sys.executable, str(script), str(starts))),
        threshold=500.0,
        transport=Transport(),
        python=sys.executable,
        repeats=3,
    )
    assert res.samples == (1000.0, 1010.0, 1020.0)
    assert starts.read_text().count("start") == 1  # one process, one warm-up
    assert res.verdict == "good"


def test_a_command_with_one_figure_is_run_once_per_sample(tmp_path: Path) -> None:
    from envbisect.run.check import check
    from envbisect.run.launch import SmokeCommand
    from envbisect.transport import Transport

    starts = tmp_path / "starts.txt"
    code = (
        f"open({str(starts)!r}, 'a').write('start\\n'); print('ENVBISECT_RESULT', "
        '\'{"ok": true, "tok_per_s": 2000}\')'
    )
    res = check(
        SmokeCommand(argv=(sys.executable, "-c", code)),
        threshold=500.0,
        transport=Transport(),
        python=sys.executable,
        repeats=2,
    )
    assert res.samples == (2000.0, 2000.0)
    assert starts.read_text().count("start") == 2


def test_children_left_by_a_smoke_command_that_exits_normally_are_ended(tmp_path: Path) -> None:
    """`sleep 30 &` and a `setsid` child outlived a normal exit before issue 17."""
    d = tmp_path
    (d / "envbisect.yaml").write_text("{}\n")
    script = (
        f"rm -f {d}/bg.pid {d}/sid.pid; sleep 300 & echo $! > {d}/bg.pid; "
        f"setsid sh -c 'echo $$ > {d}/sid.pid; exec sleep 301' & "
        f"while [ ! -s {d}/sid.pid ] || [ ! -s {d}/bg.pid ]; do :; done; "
        'echo ENVBISECT_RESULT \'{"ok": true, "tok_per_s": 5000}\''
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "envbisect",
            "check",
            "--until-ktoks",
            "1k",
            "--",
            "sh",
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    pids = [int((d / f"{name}.pid").read_text()) for name in ("bg", "sid")]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


# The script knows which interpreter runs it: fast in the target venv, a crash elsewhere.
_WHICH_PYTHON = """import sys
if sys.prefix != {prefix!r}:
    raise SystemExit("ran by " + sys.executable + ", not the target venv")
print("20000 tok/s")
"""


def _target_venv_manifest(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A venv that is not on PATH, a manifest ``snapshot`` took of it, and a script that
    only succeeds under it."""
    from tests.helpers_run import make_venv

    venv = make_venv(tmp_path / "target", tmp_path / "no-wheels")
    manifest = tmp_path / "state.yaml"
    snap = CliRunner().invoke(
        cli,
        ["snapshot", "--python", str(venv / "bin" / "python"), "-o", str(manifest)],
        standalone_mode=False,
    )
    assert snap.exception is None, snap.output
    script = tmp_path / "s.py"
    script.write_text(_WHICH_PYTHON.format(prefix=str(venv)))
    return venv, manifest, script


def test_check_runs_the_interpreter_the_manifest_recorded_not_the_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check -- python s.py``: the bare ``python`` is the manifest's interpreter (given
    with --manifest, or envbisect.yaml's good:), like run; without one it is PATH's."""
    venv, manifest, script = _target_venv_manifest(tmp_path)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    base = ["check", "--until-ktoks", "1k", "--metric-regex", "([0-9.]+) tok/s", "--repeats", "1"]
    cmd = ["--", "python", str(script)]
    runner = CliRunner()
    given = runner.invoke(cli, [*base, "--manifest", str(manifest), *cmd], standalone_mode=False)
    assert given.exception is None and given.return_value == 0, given.output
    assert given.stdout.startswith("good: median 20,000 tok/s")
    config = tmp_path / "conf" / "envbisect.yaml"
    config.parent.mkdir()
    config.write_text(f"good: {manifest}\n")
    from_config = runner.invoke(cli, [*base, "--config", str(config), *cmd], standalone_mode=False)
    assert from_config.exception is None and from_config.return_value == 0, from_config.output
    # Without a manifest the PATH's python runs it, and the script says so.
    bare = runner.invoke(cli, [*base, *cmd], standalone_mode=False)
    assert bare.return_value == 125, bare.output
    assert f"ran by {Path(sys.executable).parent}" in bare.stdout
    # --python still wins over the manifest.
    other = runner.invoke(
        cli, [*base, "--manifest", str(manifest), "--python", sys.executable, *cmd],
        standalone_mode=False,
    )  # fmt: skip
    assert other.return_value == 125, other.output


def test_check_says_in_one_line_when_the_recorded_interpreter_is_gone(tmp_path: Path) -> None:
    _venv, manifest, script = _target_venv_manifest(tmp_path)
    moved = tmp_path / "moved.yaml"
    moved.write_text(manifest.read_text().replace(str(tmp_path / "target"), "/nowhere"))
    res = subprocess.run(
        [sys.executable, "-m", "envbisect", "check", "--until-ktoks", "1k",
         "--manifest", str(moved), "--", "python", str(script)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"envbisect: error: no --python given and the interpreter the manifest {moved} "
        "recorded (/nowhere/bin/python) is not here: give --python PATH"
    ]
    # Through a layer the recorded path is not this machine's to check: said, not guessed.
    res = subprocess.run(
        [sys.executable, "-m", "envbisect", "check", "--until-ktoks", "1k", "--via", "env",
         "--manifest", str(manifest), "--", "python", str(script)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "envbisect: error: --manifest picks the interpreter it recorded on this machine; "
        "through --via give the target's with --python"
    ]
