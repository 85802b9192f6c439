"""Control characters from recorded data never reach a terminal or break a report block."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbisect.cli import main
from envbisect.model.escape import printable, terminal
from tests.helpers_run import manifest

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"


def test_printable_escapes_every_control_character_losslessly() -> None:
    assert printable("a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert printable(OSC52) == "\\x1b]52;c;ZWNobyBwd25lZA==\\x07"
    assert printable("\x9b31m") == "\\x9b31m"  # C1 CSI
    assert printable("abc\u202eevil") == "abc\\u202eevil"
    assert printable(b"caf\xe9".decode("utf-8", "surrogateescape")) == "caf\\xe9"
    assert printable("plain é ü") == "plain é ü"


def test_terminal_keeps_layout_and_only_our_colours() -> None:
    text = "\x1b[31mred\x1b[0m row\n" + OSC52 + "\n"
    assert terminal(text, keep_colors=True) == (
        "\x1b[31mred\x1b[0m row\n\\x1b]52;c;ZWNobyBwd25lZA==\\x07\n"
    )
    assert "\x1b" not in terminal(text)


def _diff(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_an_osc_escape_in_an_env_value_never_reaches_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    good = manifest(tmp_path / "g.yaml", env={"EB_X": "1"})
    bad = manifest(tmp_path / "b.yaml", env={"EB_X": "2" + OSC52, "EB_" + OSC52: "y"})
    out = _diff(["diff", "--format", fmt, str(good), str(bad)], capsys)
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]52;c;" in out


def test_a_newline_in_a_file_name_does_not_break_out_of_a_markdown_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = "/srv/a\n```\n<img src=x onerror=alert(1)>\n```\n"
    entry = {"sha256": "a" * 64, "size": 1, "blob": None}
    good = manifest(tmp_path / "g.yaml", files={evil: entry})
    bad = manifest(tmp_path / "b.yaml", files={evil: {**entry, "sha256": "b" * 64}})
    out = _diff(["diff", "--format", "markdown", str(good), str(bad)], capsys)
    assert "\n<img" not in out
    assert "/srv/a\\n```\\n<img" in out


def test_an_error_naming_a_hostile_key_is_one_escaped_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / ("b\n" + OSC52 + ".yaml")
    bad.write_text("not: [a manifest")
    with pytest.raises(SystemExit) as info:
        main(["diff", str(bad), str(bad)])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("\n") == 1 and "\x1b" not in err


def test_non_utf8_paths_and_env_values_are_recorded_escaped_without_a_traceback(
    tmp_path: Path,
) -> None:
    import os
    import subprocess
    import sys

    import yaml

    d = tmp_path / "d"
    d.mkdir()
    name = os.fsdecode(b"n\xffame.cfg")
    (d / name).write_text("x\n")
    (tmp_path / "envbisect.yaml").write_text(f"env: [EB_X]\nfiles: ['{d}/*']\n")
    env = {**os.environ, "EB_X": os.fsdecode(b"a\xffb")}
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "snapshot", "-o", str(tmp_path / "m.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    doc = yaml.safe_load((tmp_path / "m.yaml").read_text(encoding="utf-8"))
    assert doc["env"]["EB_X"] == "a\\xffb"
    assert f"{d}/n\\xffame.cfg" in doc["files"]
    errors = [e["error"] for e in doc["meta"]["errors"]]
    assert "env.EB_X: not UTF-8; recorded with \\xNN escapes" in errors
    assert f"files.{d}/n\\xffame.cfg: not UTF-8; recorded with \\xNN escapes" in errors
