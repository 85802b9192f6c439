"""Kept content from elsewhere is data until reviewed: a foreign manifest's kept cache tree
needs --trust, a tree's modes are never applied, blobs never widen a file's mode, and
content that holds a secret is not stored as a blob (the manifest says so)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from envbisect.agent import cache_keep
from envbisect.cli import cli
from tests.helpers_run import make_foreign

PEM = (
    b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
    b"-----END OPENSSH PRIVATE KEY-----\n"
)
DOTENV = b"WANDB_MODE=offline\nHF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456\n"


def _world(tmp_path: Path) -> Path:
    """A cache holding compiled code (0600), a .env with a token, and a config file whose
    ``files:`` glob matches a private key."""
    cache = tmp_path / "inductor"
    (cache / "fx").mkdir(parents=True)
    (cache / "fx" / "kernel.py").write_text("def k(): return 1\n")
    os.chmod(cache / "fx" / "kernel.py", 0o600)
    (cache / ".env").write_bytes(DOTENV)
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_ed25519").write_bytes(PEM)
    (keys / "train.cfg").write_text("lr = 3e-4\n")
    cfg = tmp_path / "envbisect.yaml"
    cfg.write_text(
        f"caches: {{inductor: {cache}}}\nmanifests_dir: {tmp_path / 'manifests'}\n"
        f"keep_blobs: true\nkeep_caches: 1MiB\nfiles: ['{keys}/*']\n"
    )
    return cfg


def _snapshot(tmp_path: Path, cfg: Path, label: str) -> Path:
    out = tmp_path / f"{label}.yaml"
    res = CliRunner().invoke(
        cli,
        ["snapshot", "--config", str(cfg), "--python", sys.executable, "--label", label,
         "-o", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return out


def test_secrets_are_not_kept_and_blobs_never_widen_a_mode(tmp_path: Path) -> None:
    cfg = _world(tmp_path)
    out = _snapshot(tmp_path, cfg, "good")
    doc = yaml.safe_load(out.read_text())
    key = doc["files"][str(tmp_path / "keys" / "id_ed25519")]
    assert key["blob"] is None
    assert key["withheld"] == "content not kept: it holds a PEM private key"
    assert doc["files"][str(tmp_path / "keys" / "train.cfg")]["blob"]
    kept = doc["caches"]["inductor"]["kept"]
    assert kept["withheld"] == [[".env", "content not kept: it holds a Hugging Face token"]]
    assert kept["files"] == 1
    blobs = tmp_path / "manifests" / "blobs"
    stored = b"".join(p.read_bytes() for p in blobs.iterdir())
    assert b"PRIVATE KEY" not in stored and b"hf_abcdef" not in stored
    # The 0600 kernel's blob is 0600 too (was 0644 under the umask).
    kernel = (tmp_path / "inductor" / "fx" / "kernel.py").read_bytes()
    import hashlib

    blob = blobs / hashlib.sha256(kernel).hexdigest()
    assert stat.S_IMODE(blob.stat().st_mode) == 0o600


def test_a_trees_modes_are_never_applied(tmp_path: Path) -> None:
    body = b"compiled\n"
    sha = __import__("hashlib").sha256(body).hexdigest()
    tree = [("a/setuid", sha, 0o6666), ("b/exe", sha, 0o755), ("c/plain", sha, 0o666)]
    dest = tmp_path / "cache"
    assert cache_keep.materialize(tree, str(dest), lambda s: body if s == sha else None) == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in dest.rglob("*") if p.is_file()}
    assert modes == {"setuid": 0o600, "exe": 0o700, "plain": 0o600}
    for d in (dest, dest / "a"):
        assert not stat.S_IMODE(d.stat().st_mode) & 0o022


def test_a_foreign_kept_tree_needs_trust(tmp_path: Path) -> None:
    cfg = _world(tmp_path)
    good = _snapshot(tmp_path, cfg, "good")
    for f in (tmp_path / "inductor").rglob("*"):
        if f.is_file():
            f.unlink()
    bad = _snapshot(tmp_path, cfg, "bad")
    make_foreign(good, bad)
    argv = [
        "run", "--config", str(cfg), "--python", sys.executable, "--good", str(good),
        "--bad", str(bad), "--session", str(tmp_path / "session"), "--until-ktoks", "1k",
        "--", sys.executable, "-c", "print('ENVBISECT_RESULT {\"tok_per_s\": 5000}')",
    ]  # fmt: skip
    import subprocess

    res = subprocess.run(
        [sys.executable, "-m", "envbisect", *argv], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "caches inductor: a kept compile-cache tree" in last
    assert f"--trust {good}" in last
    log = tmp_path / "session" / "log.jsonl"
    assert not log.exists() or '"type": "trial"' not in log.read_text()
    doc = json.loads(json.dumps(yaml.safe_load(good.read_text())))
    assert doc["caches"]["inductor"]["kept"]["files"] == 1


@pytest.mark.parametrize("name", ["blob", "tree"])
def test_put_into_dir_writes_private_blobs(tmp_path: Path, name: str) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x")
    os.chmod(src, 0o640)
    put = cache_keep.put_into_dir(str(tmp_path / "blobs"))
    if name == "blob":
        put("a" * 64, str(src), 0o640)
        assert stat.S_IMODE((tmp_path / "blobs" / ("a" * 64)).stat().st_mode) == 0o640
    else:
        put("b" * 64, b"{}", 0o600)
        assert stat.S_IMODE((tmp_path / "blobs" / ("b" * 64)).stat().st_mode) == 0o600
