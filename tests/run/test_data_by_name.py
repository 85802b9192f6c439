"""A dataset the program finds by itself (issue 46): nanoGPT builds ``data/<name>/train.bin``
from a name in its config, relative to its cwd, an ignored file inside the repo. Each state
must read its own version there, and the probe must prove it did: real git, real torch, the
command typed from inside the repo as nanoGPT's README types it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers_run import commit_all, git, init_repo
from tests.helpers_user_repo import envbisect

pytestmark = pytest.mark.slow

# WORK: matmuls a step (a commit raises it); EB_HEAD_ONLY: only the first 64 KB of the data
# is used (the data harmless); EB_DATA_ABS: the data opened by an absolute path of its own
# (a program that bypasses the state's placement).
TRAIN = r'''"""nanoGPT-shaped: the dataset found by name, relative to the cwd."""
import os, time
import torch

WORK = 1
config = {"dataset": "tiny", "iters": 30}
path = os.environ.get("EB_DATA_ABS") or os.path.join("data", config["dataset"], "train.bin")
with open(path, "rb") as fh:
    raw = fh.read(65536) if os.environ.get("EB_HEAD_ONLY") else fh.read()
data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float().view(-1, 64)
torch.set_num_threads(1)
w = torch.zeros(64, requires_grad=True)
m = torch.randn(64, 64)
opt = torch.optim.SGD([w], lr=0.01)
for it in range(config["iters"]):
    t0 = time.time()
    x = data @ m
    for _ in range(WORK):
        x = torch.tanh(x @ m)
    loss = (x * w).sum() / x.numel()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"iter {it}: loss {loss.item():.4f}, time {(time.time() - t0) * 1000:.2f}ms", flush=True)
'''


def _world(tmp: Path, *, slow_commit: bool) -> dict[str, Path]:
    """ws/repo (data/ ignored), ws/data-old (the good version, named by data_map); the good
    snapshot at the first commit with 256 KB of data, the bad one at the head with 4 MB."""
    ws = tmp
    repo = init_repo(ws / "repo")
    (repo / ".gitignore").write_text("data/\n")
    (repo / "train.py").write_text(TRAIN)
    data = repo / "data" / "tiny" / "train.bin"
    data.parent.mkdir(parents=True)
    data.write_bytes(os.urandom(256 * 1024))
    good_commit = commit_all(repo, "trainer")
    if slow_commit:
        (repo / "train.py").write_text(TRAIN.replace("WORK = 1", "WORK = 12"))
        commit_all(repo, "model: deeper")
    (repo / "README.md").write_text("nanoGPT-shaped\n")
    commit_all(repo, "readme")
    (ws / "data-old").mkdir()
    (ws / "data-old" / "train.bin").write_bytes(data.read_bytes())
    (ws / "envbisect.yaml").write_text(
        "repos: [repo]\ndata: [repo/data/tiny/train.bin]\n"
        "data_map: {repo/data/tiny/train.bin: data-old/train.bin}\nmanifests_dir: manifests\n"
    )
    git(repo, "checkout", "-q", good_commit)
    for label in ("good", "bad"):
        if label == "bad":
            git(repo, "checkout", "-q", "main")
            data.write_bytes(os.urandom(4 * 1024 * 1024))  # the dataset regrown
        res = envbisect(ws, "snapshot", "--python", sys.executable, "--label", label,
                        "-o", f"{label}.yaml")  # fmt: skip
        assert res.returncode == 0, res.stderr
    return {"ws": ws, "repo": repo, "data": data}


def _run(
    w: dict[str, Path], session: str, env: dict[str, str] | None = None
) -> tuple[int, dict, str]:
    res = envbisect(
        w["repo"], "run", "--config", "../envbisect.yaml", "--good", "../good.yaml",
        "--bad", "../bad.yaml", "--python", sys.executable, "--until", "60%",
        "--session", str(w["ws"] / session), "--json", "-", "--", "python", "train.py",
        env=env,
    )  # fmt: skip
    out = res.stdout + res.stderr
    doc = json.loads(res.stdout[res.stdout.index("{") :]) if "{" in res.stdout else {}
    return res.returncode, doc, out


def _fingerprints(w: dict[str, Path]) -> dict[str, str]:
    key = str(w["data"])
    return {
        label: yaml.safe_load((w["ws"] / f"{label}.yaml").read_text())["data"][key]["fingerprint"]
        for label in ("good", "bad")
    }


def _read(trial: dict) -> list[str]:
    return [r["fingerprint"] for r in (trial.get("facts") or {}).get("data_reads") or []]


def test_regrown_data_found_by_name_is_the_culprit(tmp_path: Path) -> None:
    w = _world(tmp_path, slow_commit=False)
    code, doc, out = _run(w, "s")
    assert code == 0, out
    (culprit,) = doc["culprits"]
    assert culprit["unit"] == f"data:{w['data']}", out
    fp = _fingerprints(w)
    data_unit = f"data:{w['data']}"
    for trial in doc["trials"]:  # every state read its own version where nanoGPT looks
        want = fp["bad"] if data_unit in trial["applied"] else fp["good"]
        assert _read(trial) == [want], (trial["index"], out)
    assert w["data"].stat().st_size == 4 * 1024 * 1024  # the live data is as it was
    assert git(w["repo"], "status", "--porcelain") == ""


def test_harmless_data_is_cleared_on_the_probes_evidence(tmp_path: Path) -> None:
    w = _world(tmp_path, slow_commit=True)
    code, doc, out = _run(w, "s", env={"EB_HEAD_ONLY": "1"})
    assert code == 0, out
    (culprit,) = doc["culprits"]
    assert culprit["unit"] == f"git:{w['repo']}", out
    assert f"data:{w['data']}" in [n["unit"] for n in doc["not_causes"]], out
    fp = _fingerprints(w)
    data_unit = f"data:{w['data']}"
    for trial in doc["trials"]:
        if trial["failure"] is None:
            want = fp["bad"] if data_unit in trial["applied"] else fp["good"]
            assert _read(trial) == [want], (trial["index"], out)


def test_a_program_that_opens_another_version_is_unfaithful_naming_it(tmp_path: Path) -> None:
    w = _world(tmp_path, slow_commit=False)
    code, doc, out = _run(w, "s", env={"EB_DATA_ABS": str(w["data"])})
    good = doc["trials"][0]
    assert good["verdict"] == "unresolved", out
    assert good["failure"].startswith(
        f"state not faithful: the program read data {w['data']} as {w['data']} "
        "(the other state's version "
    ), good["failure"]
    assert doc["outcome"] == "unfaithful", out
    assert code == 1, out
