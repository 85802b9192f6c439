"""A secret typed on the command line is redacted by probe --json and check, as run does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.helpers_user_repo import envbisect

TOKEN = "hf_" + "a1B2c3D4e5" * 4
SCRIPT = "import sys; print('ENVBISECT_RESULT {\"tok_per_s\": 5000}')"


def test_probe_json_redacts_a_token_in_the_command(tmp_path: Path) -> None:
    out = tmp_path / "facts.json"
    proc = envbisect(
        tmp_path, "probe", "--json", str(out), "--",
        sys.executable, "-c", "pass", "--hf-token", TOKEN, f"--key={TOKEN}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert TOKEN not in text and TOKEN not in proc.stdout
    assert "<redacted>" in json.dumps(json.loads(text)["argv"])


def test_check_never_prints_a_token_of_the_command(tmp_path: Path) -> None:
    proc = envbisect(
        tmp_path, "check", "--python", sys.executable, "--until-ktoks", "1k", "--repeats", "1",
        "--", sys.executable, "-c", SCRIPT, "--hf-token", TOKEN,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert TOKEN not in proc.stdout + proc.stderr
    assert "<redacted>" in proc.stderr


def test_every_file_probe_writes_is_its_owners_alone(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = envbisect(
        tmp_path, "probe", "--log-dir", str(logs), "--json", str(tmp_path / "f.json"), "--",
        sys.executable, "-c", "print('step 1 loss 2.0')",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    import stat

    files = [p for p in logs.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".facts.json") for p in files), files
    loose = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert all(mode == "0o600" for mode in loose.values()), loose
    assert stat.S_IMODE((tmp_path / "f.json").stat().st_mode) == 0o600
