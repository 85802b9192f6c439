"""Peak memory of a snapshot that receives a large kept compile cache through ``--via``.

The world: a compile cache holding one file of random bytes (``--mb``, default 300 MB, the
size the hostile-input review sent) and an envbisect.yaml that keeps caches up to 1 GiB.
``envbisect snapshot --via "sh -c"`` (a real layer: the content travels back through the
agent's stdout as it does through ssh) is run in-process under a wrapper that reports the
process's own peak RSS at exit; the same snapshot of a cache of one byte is the constant
(Python, click, the collector's facts) it is compared with. Pairs alternate (big, small).

    python benchmarks/bench_reply_memory.py [--mb 300] [--pairs 3] [--root DIR]

Prints each pair's peaks, and the median of (big - small) / largest blob; the goal is
≤ 1.2 (the reply is streamed to disk: the ratio is near 0). Exit 1 when over. Results in
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WRAPPER = (
    "import atexit, resource, sys\n"
    "out = sys.argv.pop(1)\n"
    "def peak():\n"
    "    with open(out, 'w') as fh:\n"
    "        fh.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))\n"
    "atexit.register(peak)\n"
    "from envbisect.cli import main\n"
    "main(sys.argv[1:])\n"
)


def world(root: Path, name: str, size: int) -> Path:
    """A config whose only cache holds ``size`` random bytes; returns the config path."""
    cache = root / name / "cache"
    cache.mkdir(parents=True)
    with open(cache / "kernel.bin", "wb") as fh:
        left = size
        while left:
            n = min(left, 8 << 20)
            fh.write(os.urandom(n))
            left -= n
    config = root / name / "envbisect.yaml"
    config.write_text(
        f"caches: {{mine: {cache}}}\nmanifests_dir: {root / name / 'manifests'}\n"
        "keep_caches: 1GiB\n"
    )
    return config


def peak_of_snapshot(config: Path, out: Path) -> int:
    """Peak RSS (bytes) of one ``snapshot --via 'sh -c'`` of ``config``, blobs emptied first."""
    shutil.rmtree(config.parent / "manifests", ignore_errors=True)
    rss = out.with_suffix(".rss")
    # The machine's own compile caches stay out of it: only the world's cache is kept.
    quiet = config.parent / "no-default-caches"
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(quiet / "inductor"),
        "TRITON_CACHE_DIR": str(quiet / "triton"),
    }
    subprocess.run(
        [sys.executable, "-c", WRAPPER, str(rss), "snapshot", "--config", str(config),
         "--python", sys.executable, "--via", "sh -c", "-o", str(out), "--timeout", "600"],
        check=True, capture_output=True, timeout=900, env=env,
    )  # fmt: skip
    kernel = config.parent / "cache" / "kernel.bin"
    digest = hashlib.sha256()
    with open(kernel, "rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            digest.update(block)
    blob = config.parent / "manifests" / "blobs" / digest.hexdigest()
    if not blob.is_file() or blob.stat().st_size != kernel.stat().st_size:
        raise SystemExit(f"the cache's content did not come back through the layer: {blob}")
    return int(rss.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--root", type=Path, default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-reply-", dir=args.root))
    try:
        blob = args.mb << 20
        big, small = world(root, "big", blob), world(root, "small", 1)
        ratios = []
        for i in range(args.pairs):
            b = peak_of_snapshot(big, root / "big.yaml")
            s = peak_of_snapshot(small, root / "small.yaml")
            ratios.append((b - s) / blob)
            print(
                f"pair {i + 1}: peak {b / 2**20:.0f} MiB with a {args.mb} MB blob, "
                f"{s / 2**20:.0f} MiB with 1 byte; (big - small) / blob = {ratios[-1]:.3f}"
            )
        median = statistics.median(ratios)
        print(f"median (peak - constant) / largest blob: {median:.3f} (goal ≤ 1.2)")
        return 0 if median <= 1.2 else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
