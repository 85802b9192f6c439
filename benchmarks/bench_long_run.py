"""A user's real, long training command bisected as it is, against a hand-written smoke
version of it (issue 46: a trial of a long run ends once its rate is known).

The world: a git repo of a nanoGPT-shaped CPU trainer (``iter N: loss X, time Yms`` per
iteration, no figure in tok/s), four commits, the third widening its MLP (the culprit). The
same ``envbisect run --until 70%`` with no --metric-regex, from the repo's parent:

- A: ``python repo/train.py 5000``: the real command, 5,000 iterations (≥ 20× what a rate
  needs); each run ends once its rate is known (the probe's rule, no option given);
- B: ``python repo/train.py 40``: the smoke version a user would otherwise write by hand.

    python benchmarks/bench_long_run.py [--pairs 3] [--iters 5000] [--root DIR]

runs A B A B ... in fresh sessions and prints each pair's walls, the median ratio A/B,
whether every run named the culprit commit, and per A run the seconds its trials saved (each
trial's iterations left at its stop times its median step). Exit 1 if a run named another
culprit. Results in ``benchmarks/RESULTS.md``.
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

TRAIN = """\
import sys, time
import torch

ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
WIDTH = 256
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(
    torch.nn.Linear(128, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, 128)
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for it in range(ITERS):
    t0 = time.time()
    x = torch.randn(512, 128)
    loss = (model(x) - x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"iter {it}: loss {loss.item():.4f}, time {(time.time() - t0) * 1000:.2f}ms", flush=True)
"""


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


def setup(root: Path) -> str:
    """The world under ``root``; returns the culprit commit."""
    shutil.rmtree(root, ignore_errors=True)
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / "train.py").write_text(TRAIN)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "trainer")
    (repo / "README.md").write_text("a trainer\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "readme")
    good = _git(repo, "rev-parse", "HEAD")
    (repo / "train.py").write_text(TRAIN.replace("WIDTH = 256", "WIDTH = 1024"))
    _git(repo, "commit", "-qam", "model: wider MLP")
    culprit = _git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("a wider trainer\n")
    _git(repo, "commit", "-qam", "readme: wider")
    (root / "envbisect.yaml").write_text("repos: [repo]\nmanifests_dir: manifests\n")
    _git(repo, "checkout", "-q", good)
    for label in ("good", "bad"):
        if label == "bad":
            _git(repo, "checkout", "-q", "main")
        res = _envbisect("snapshot", "--python", sys.executable, "--label", label,
                         "-o", f"{label}.yaml", cwd=root)  # fmt: skip
        if res.returncode:
            raise SystemExit(f"snapshot {label}: {res.stderr.strip()}")
    return culprit


def run(root: Path, iters: int, tag: str) -> tuple[float, str | None, float]:
    """One ``envbisect run``: its wall, the culprit commit it named, the seconds its trials
    saved by ending early."""
    session = root / f"session-{tag}"
    shutil.rmtree(session, ignore_errors=True)
    out = root / f"{tag}.json"
    argv = [
        "run", "--good", "good.yaml", "--bad", "bad.yaml", "--python", sys.executable,
        "--until", "70%", "--session", str(session), "--json", str(out),
        "--", "python", "repo/train.py", str(iters),
    ]  # fmt: skip
    start = time.monotonic()
    res = _envbisect(*argv, cwd=root)
    wall = time.monotonic() - start
    doc = json.loads(out.read_text()) if res.returncode == 0 and out.exists() else {}
    commit = next((c.get("commit") for c in doc.get("culprits", [])), None)
    saved = 0.0
    medians = (doc.get("figure") or {}).get("trial_medians") or {}
    for trial in doc.get("trials", []):
        stops = (trial.get("timing") or {}).get("stopped_early") or []
        ms = medians.get(str(trial["index"]))
        for stop in stops:
            if ms:
                saved += (iters - int(stop["at_step"])) * ms / 1000
    shutil.rmtree(session, ignore_errors=True)
    return wall, commit, saved


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--smoke-iters", type=int, default=40)
    ap.add_argument("--root", type=Path, help="where to build the world (default: a temp dir)")
    ns = ap.parse_args()
    root = (ns.root or Path(tempfile.mkdtemp(prefix="envbisect-bench-long-"))).resolve()
    try:
        culprit = setup(root)
        rows, right, saved = [], True, []
        for i in range(ns.pairs):
            a, found_a, saved_a = run(root, ns.iters, "long")
            b, found_b, _ = run(root, ns.smoke_iters, "smoke")
            right = right and found_a == culprit and found_b == culprit
            rows.append((a, b))
            saved.append(saved_a)
            print(
                f"pair {i + 1}: {ns.iters} iterations {a:.1f} s, {ns.smoke_iters} iterations "
                f"{b:.1f} s, ratio {a / b:.3f}; trials saved {saved_a:.1f} s by ending early"
            )
        ratio = statistics.median(a / b for a, b in rows)
        a_med = statistics.median(a for a, _ in rows)
        b_med = statistics.median(b for _, b in rows)
        print(f"\n| real command ({ns.iters} it.) | smoke ({ns.smoke_iters} it.) | ratio | saved |")
        print("|---|---|---|---|")
        print(f"| {a_med:.1f} s | {b_med:.1f} s | {ratio:.3f} | {statistics.median(saved):.1f} s |")
        print(f"every run named the culprit commit {culprit[:12]}: {right}")
        return 0 if right else 1
    finally:
        if ns.root is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
