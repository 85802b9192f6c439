"""Disk a bisection takes with a large default inductor cache in place (issue 21).

The field's runs copied the whole default TorchInductor cache into every trial (2.4–4.3 GB
each, 18–25 GB a session) although no cache had changed. This script builds a user's world
with a 1 GB default inductor cache of real bytes (``<TMPDIR>/torchinductor_<user>``, TMPDIR
pointed at a private directory so the default path is ours alone), takes good and bad
snapshots with ``envbisect snapshot``, runs ``envbisect run`` over a repo with 16 commits and
7 env vars (10–11 trials) and samples, every 50 ms while the run goes on:

    extra   bytes under the session dir, less its venvs/ and worktrees/, plus how far the
            private TMPDIR grew beyond the 1 GB cache (a copy anywhere there counts)

Reported: trials, exit status, the peak of ``extra``, and after ``envbisect reset`` what is
left under the session dir besides its logs (venvs, worktrees, cache dirs). Everything is
made under one directory in /tmp and removed at the end, the 1 GB cache included.

Usage:
    python benchmarks/bench_cache_disk.py [--cache-mb 1024] [--keep]
Nothing is asserted; results are recorded in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

TRAIN = r"""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model
data = sys.argv[1]
tokens = sum(len(line) for line in open(data))
start = time.perf_counter()
acc = model.forward(tokens)
print("%.1f tok/s" % (tokens / (time.perf_counter() - start)))
"""

MODEL = """WORK = {work}


def forward(tokens):
    acc = 0
    for t in range(tokens):
        for i in range(100 * WORK):
            acc = (acc + i * t) % 1000003
    return acc
"""


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@e"}
    env.update(GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@e")
    out = subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True)
    return out.stdout.decode().strip()


def du(path: Path) -> int:
    """Bytes allocated under ``path`` (real blocks, so a sparse file would not count)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed while we walked
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def make_cache(path: Path, mb: int) -> None:
    """``mb`` MB of real, incompressible bytes in 16 MB files (fsynced)."""
    block = os.urandom(16 << 20)
    path.mkdir(parents=True)
    for i in range(max(1, mb // 16)):
        sub = path / f"fxgraph-{i % 8}"
        sub.mkdir(exist_ok=True)
        with open(sub / f"entry-{i}.bin", "wb") as fh:
            fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())


def envbisect(cwd: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "envbisect", *argv]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def world(root: Path, cache_mb: int) -> tuple[Path, dict[str, str], Path, Path]:
    tmpdir = root / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    make_cache(tmpdir / f"torchinductor_{getpass.getuser()}", cache_mb)
    ws = root / "ws"
    repo = ws / "repo"
    (repo / "data").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text(TRAIN)
    (repo / "model.py").write_text(MODEL.format(work=1))
    (repo / "data" / "x.txt").write_text("abcdefgh" * 400 + "\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    names = [f"EB_U{i}" for i in range(7)]
    (ws / "envbisect.yaml").write_text(json.dumps({"repos": [str(repo)], "env": names}))
    good = ws / "good.yaml"
    py = sys.executable
    snap = envbisect(ws, env, "snapshot", "-o", str(good), "--python", py)
    assert snap.returncode == 0, snap.stderr
    for i in range(16):
        if i == 10:
            (repo / "model.py").write_text(MODEL.format(work=8))
        else:
            (repo / f"notes-{i}.txt").write_text(f"{i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"change {i}")
    bad = ws / "bad.yaml"
    bad_env = {**env, **{n: "1" for n in names}}
    snap = envbisect(ws, bad_env, "snapshot", "-o", str(bad), "--python", py)
    assert snap.returncode == 0, snap.stderr
    return ws, env, good, bad


def measure(root: Path, cache_mb: int) -> dict[str, object]:
    ws, env, good, bad = world(root, cache_mb)
    session = ws / ".envbisect" / "session"
    tmp_base = du(root / "tmp")
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            extra = 0
            if session.exists():
                extra = du(session) - du(session / "venvs") - du(session / "worktrees")
            extra += max(0, du(root / "tmp") - tmp_base)
            peak = max(peak, extra)
            done.wait(0.05)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    command = ["python", "repo/train.py", "repo/data/x.txt"]
    argv = ["run", "--good", str(good), "--bad", str(bad), "--python", sys.executable]
    argv += ["--metric-regex", r"([0-9.]+) tok/s", "--until", "50%", "--json", "-", "--", *command]
    res = envbisect(ws, env, *argv)
    done.set()
    watcher.join()
    doc = json.loads(res.stdout[res.stdout.index("{") :]) if "{" in res.stdout else {}
    before_reset = du(session)
    reset = envbisect(ws, env, "reset")
    left = {
        name: du(session / name)
        for name in ("venvs", "worktrees", "caches")
        if (session / name).exists()
    }
    left["trials/*/caches"] = sum(du(p) for p in session.glob("trials/*/caches"))
    return {
        "command": " ".join(["envbisect", *argv[: -len(command)], *command]),
        "cache_mb": cache_mb,
        "exit": res.returncode,
        "trials": len(doc.get("trials", [])),
        "culprits": [c.get("unit") for c in doc.get("culprits", [])],
        "peak_extra_mb": round(peak / 2**20, 2),
        "session_mb_before_reset": round(before_reset / 2**20, 2),
        "reset_exit": reset.returncode,
        "left_after_reset_bytes": left,
        "session_mb_after_reset": round(du(session) / 2**20, 2),
        "stderr_tail": res.stderr.splitlines()[-3:] if res.returncode else [],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-mb", type=int, default=1024)
    ap.add_argument("--keep", action="store_true", help="keep the directory (for a look)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="envbisect-bench-cache-", dir="/tmp"))
    try:
        out = measure(root, args.cache_mb)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
