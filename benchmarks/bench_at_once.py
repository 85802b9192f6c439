"""Crash-counting runs at once (``run --rate-runs-at-once``) on a user's own threaded trainer.

The world: a git repo of a small torch trainer (three threads sharing a batch loader, CPU),
four commits; the third takes the loader's two locks in opposite orders in odd and even
threads, so the program deadlocks; an uncommitted edit on top. The good snapshot is the
second commit, the bad one the head with the edit. ``run --hang-after 8`` ends each hang
with its stacks; the bad endpoint's crash-rate estimate, the good state's clean runs and the
culprit's rate runs cost one process each, one after the other, or several at once.

    python benchmarks/bench_at_once.py [--pairs 3] [--at-once 3] [--root DIR]

sets the world up (under a temporary DIR, removed after), then runs ``envbisect run`` from
inside the repo with relative paths, with ``--rate-runs-at-once K`` and with 1 in turn
(A B A B ...), each in a fresh session, and prints each pair's walls, the median ratio and
whether every run named the deadlocking commit (exit 1 if one did not). Results in
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = '''\
"""Three trainer threads share a batch loader; prints tokens/s at the end."""
import threading, time
import torch
from loader import Loader

torch.set_num_threads(1)
loader = Loader()
results = []


def worker(i):
    torch.manual_seed(i)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens, t0 = 0, time.perf_counter()
    for step in range(200):
        x = loader.next_batch(i)
        loss = model(x).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        tokens += x.shape[0]
    results.append(tokens / (time.perf_counter() - t0))


threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
for t in threads: t.start()
for t in threads: t.join()
print(f"throughput: {sum(results):.1f} tok/s", flush=True)
'''

LOADER = """\
import threading
import torch


class Loader:
    def __init__(self):
        self.lock = threading.Lock()
        self.stats_lock = threading.Lock()
        self.served = 0

    def next_batch(self, i):
        with self.lock:
            self.served += 1
            return torch.randn(32, 64)
"""

# The third commit: odd trainers take stats_lock then lock, even ones lock then stats_lock.
COUNTING = """\
        if i % 2:  # odd trainers update the stats first
            with self.stats_lock:
                with self.lock:
                    self.served += 1
        else:
            with self.lock:
                x = torch.randn(32, 64)
                with self.stats_lock:
                    self.served += 1
                return x
        with self.lock:
            return torch.randn(32, 64)
"""
REGEX = r"throughput: ([0-9.]+) tok/s"


def _git(repo: Path, *args: str) -> str:
    when = "2026-11-02T09:00:00Z"
    env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    out = subprocess.run(
        ["git", "-c", "user.name=u", "-c", "user.email=u@x", *args],
        cwd=repo, check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    return out.stdout.strip()


def _envbisect(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbisect", *args], cwd=cwd, capture_output=True, text=True
    )


def setup(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    repo = root / "trainer"
    repo.mkdir(parents=True)
    (repo / "train.py").write_text(TRAIN)
    (repo / "loader.py").write_text(LOADER)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "trainer: three threads")
    (repo / "loader.py").write_text(LOADER + "# stats\n")
    _git(repo, "commit", "-qam", "loader: comment")
    good = _git(repo, "rev-parse", "HEAD")
    body = LOADER.split("        with self.lock:\n")[0] + COUNTING + "# stats\n"
    (repo / "loader.py").write_text(body)
    _git(repo, "commit", "-qam", "loader: count served batches per trainer")
    (repo / "README.md").write_text("tiny trainer\n")
    _git(repo, "add", "README.md")
    _git(repo, "commit", "-qm", "docs")
    (root / "envbisect.yaml").write_text("repos: [trainer]\nmanifests_dir: manifests\n")
    py = sys.executable  # an interpreter with torch: the project's own venv
    _git(repo, "checkout", "-q", good)
    snap = ["snapshot", "--config", "envbisect.yaml", "--python", py]
    for label in ("good", "bad"):
        if label == "bad":
            _git(repo, "checkout", "-q", "main")
            (repo / "train.py").write_text(TRAIN.replace("lr=0.01", "lr=0.02"))
        res = _envbisect(*snap, "--label", label, "-o", f"{label}.yaml", cwd=root)
        if res.returncode:
            raise SystemExit(f"snapshot {label}: {res.stderr.strip()}")
    print(f"set up {root}: good {good[:12]}, bad main + an uncommitted edit")


def run(root: Path, at_once: str) -> tuple[float, bool]:
    """One ``envbisect run`` in a fresh session: its wall and whether it named the commit."""
    session = root / f"session-{at_once}"
    shutil.rmtree(session, ignore_errors=True)
    argv = [
        "run", "--config", "../envbisect.yaml", "--python", sys.executable,
        "--good", "../good.yaml", "--bad", "../bad.yaml", "--until", "70%",
        "--hang-after", "8", "--rate-runs-at-once", str(at_once), "--session", str(session),
        "--json", str(session) + ".json", "--metric-regex", REGEX, "--", "python", "train.py",
    ]  # fmt: skip
    start = time.monotonic()
    res = _envbisect(*argv, cwd=root / "trainer")
    wall = time.monotonic() - start
    doc = json.loads(Path(str(session) + ".json").read_text()) if res.returncode == 0 else {}
    commits = [c.get("commit") or "" for c in doc.get("culprits", [])]
    shutil.rmtree(session, ignore_errors=True)
    return wall, commits == [_git(root / "trainer", "rev-parse", "main~1")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--at-once", default="3", help="a number, or auto (the default of run)")
    ap.add_argument("--root", type=Path, help="where to build the world (default: a temp dir)")
    ns = ap.parse_args()
    root = (ns.root or Path(tempfile.mkdtemp(prefix="envbisect-bench-at-once-"))).resolve()
    try:
        setup(root)
        rows, right = [], True
        for i in range(ns.pairs):
            a, ok_a = run(root, ns.at_once)
            b, ok_b = run(root, "1")
            right = right and ok_a and ok_b
            rows.append((a, b))
            print(f"pair {i + 1}: at once {a:.1f} s, one after another {b:.1f} s, {a / b:.3f}")
        ratio = statistics.median(a / b for a, b in rows)
        print("\n| runs at once | wall median | one after another | ratio (median of pairs) |")
        print("|---|---|---|---|")
        a_med = statistics.median(a for a, _ in rows)
        b_med = statistics.median(b for _, b in rows)
        print(f"| {ns.at_once} | {a_med:.1f} s | {b_med:.1f} s | {ratio:.3f} |")
        print(f"every run named the deadlocking commit: {right}")
        return 0 if right else 1
    finally:
        if ns.root is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
