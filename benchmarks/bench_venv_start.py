"""Issue 25: how fast a trial's overlay venv starts when the target has no bytecode.

The target environment is a real uv venv with torch and the packages ``import torch``
needs, installed the way uv installs by default: without ``.pyc`` files. A trial sets
``PYTHONDONTWRITEBYTECODE=1`` (the link farm points into the target, which must never be
written; this machine sets it too), so nothing is ever cached by the imports themselves.

Two overlay venvs of the same state (a tiny extra wheel installed, so an overlay exists) are
built with envbisect's own ``venv`` operation (``agent.actuate_venv.op_venv``):

* ``before``: the link farm alone (``add_bytecode`` switched off), as envbisect built it
  before issue 25;
* ``after``: the farm with the packages that lack bytecode mirrored and compiled once into
  the session's bytecode store.

Then ``import torch`` is timed in each venv's python, rounds interleaved, and a second
``after`` venv (another state of the same session) is built to show the store is shared.
The reference: a hard-linked copy of the target compiled in place (what ``pip`` or
``uv pip install --compile-bytecode`` would have left), run directly.
Reported: median import seconds of each, their ratio, build seconds. Nothing is asserted.

Usage: python benchmarks/bench_venv_start.py [--rounds N] [--torch-spec SPEC] [UV_ARG ...]
UV_ARG: the package sources torch comes from, as uv options, after ``--``
(e.g. ``-- --find-links /opt/wheels --index-url file:///opt/pypi/simple --offline``).
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

from envbisect.agent import actuate_venv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers_run import build_wheel  # noqa: E402  (the tests' wheel builder, not a copy)

UV = shutil.which("uv") or str(Path(sys.executable).parent / "uv")


def _sh(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    kw.setdefault("check", True)
    return subprocess.run(argv, text=True, capture_output=True, **kw)  # type: ignore[call-overload,no-any-return]


def _base(root: Path, torch_spec: str, uv_args: list[str]) -> Path:
    """The target: a uv venv with torch installed without bytecode (uv's default)."""
    base = root / "target"
    _sh([UV, "venv", "-q", "--python", sys.executable, str(base)])
    _sh(
        [UV, "pip", "install", "-q", "--python", str(base / "bin" / "python"), *uv_args, torch_spec]
    )
    pyc = sum(1 for _ in (base / "lib").rglob("*.pyc"))
    print(f"target {base}: {pyc} .pyc files", file=sys.stderr)
    return base


def _sites(python: Path) -> list[str]:
    out = _sh([str(python), "-c", "import site, json; print(json.dumps(site.getsitepackages()))"])
    return [os.path.realpath(p) for p in json.loads(out.stdout)]


def _overlay(session: Path, name: str, base: Path, wheels: Path, *, bytecode: bool) -> float:
    """One overlay venv built by envbisect's venv operation; its build seconds."""
    venv = session / "venvs" / name
    params = {
        "venv": str(venv),
        "base": os.path.realpath(base / "bin" / "python"),
        "install": [],
        "installs": [
            [["--offline", "--no-index", "--find-links", str(wheels)], [f"ebtiny=={name[-1]}.0"]]
        ],
        "sites": _sites(base / "bin" / "python"),
        "excluded": {},
        "spec": {"bench": name},
        "uv": [UV],
        "where": "",
    }

    def run(argv: list[str], _name: str) -> tuple[int, str, None]:
        proc = subprocess.run(argv, capture_output=True, text=True)
        return proc.returncode, proc.stdout + proc.stderr, None

    keep = actuate_venv.add_bytecode
    if not bytecode:
        actuate_venv.add_bytecode = lambda *a, **k: []  # type: ignore[assignment]
    try:
        t = time.perf_counter()
        out = actuate_venv.op_venv(params, run)
        took = time.perf_counter() - t
    finally:
        actuate_venv.add_bytecode = keep
    if out.get("failure"):
        raise SystemExit(out["failure"])
    return took


def _import_s(venv: Path) -> float:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    t = time.perf_counter()
    _sh([str(venv / "bin" / "python"), "-W", "ignore", "-c", "import torch"], env=env)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--torch-spec", default="torch")
    ap.add_argument("uv_args", nargs="*", help="uv options naming torch's sources (after --)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="envbisect-bench-venv-") as tmp:
        root = Path(tmp)
        wheels = root / "wheels"
        for v in ("1", "2", "3"):
            build_wheel(wheels, "ebtiny", f"{v}.0", f"V = {v}\n")
        base = _base(root, args.torch_spec, args.uv_args)
        before = _overlay(root / "old-session", "state-1", base, wheels, bytecode=False)
        after = _overlay(root / "session", "state-2", base, wheels, bytecode=True)
        second = _overlay(root / "session", "state-3", base, wheels, bytecode=True)
        compiled = root / "target-compiled"
        _sh(["cp", "-al", str(base), str(compiled)])  # new .pyc files only; sources shared
        _sh(
            [
                str(compiled / "bin" / "python"),
                "-m",
                "compileall",
                "-q",
                "-j",
                "0",
                str(compiled / "lib"),
            ],
            check=False,
        )
        venvs = {
            "before": root / "old-session" / "venvs" / "state-1",
            "after": root / "session" / "venvs" / "state-2",
            "after (2nd venv)": root / "session" / "venvs" / "state-3",
            "reference: target compiled": compiled,
        }
        times: dict[str, list[float]] = {k: [] for k in venvs}
        for _ in range(args.rounds):
            for key, venv in venvs.items():
                times[key].append(_import_s(venv))
        med = {k: statistics.median(v) for k, v in times.items()}
        result = {
            "import_torch_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
            "median_s": {k: round(v, 2) for k, v in med.items()},
            "ratio_before_over_after": round(med["before"] / med["after"], 1),
            "ratio_after_over_reference": round(
                med["after"] / med["reference: target compiled"], 2
            ),
            "load_average": os.getloadavg(),
            "build_s": {
                "before": round(before, 1),
                "after (first venv: compiles)": round(after, 1),
                "after (2nd venv: store shared)": round(second, 1),
            },
        }
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
