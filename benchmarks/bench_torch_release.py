"""envbisect run across real torch releases: 2.14.1 (good) vs a pin to 2.13.0+cpu (bad).

Not run in CI: it builds two real venvs (about 6 GB, the 2.14.1 one with its CUDA wheels)
and every in-between state envbisect realizes. CPU only.

The user's story: training was fast on torch 2.14.1 (+ its CUDA stack, einops 0.8.2, tqdm
4.70.1); someone pinned ``torch==2.13.0+cpu``, moved einops and tqdm back and set two env
vars, and the step got slow. The workload is ``torch_release/train_race.py``: one thread
``make_fx``-traces while the main thread trains a ``torch.compile``d step; torch's FX flag
is one global up to 2.13 (the step runs eager while the other thread traces) and
thread-local from 2.14.0 (see docs/fx-race.md).

Steps, each timed:

1. build the two venvs with uv from the configured sources (skipped when present);
2. ``envbisect snapshot`` of each (the bad one with the two env vars set);
3. ``envbisect diff`` of the two manifests;
4. ``envbisect run --good G --bad B --python BAD -- python train_race.py`` with an
   envbisect.yaml naming the sources; the verdict, the trials (state, samples, median,
   time per state), the disk used by the work folder at the peak and after.

The envbisect.yaml is written in the richer form (``indexes``, ``find_links``,
``index_strategy``) when this checkout's config accepts it, else in the older
(``extra_index_urls``, ``find_links``) form, and the result says which.

Usage: python benchmarks/bench_torch_release.py --work /tmp/i25bench [--json OUT]
Results are printed and written as JSON (default WORK/result-<time>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "benchmarks" / "torch_release" / "train_race.py"
ENVBISECT = [sys.executable, "-m", "envbisect"]

GOOD_PINS = ("torch==2.14.1", "einops==0.8.2", "tqdm==4.70.1")
BAD_PINS = ("torch==2.13.0+cpu", "einops==0.8.1", "tqdm==4.67.1")
# Two env vars the bad state gained; both in the collector's allowlist, neither changes
# CPU speed.
BAD_ENV = {"MKL_CBWR": "COMPATIBLE", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

FIND_LINKS = ("/opt/wheels",)
EXTRA_INDEXES = ("file:///opt/pypi/simple", "file:///opt/pypi-more/simple")


def uv() -> str:
    """The uv next to this interpreter (the project's venv), else on PATH."""
    here = Path(sys.executable).with_name("uv")
    found = str(here) if here.exists() else shutil.which("uv")
    if not found:
        raise SystemExit("bench_torch_release: no uv next to the interpreter or on PATH")
    return found


def source_args() -> list[str]:
    argv = []
    for link in FIND_LINKS:
        argv += ["--find-links", link]
    for url in EXTRA_INDEXES:
        argv += ["--extra-index-url", url]
    return argv + ["--index-strategy", "unsafe-best-match"]


def du(path: Path) -> int:
    """Bytes under ``path`` (hard links counted once, as the disk holds them)."""
    if not path.exists():
        return 0
    out = subprocess.run(["du", "-sxb", str(path)], capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout else 0


def timed(argv: list[str], **kw: Any) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, **kw)
    return res, time.perf_counter() - t0


def build_venv(work: Path, name: str, pins: tuple[str, ...], env: dict[str, str]) -> dict[str, Any]:
    venv = work / name
    if (venv / "bin" / "python").exists():
        return {"venv": str(venv), "built": False, "bytes": du(venv)}
    py = shutil.which("python3.11") or sys.executable
    res, t_venv = timed([uv(), "venv", "-q", str(venv), "--python", py], env=env)
    if res.returncode:
        raise SystemExit(f"uv venv {venv}: {res.stderr.strip()}")
    argv = [uv(), "pip", "install", "--python", str(venv / "bin" / "python"), *source_args(), *pins]
    res, t_install = timed(argv, env=env)
    if res.returncode:
        raise SystemExit(f"uv pip install {' '.join(pins)}: {res.stderr.strip()[-2000:]}")
    return {
        "venv": str(venv),
        "built": True,
        "seconds": round(t_venv + t_install, 1),
        "bytes": du(venv),
    }


def write_config(work: Path, older: bool = False) -> tuple[Path, str]:
    """envbisect.yaml naming the sources: the richer form where this checkout accepts it
    (``older``: the older form whatever this checkout accepts)."""
    path = work / "envbisect.yaml"
    common = {"manifests_dir": str(work / "manifests"), "env": sorted(BAD_ENV)}
    rich = dict(
        common,
        # uv's own default index stays last: what the local indexes lack comes from it.
        indexes=list(EXTRA_INDEXES),
        find_links=list(FIND_LINKS),
        index_strategy="unsafe-best-match",
    )
    path.write_text(json.dumps(rich, indent=2) + "\n")
    try:
        if older:
            raise ValueError("--older-config")
        sys.path.insert(0, str(ROOT / "src"))
        from envbisect.model.config import Config

        Config.load(path)
        return path, "indexes + find_links + index_strategy"
    except Exception as exc:  # noqa: BLE001 - any refusal means: this checkout has the older keys
        form = dict(common, extra_index_urls=list(EXTRA_INDEXES), find_links=list(FIND_LINKS))
        path.write_text(json.dumps(form, indent=2) + "\n")
        return path, f"extra_index_urls + find_links (richer form refused: {exc})"


class DiskWatch:
    """Samples the work folder's size every ``every`` seconds; the peak and the last."""

    def __init__(self, path: Path, every: float = 5.0) -> None:
        self.path, self.every = path, every
        self.peak = self.start = du(path)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, du(self.path))

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, du(self.path))


