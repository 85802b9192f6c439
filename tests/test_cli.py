from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.cli import cli


def test_python_m_help_runs_as_a_real_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0
    for verb in ("snapshot", "diff", "run", "check", "smoke"):
        assert verb in proc.stdout


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert "envbisect" in result.output


# ---- user mistakes that used to end in a traceback (or be accepted) --------------------------


def _world(tmp: Path) -> dict[str, str]:
    from tests.helpers_run import manifest

    good = manifest(tmp / "good.yaml", env={"A": "1"})
    bad = manifest(tmp / "bad.yaml", env={"A": "2"})
    listed = manifest(tmp / "listed.yaml", packages={"torch": {"version": ["2.1", "2.2"]}})
    mapped = manifest(tmp / "mapped.yaml", packages={"torch": {"version": {"v": 1}}})
    (tmp / "a-file").write_text("not a directory\n")
    (tmp / "a-dir").mkdir()
    (tmp / "envbisect.yaml").write_text("{}\n")  # no config of a parent dir is found
    return {
        "good": str(good),
        "bad": str(bad),
        "listed": str(listed),
        "mapped": str(mapped),
        "file": str(tmp / "a-file"),
        "dir": str(tmp / "a-dir"),
        "session": str(tmp / "session"),
    }


RUN = "run --good {good} --bad {bad} --session {session}"

MISTAKES = [
    ("diff {good} {listed}", "field 'packages.torch.version' must be a string, got a list"),
    ("diff {mapped} {good}", "field 'packages.torch.version' must be a string, got a mapping"),
    ("check --timeout nan -- true", "--timeout nan: must be a positive, finite"),
    ("check --timeout inf -- true", "--timeout inf: must be a positive, finite"),
    ("check --timeout -1 -- true", "must be a positive, finite number of seconds"),
    ("check --timeout 0 -- true", "must be a positive, finite number of seconds"),
    (RUN + " --timeout nan -- true", "--timeout nan"),
    ("log --session {file}", "is not a directory (--session names a directory)"),
    ("run --good {good} --bad {bad} --session {file} -- true", "is not a directory"),
    ("reset --session {file}", "is not a directory"),
    (RUN + " --json {dir} -- true", "--json {dir}: is a directory; give a file name"),
    (RUN + " --report {dir}/no/such/r.md -- true", "--report {dir}/no/such/r.md: the directory"),
    (RUN + " --max-trials -1 -- true", "--max-trials must be at least 2"),
    (RUN + " --max-trials 0 -- true", "--max-trials must be at least 2"),
    (RUN + " --until-ktoks inf -- true", "--until-ktoks 'inf': "),
    (RUN + " --until-ktoks 1e400 -- true", "--until-ktoks '1e400': "),
    ("check --until-ktoks 1k --via 'csh -c' -- true", "csh is not a POSIX-family shell"),
    ("check --until-ktoks 1k --via 'fish -c' -- true", "fish is not a POSIX-family shell"),
]


@pytest.mark.parametrize(("args", "fragment"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_user_mistakes_exit_2_with_one_line_from_a_real_process(
    tmp_path: Path, args: str, fragment: str
) -> None:
    paths = _world(tmp_path)
    argv = shlex.split(args.format(**paths))
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("envbisect: error:")]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert fragment.format(**paths) in errors[0]
    # Refused before any trial: no session was started (a pre-existing file stays a file).
    assert not (tmp_path / "session" / "trials").exists()


def test_a_300_character_label_still_writes_its_snapshot(tmp_path: Path) -> None:
    label = "x" * 300
    (tmp_path / "envbisect.yaml").write_text("{}\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "envbisect",
            "snapshot",
            "--label",
            label,
            "--python",
            sys.executable,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    [written] = (tmp_path / "manifests").glob("*.yaml")
    assert len(written.name.encode()) <= 255
    from envbisect.model.manifest import load

    assert load(written).label == label
