"""Snapshot speed, as whole-process wall times of paired runs (A B A B ...), medians.

1. ``envbisect snapshot`` of an environment with CPU torch installed vs
   ``python -m torch.utils.collect_env`` in the same environment. Goal: ratio <= 0.15.
2. ``envbisect snapshot`` with a 10,000-file TorchInductor cache vs the same snapshot with
   an empty cache dir. Goal: the 10,000-file snapshot <= 1 s.
3. (``--kept-mb N``) ``envbisect snapshot --via 'sh -c' --keep-caches`` of an N MB cache whose
   content the blob store already holds vs the same into an empty blob store: what a
   second snapshot of a remote target costs now that only missing content travels.

Usage: python benchmarks/bench_snapshot.py [--runs N] [--python TARGET_PYTHON] [--kept-mb N]
The target Python defaults to the one running this script (it must have torch installed for
part 1). Prints a markdown table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(argv)}")
    return elapsed


def paired(a, b, runs: int) -> tuple[float, float, float]:
    """Medians of A, of B, and of the per-pair ratio A/B (after one warm-up pair)."""
    a(), b()
    ta, tb, ratios = [], [], []
    for _ in range(runs):
        x, y = a(), b()
        ta.append(x)
        tb.append(y)
        ratios.append(x / y)
    return statistics.median(ta), statistics.median(tb), statistics.median(ratios)


def make_cache(root: Path, files: int) -> None:
    """An inductor-like tree: a few top dirs, two-hex-digit buckets, small files."""
    tops = ("fxgraph", "aotautograd", "triton", "cpp")
    for i in range(files):
        d = root / tops[i % len(tops)] / f"{i % 251:02x}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"c{i}.bin").write_bytes(b"k" * (i % 257))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--kept-mb", type=int, default=0, help="part 3 only, with this cache")
    args = parser.parse_args()
    if args.kept_mb:
        kept_through_a_layer(args.kept_mb, args.runs, args.python)
        return

    envbisect = [sys.executable, "-m", "envbisect"]
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_",))}
        empty = work / "empty-cache"
        empty.mkdir()
        big = work / "big-cache"
        make_cache(big, args.files)
        out = str(work / "m.yaml")
        snap = [*envbisect, "snapshot", "--python", args.python, "-o", out]

        def snapshot_empty() -> float:
            return wall(snap, {**env, "TORCHINDUCTOR_CACHE_DIR": str(empty)}, work)

        def snapshot_big() -> float:
            return wall(snap, {**env, "TORCHINDUCTOR_CACHE_DIR": str(big)}, work)

        def collect_env() -> float:
            return wall([args.python, "-m", "torch.utils.collect_env"], env, work)

        a, b, r = paired(snapshot_empty, collect_env, args.runs)
        c, d, r2 = paired(snapshot_big, snapshot_empty, args.runs)
        print(f"runs: {args.runs} pairs each; target python: {args.python}\n")
        print("| measurement | median A s | median B s | median A/B | goal |")
        print("|---|---|---|---|---|")
        print(f"| snapshot (A) vs collect_env (B) | {a:.3f} | {b:.3f} | {r:.3f} | A/B <= 0.15 |")
        print(
            f"| snapshot, {args.files} cache files (A) vs empty cache (B) "
            f"| {c:.3f} | {d:.3f} | {r2:.2f} | A <= 1 s |"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def kept_through_a_layer(mb: int, runs: int, python: str) -> None:
    """Part 3: a kept cache of ``mb`` MB through a real layer, store holding it (A) vs an
    empty store (B)."""
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-kept-"))
    try:
        cache = work / "cache"
        cache.mkdir()
        for i in range(mb):  # 1 MB files of distinct content
            (cache / f"k{i}.bin").write_bytes(os.urandom(1 << 20))
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
        argv = [sys.executable, "-m", "envbisect", "snapshot", "--via", "sh -c"]
        argv += ["--python", python, "--keep-caches", f"{mb + 64}MiB", "-o", "m.yaml"]
        store = work / "manifests" / "blobs"

        def held() -> float:
            return wall(argv, env, work)  # the store keeps what the last snapshot stored

        def empty() -> float:
            shutil.rmtree(store, ignore_errors=True)
            return wall(argv, env, work)

        a, b, r = paired(held, empty, runs)
        print(f"runs: {runs} pairs; a {mb} MB kept cache through --via 'sh -c'\n")
        print("| measurement | median A s | median B s | median A/B |")
        print("|---|---|---|---|")
        print(f"| store holds the content (A) vs empty store (B) | {a:.3f} | {b:.3f} | {r:.3f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