def trials_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's trials, reduced to what RESULTS.md shows (tolerant of missing keys)."""
    out = []
    for t in doc.get("trials") or ():
        samples = t.get("samples") or []
        out.append(
            {
                "index": t.get("index"),
                "applied": t.get("applied"),
                "verdict": t.get("verdict"),
                "median_toks": statistics.median(samples) if samples else None,
                "samples": len(samples),
                "seconds": t.get("wall_s") or t.get("seconds") or t.get("elapsed_s"),
                "failure": t.get("failure"),
            }
        )
    return out


def snapshots(work: Path, config: Path, env: dict[str, str]) -> dict[str, Any]:
    """``envbisect snapshot`` of both venvs (the bad one with BAD_ENV set), then ``diff``."""
    manifests = work / "manifests"
    manifests.mkdir(exist_ok=True)
    out: dict[str, Any] = {}
    for name, extra in (("good", {}), ("bad", BAD_ENV)):
        argv = [*ENVBISECT, "snapshot", "--config", str(config), "--label", name]
        argv += ["--python", str(work / name / "bin" / "python")]
        argv += ["-o", str(manifests / f"{name}.yaml")]
        res, secs = timed(argv, env={**env, **extra}, cwd=work)
        if res.returncode:
            raise SystemExit(f"snapshot {name}: {res.stderr.strip()}")
        out[name] = {"seconds": round(secs, 2), "summary": res.stderr.strip()[-600:]}
    argv = [*ENVBISECT, "diff", "--config", str(config)]
    res, secs = timed([*argv, str(manifests / "good.yaml"), str(manifests / "bad.yaml")], env=env)
    out["diff"] = {"seconds": round(secs, 2), "text": res.stdout.strip()[-6000:]}
    print(res.stdout, file=sys.stderr)
    return out


