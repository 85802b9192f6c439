"""A user-style training repo with a history: ``repo/train.py`` and ``repo/model.py``, four
commits to ``model.py`` since the good state (one of them the culprit, with three hunks),
a commit to ``train.py`` only, and an uncommitted patch in ``model.py``; snapshots of the
good and the bad state taken by ``envbisect snapshot`` with ``files:`` and ``repos:``.

The slowdown is real work: the culprit makes ``forward`` apply its layer eight times as
often (``REPEAT``), never a sleep.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.helpers_run import commit_all, git, init_repo, make_venv

TRAIN = r'''"""Train the tiny model a fixed number of steps; print the throughput."""
import time

import model

STEPS = 300
x = [float(i % 7) for i in range(model.WIDTH)]
start = time.perf_counter()
for step in range(STEPS):
    y = model.forward(x)
elapsed = time.perf_counter() - start
print(f"loss {sum(y):.3f}")
print(f"{STEPS * model.WIDTH / elapsed / 1000:.2f} Ktok/s")
'''

MODEL = '''"""A tiny model for the throughput test."""

WIDTH = 64
DEPTH = 2
REPEAT = 1

LR = 0.1
ACTIVATION = "relu"


def layer(x):
    return [max(0.0, v * 0.5 + 0.1) for v in x]


def forward(x):
    for _ in range(DEPTH * REPEAT):
        x = layer(x)
    return x
'''


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


@dataclass(frozen=True)
class History:
    """The workspace: ``work/repo`` with its history, snapshots, the target python."""

    work: Path
    repo: Path
    model: Path
    python: Path
    good: Path
    bad: Path
    commits: dict[str, str]  # subject -> sha

    def envbisect(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``envbisect ARGV`` as a user types it: a real process in the workspace."""
        return subprocess.run(
            [sys.executable, "-m", "envbisect", *argv],
            capture_output=True,
            text=True,
            check=False,
            cwd=self.work,
            env=dict(os.environ),
        )

    def run_argv(self, *extra: str) -> list[str]:
        """``run`` with absolute paths in the command, as the README writes it."""
        return [
            "run",
            "--good",
            str(self.good),
            "--bad",
            str(self.bad),
            "--python",
            str(self.python),
            "--session",
            str(self.work / "session"),
            "--metric-regex",
            "([0-9.]+) Ktok/s",
            *extra,
            "--",
            "python",
            str(self.repo / "train.py"),
        ]


CULPRIT = "model: apply the layer REPEAT times per step"


def make_history(
    tmp: Path, *, culprit_uncommitted: bool = False, uncommitted: bool = True
) -> History:
    """The repo, its history and both snapshots (see the module docstring). With
    ``culprit_uncommitted`` the commits are harmless and the uncommitted patch holds the
    slow hunk; without ``uncommitted`` there is no patch (the repo is clean in both
    states, so model.py moves with the repo's unit)."""
    work = tmp / "work"
    repo = init_repo(work / "repo")
    (repo / "train.py").write_text(TRAIN)
    model = repo / "model.py"
    model.write_text(MODEL)
    commits = {"start": commit_all(repo, "start")}
    (work / "envbisect.yaml").write_text(
        yaml.safe_dump({"files": [str(model)], "repos": [str(repo)], "keep_blobs": True})
    )
    python = make_venv(tmp / "target", tmp / "no-wheels") / "bin" / "python"
    good = work / "manifests" / "good.yaml"
    snap = _snapshot(work, python, good)
    assert snap.returncode == 0, snap.stderr
    text = MODEL
    steps = [
        ("model: call it gelu", ('ACTIVATION = "relu"', 'ACTIVATION = "gelu"')),
        ("model: lower the learning rate", ("LR = 0.1", "LR = 0.05")),
    ]
    for subject, (old, new) in steps:
        text = edit(text, old, new)
        model.write_text(text)
        commits[subject] = commit_all(repo, subject)
    # Three hunks: the docstring, REPEAT, the layer's comment.
    text = edit(text, "for the throughput test.", "for the throughput test (v2).")
    text = edit(
        text,
        "REPEAT = 1",
        "REPEAT = 1 if " + ("True" if culprit_uncommitted else "False") + " else 8",
    )
    text = edit(text, "def layer(x):\n", "def layer(x):\n    # one affine map and a relu\n")
    model.write_text(text)
    commits[CULPRIT] = commit_all(repo, CULPRIT)
    (repo / "train.py").write_text(TRAIN.replace("STEPS = 300", "STEPS = 300  # per trial"))
    commits["train: say per trial"] = commit_all(repo, "train: say per trial")
    text = edit(text, "    return x\n", "    return x  # the output\n")
    model.write_text(text)
    commits["model: name the output"] = commit_all(repo, "model: name the output")
    # The uncommitted patch: two hunks (the first one slow when culprit_uncommitted).
    if uncommitted:
        slow = "DEPTH = 16" if culprit_uncommitted else "DEPTH = 2  # layers"
        text = edit(text, "DEPTH = 2", slow)
        text = edit(text, "LR = 0.05", "LR = 0.05  # tuned by hand")
        model.write_text(text)
    bad = work / "manifests" / "bad.yaml"
    snap = _snapshot(work, python, bad)
    assert snap.returncode == 0, snap.stderr
    assert git(repo, "status", "--porcelain") == ("M model.py" if uncommitted else "")
    return History(work, repo, model, python, good, bad, commits)


def _snapshot(work: Path, python: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbisect", "snapshot", "-o", str(out), "--python", str(python)],
        capture_output=True,
        text=True,
        check=False,
        cwd=work,
    )
