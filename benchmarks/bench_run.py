"""Package-state actuation cost: building an overlay venv vs revisiting it (goal: revisit ≪ 1 s).

The target is a real environment (default: the interpreter running this script, i.e. the
project's venv with torch and ~100 other distributions). The state asks for one package the
target lacks (a tiny wheel built here, installed by uv from a local directory) and for one
package the target has to be absent (hidden by leaving it out of the link farm), so a build
runs ``uv venv`` + ``uv pip install`` + the link farm over the whole site-packages.

Measured in this process, medians over --runs:

1. build: ``Actuator.realize`` of that state in a fresh session (uv's own cache warm after
   the first build, as in a real session);
2. revisit: ``Actuator.realize`` of the same state again in the same session (cache hit);
3. reference: ``python -c pass`` of the target interpreter, a floor for any trial.

And one correctness check per build: in the overlay, the new package imports and the hidden
one does not. Usage: python benchmarks/bench_run.py [--runs N] [--python PATH]
Prints a markdown table; nothing is asserted beyond the correctness check.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envbisect.diff import diff_manifests  # noqa: E402
from envbisect.model.manifest import Manifest  # noqa: E402
from envbisect.model.session import Session  # noqa: E402
from envbisect.realize.actuate import Actuator  # noqa: E402 - after the path fix above
from tests.helpers_run import build_wheel, pkg  # noqa: E402


def _state(tmp: Path, python: str, wheels: Path, hide: str) -> tuple[Actuator, frozenset[str]]:
    good = Manifest({"packages": {"ebwork": pkg("1.0")}}, tmp / "good.yaml")
    bad = Manifest({"packages": {hide: pkg("x")}}, tmp / "bad.yaml")
    diff = diff_manifests(good, bad)
    session = Session.start(tmp / "session", {})
    act = Actuator(
        good=good,
        bad=bad,
        units=diff.units,
        session=session,
        python=python,
        index_url=(tmp / "no-index").as_uri(),
        find_links=(str(wheels),),
    )
    return act, frozenset()  # nothing applied: ebwork present, `hide` absent


def _realize(act: Actuator, applied: frozenset[str], trial: Path) -> str:
    with act.realize(applied, {}, trial) as state:
        assert state.failure is None, state.failure
        return state.python


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--hide", default="tabulate", help="a distribution the target has")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="envbisect-bench-run-"))
    try:
        return _measure(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(root: Path, args: argparse.Namespace) -> int:
    wheels = root / "wheels"
    build_wheel(wheels, "ebwork", "1.0", "WORK = 1\n")
    builds, revisits, floors = [], [], []
    for i in range(args.runs):
        tmp = root / f"r{i}"
        tmp.mkdir()
        act, applied = _state(tmp, args.python, wheels, args.hide)
        act.target()  # the env probe happens once per run, not per state

        start = time.perf_counter()
        python = _realize(act, applied, tmp / "trial")
        builds.append(time.perf_counter() - start)
        check = f"import importlib.util as u, ebwork; assert u.find_spec({args.hide!r}) is None"
        subprocess.run([python, "-c", check], check=True)
        for _ in range(5):
            start = time.perf_counter()
            _realize(act, applied, tmp / "trial")
            revisits.append(time.perf_counter() - start)
        floors.append(_time(lambda: subprocess.run([args.python, "-c", "pass"], check=True)))
    build, revisit, floor = (statistics.median(x) for x in (builds, revisits, floors))
    entries = sum(1 for _ in (Path(act.target().sites[0])).iterdir())
    print(f"target: {args.python} ({len(act.target().dists)} distributions, {entries} entries)")
    print("| step | median s | vs build |")
    print("|---|---|---|")
    print(f"| build overlay venv (uv venv + install + link farm) | {build:.3f} | 1.00 |")
    print(f"| revisit (cached by package-set hash) | {revisit:.4f} | {revisit / build:.4f} |")
    print(f"| reference: `python -c pass` | {floor:.3f} | {floor / build:.3f} |")
    print(f"runs: {args.runs} builds, {len(revisits)} revisits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
