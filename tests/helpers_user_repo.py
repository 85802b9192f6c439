"""A user's own training repo, made with real git: the shape envbisect meets in the field.

``ws/repo`` holds ``train.py`` (pure Python; reads ``--data``, prints ``step N | X tok/s``
lines and a final ``N tok/s``), ``model.py`` (its ``WORK`` factor sets the speed) and an
untracked, git-ignored ``data/x.jsonl``. The good state is the first commit; then come four
commits, one of which (``SLOW_SUBJECT``) makes the model 8× slower, and an uncommitted patch
in ``model.py`` that changes nothing about speed. An env var (``EB_OTHER``) also differs, so
the run has more than one unit to choose from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.helpers_run import commit_all, git, init_repo, make_venv

SLOW_SUBJECT = "model: unfused attention path"

TRAIN = r"""
import argparse, json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model

p = argparse.ArgumentParser()
p.add_argument("--data", required=True)
p.add_argument("--steps", type=int, default=3)
a = p.parse_args()
if os.environ.get("EB_CRASH_IF_OTHER") and os.environ.get("EB_OTHER") and model.WORK == 1:
    raise SystemExit("RuntimeError: EB_OTHER needs the new attention path")
if os.environ.get("EB_QUIET_IF_OTHER") and os.environ.get("EB_OTHER") and model.WORK == 1:
    print("EB_OTHER set: nothing to log")
    sys.exit(0)
with open(a.data) as fh:
    records = [json.loads(line) for line in fh if line.strip()]
tokens = sum(len(r["text"]) for r in records)
began = time.perf_counter()
for step in range(a.steps):
    start = time.perf_counter()
    acc = model.forward(tokens)
    rate = tokens / (time.perf_counter() - start)
    print("step %d | acc %d | %.1f tok/s" % (step, acc, rate), flush=True)
print("%.1f tok/s" % (a.steps * tokens / (time.perf_counter() - began)))
"""

MODEL = """WORK = {work}


def forward(tokens):
    acc = 0
    for t in range(tokens):
        for i in range(150 * WORK):
            acc = (acc + i * t) % 1000003
    return acc
"""

METRIC = r"(?m)^([0-9.]+) tok/s$"


@dataclass(frozen=True)
class UserRepo:
    """Paths of the world, and the commits (good first)."""

    ws: Path
    repo: Path
    data: Path
    python: Path
    config: Path
    good: Path
    bad: Path
    commits: tuple[str, ...]

    @property
    def slow_commit(self) -> str:
        return self.commits[2]


def envbisect(
    cwd: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``envbisect ARGV`` as a user types it: a real process in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "envbisect", *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def make_user_repo(tmp: Path, *, list_model: bool = False) -> UserRepo:
    """The world, with good and bad manifests taken by ``envbisect snapshot``; with
    ``list_model`` the config lists ``model.py`` under ``files:`` (its content kept), so a
    guilty model file is narrowed to its commit and hunk."""
    ws = tmp / "ws"
    repo = init_repo(ws / "repo")
    (repo / "train.py").write_text(TRAIN)
    (repo / "model.py").write_text(MODEL.format(work=1))
    (repo / ".gitignore").write_text("data/\n__pycache__/\n")
    data = repo / "data" / "x.jsonl"
    data.parent.mkdir()
    data.write_text("".join('{"text": "%s"}\n' % ("abcdefgh" * 25) for _ in range(12)))
    commits = [commit_all(repo, "train: first version")]
    # The README form keeps its dataset beside the repo: ws/data/prompts.jsonl.
    (ws / "data").mkdir()
    shutil.copy(data, ws / "data" / "prompts.jsonl")
    python = make_venv(tmp / "target", tmp / "no-wheels") / "bin" / "python"
    config = ws / "envbisect.yaml"
    settings: dict[str, object] = {"repos": [str(repo)], "env": ["EB_OTHER"]}
    if list_model:
        settings.update(files=[str(repo / "model.py")], keep_blobs=True)
    config.write_text(yaml.safe_dump(settings))
    good = ws / "manifests" / "good.yaml"
    snap = envbisect(ws, "snapshot", "-o", str(good), "--python", str(python))
    assert snap.returncode == 0, snap.stderr
    for subject, work in (
        ("docs: readme", None),
        (SLOW_SUBJECT, 8),
        ("train: more logging", None),
        ("docs: usage", None),
    ):
        if work is not None:
            (repo / "model.py").write_text(MODEL.format(work=work))
        else:
            (repo / "README").write_text(subject + "\n")
        commits.append(commit_all(repo, subject))
    with (repo / "model.py").open("a") as fh:
        fh.write("# local note: try a smaller block size\n")  # the uncommitted patch
    bad = ws / "manifests" / "bad.yaml"
    snap = envbisect(ws, "snapshot", "-o", str(bad), "--python", str(python), env={"EB_OTHER": "1"})
    assert snap.returncode == 0, snap.stderr
    assert git(repo, "status", "--porcelain") == "M model.py"
    return UserRepo(ws, repo, data, python, config, good, bad, tuple(commits))
