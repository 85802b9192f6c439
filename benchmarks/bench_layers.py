"""The layered code against a reference revision, paired: the core diff and a run's actuation.

Issue 27 split the code into layer packages; the goal is that the work a user waits for is
within 1.1x of the revision before the split. Two worker processes, one importing envbisect
from this checkout and one from ``--before`` (the ``src`` folder of a checkout of the
reference revision, e.g. ``git worktree add /tmp/eb-before 833953f``), each load the same two
20,000-entry manifests (bench_diff's generator) once and then, turn by turn (A B, B A, ...),
time what they are asked:

1. core: ``diff_manifests(good, bad)``;
2. render: the diff rendered as a table (wording and redaction included).

The actuation half (bench_run.py: overlay venv build and revisit) is a whole script per
revision; it is paired from outside with a process timer, on ``bench_run.py`` of each checkout.
Usage: python benchmarks/bench_layers.py --before /tmp/eb-before/src [--runs N]
Prints a markdown table of medians and the median of the per-pair ratios (this / before).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_diff import generate  # noqa: E402

WORKER = r"""
import json, sys, time
try:
    from envbisect.model import manifest
except ImportError:  # the reference revision, before the layers
    from envbisect import manifest
from envbisect.diff import diff_manifests
try:
    from envbisect.render.diff import render
except ImportError:
    from envbisect.render import render
good, bad = manifest.load(sys.argv[1]), manifest.load(sys.argv[2])
result = diff_manifests(good, bad)
print(json.dumps({"ready": result.summary()}), flush=True)
for line in sys.stdin:
    what = line.strip()
    t0 = time.perf_counter()
    if what == "core":
        diff_manifests(good, bad)
    elif what == "render":
        render(result, "table")
    print(json.dumps({what: time.perf_counter() - t0}), flush=True)
"""


class Worker:
    """One revision's envbisect in its own process, timing on request."""

    def __init__(self, src: Path | None, good: Path, bad: Path) -> None:
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = str(src)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(good), str(bad)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.summary = self._read()["ready"]

    def _read(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker {self.proc.args[-2:]} ended early")
        return json.loads(line)

    def time(self, what: str) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return float(self._read()[what])  # type: ignore[arg-type]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="src/ of the reference")
    parser.add_argument("--runs", type=int, default=31)
    args = parser.parse_args()
    if not (args.before / "envbisect").is_dir():
        raise SystemExit(f"--before {args.before}: no envbisect package there")
    from envbisect.model import manifest

    with tempfile.TemporaryDirectory(prefix="bench-layers-") as tmp:
        good, bad = generate()
        paths = Path(tmp) / "good.json", Path(tmp) / "bad.json"
        for m, path in zip((good, bad), paths, strict=True):
            path.write_text(json.dumps(m.as_dict()))
        manifest.load(paths[0])  # the JSON fast path reads what it wrote
        this, before = Worker(None, *paths), Worker(args.before, *paths)
        if this.summary != before.summary:
            raise SystemExit(f"the revisions disagree: {this.summary!r} vs {before.summary!r}")
        print(f"diff: {this.summary}; {args.runs} pairs, order alternating")
        print("| measure | this median s | before median s | this/before (median of pairs) |")
        print("|---|---|---|---|")
        for what in ("core", "render"):
            this.time(what), before.time(what)  # one warm-up pair
            mine, theirs, ratios = [], [], []
            for i in range(args.runs):
                pair = (this, before) if i % 2 == 0 else (before, this)
                got = {id(w): w.time(what) for w in pair}
                mine.append(got[id(this)])
                theirs.append(got[id(before)])
                ratios.append(got[id(this)] / got[id(before)])
            print(
                f"| {what} | {statistics.median(mine):.4f} | {statistics.median(theirs):.4f} "
                f"| {statistics.median(ratios):.3f} |"
            )
        this.close(), before.close()


if __name__ == "__main__":
    main()