def bisect(work: Path, config: Path, env: dict[str, str], args: argparse.Namespace) -> dict:
    """``envbisect run`` from the bad venv, with the disk of the work folder watched."""
    session, out_json, report = work / "session", work / "run.json", work / "report.md"
    for stale in (out_json, report):
        stale.unlink(missing_ok=True)
    argv = [*ENVBISECT, "run", "--config", str(config), "--python", str(work / "bad/bin/python")]
    argv += ["--good", str(work / "manifests/good.yaml"), "--bad", str(work / "manifests/bad.yaml")]
    argv += ["--session", str(session), "--fresh", "--metric-regex", r"([0-9.]+) tok/s"]
    argv += ["--timeout", str(args.timeout), "--json", str(out_json), "--report", str(report)]
    if args.repeats:
        argv += ["--repeats", str(args.repeats)]
    if args.until:
        argv += ["--until", args.until]
    argv += ["--", "python", str(WORKLOAD), "--steps", str(args.steps)]
    print("$ " + " ".join(argv[2:]), file=sys.stderr)
    run_env = {**env, **BAD_ENV}
    if args.uv_strategy_env:
        run_env["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    before = du(work)
    with DiskWatch(work) as disk:
        res, secs = timed(argv, env=run_env, cwd=work)
    doc = json.loads(out_json.read_text()) if out_json.exists() else {}
    return {
        "argv": argv,
        "uv_index_strategy_env": args.uv_strategy_env,
        "rc": res.returncode,
        "seconds": round(secs, 1),
        "stdout": res.stdout.strip()[-8000:],
        "stderr_tail": res.stderr.strip()[-3000:],
        "result": doc,
        "trials": trials_of(doc),
        "state_times": state_times(session),
        "report": report.read_text()[-6000:] if report.exists() else None,
        "disk": {
            "before_bytes": before,
            "peak_bytes": disk.peak,
            "after_bytes": du(work),
            "session_bytes": du(session),
        },
    }


def state_times(session: Path) -> list[dict[str, Any]]:
    """Time per state from the session's ``trials/NNN/trial.json``: the whole trial (build,
    state check, runs) and the workload runs alone, summed over the trial's calls."""
    out = []
    for path in sorted(session.glob("trials/*/trial.json")):
        doc = json.loads(path.read_text())
        calls = doc.get("calls") or []
        runs = [r for c in calls for r in c.get("runs") or ()]
        out.append(
            {
                "trial": doc.get("trial"),
                "applied": doc.get("applied"),
                "calls": len(calls),
                "wall_s": round(sum(c.get("wall_s") or 0 for c in calls), 1),
                "runs": len(runs),
                "runs_wall_s": round(sum(r.get("wall_s") or 0 for r in runs), 1),
                "build_failure": next(
                    (c["build_failure"] for c in calls if c.get("build_failure")), None
                ),
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="work folder (GBs; kept)")
    ap.add_argument("--json", type=Path, help="result JSON (default WORK/result-<time>.json)")
    ap.add_argument("--steps", type=int, default=24, help="workload steps per run")
    ap.add_argument("--repeats", type=int, default=None, help="envbisect run --repeats")
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds per workload run")
    ap.add_argument("--label", default="", help="a name for this run in the JSON")
    ap.add_argument("--until", help="envbisect run --until (e.g. 70%%: of the good state's speed)")
    ap.add_argument(
        "--uv-strategy-env",
        action="store_true",
        help="export UV_INDEX_STRATEGY=unsafe-best-match to the run (for a checkout whose "
        "envbisect.yaml has no index_strategy)",
    )
    ap.add_argument(
        "--older-config",
        action="store_true",
        help="write extra_index_urls + find_links (for an envbisect on PYTHONPATH from before "
        "issue 25, e.g. PYTHONPATH=<old checkout>/src)",
    )
    args = ap.parse_args()

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # uv's cache beside the venvs: hard links instead of copies, and one rm cleans it all.
    env["UV_CACHE_DIR"] = str(work / "uv-cache")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor-cache")
    git = ["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"]
    result: dict[str, Any] = {
        "label": args.label,
        "started": time.strftime("%FT%TZ", time.gmtime()),
        "envbisect_commit": subprocess.run(git, capture_output=True, text=True).stdout.strip(),
        "venvs": {
            "good": build_venv(work, "good", GOOD_PINS, env),
            "bad": build_venv(work, "bad", BAD_PINS, env),
        },
    }
    config, form = write_config(work, older=args.older_config)
    result["config_form"] = form
    print(f"config: {config} ({form})", file=sys.stderr)
    result["snapshots"] = snapshots(work, config, env)
    result["run"] = run = bisect(work, config, env, args)

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = args.json or work / f"result-{stamp}.json"
    dest.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(run["stdout"])
    d, gib = run["disk"], 1 << 30
    print(
        f"run: rc {run['rc']} in {run['seconds']:.0f} s; work folder "
        f"{d['before_bytes'] / gib:.2f} GiB before, {d['peak_bytes'] / gib:.2f} GiB at the peak, "
        f"{d['after_bytes'] / gib:.2f} GiB after (session {d['session_bytes'] / gib:.2f} GiB); "
        f"JSON: {dest}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
