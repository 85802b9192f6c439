"""On a GPU machine: ``envbisect run`` with the built-in drafter smoke test over a real drift.

The good state is a training repo (real git history), a dataset, a compile cache and a few
environment variables; the bad state drifted the way the field's box did: a commit, the
field's hand patch in the model file (uncommitted), the dataset grown to 11,000 prompts,
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, ``OMP_NUM_THREADS`` changed, and
``TORCH_COMPILE_DISABLE=1`` (someone disabled compilation "to debug the FX error": flex
attention then runs unfused). Only the last one slows the compiled-flex drafter.

The smoke test is the drafter at the size the race was measured at (h200 dims, 1 layer,
S=1024, 64 anchors; regional compilation, eager masks): it compiles in under a minute from
an empty cache and in seconds from a warm one, so a whole bisection fits one device call.

Usage (repo root, envbisect importable, e.g. PYTHONPATH=src):
    python3 benchmarks/device/gpu_bisect.py OUTDIR
Writes OUTDIR/transcript.txt, run.json, report.md, good.yaml, bad.yaml; exit code is run's.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import contextlib

from envbisect.run.demo import FIELD_PATCH, FIXTURE, _git, _write_prompts  # noqa: E402

SMOKE = [
    "-m", "envbisect.agent.drafter", "--preset", "h200", "--layers", "1",
    "--seq-len", "1024", "--anchors", "64", "--warmup", "3", "--steps", "8",
]  # fmt: skip
if os.environ.get("GPU_BISECT_SMOKE"):  # a plumbing check of this script on a CPU
    SMOKE = ["-m", "envbisect.agent.drafter", *shlex.split(os.environ["GPU_BISECT_SMOKE"])]
THRESHOLD_FRACTION = 0.7


class Transcript:
    def __init__(self, path: Path) -> None:
        self.fh = path.open("w", encoding="utf-8")
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {text}"
        print(line, flush=True)
        self.fh.write(line + "\n")
        self.fh.flush()

    def run(self, argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
        self.say("$ " + shlex.join(argv))
        t = time.monotonic()
        # Streamed line by line into the transcript (stderr with it), so that a call cut
        # short keeps what the command printed so far.
        with subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as child:
            assert child.stdout is not None
            lines = []
            for line in child.stdout:
                lines.append(line)
                self.fh.write(line)
                self.fh.flush()
            code = child.wait()
        self.say(f"exit {code} in {time.monotonic() - t:.1f}s")
        return subprocess.CompletedProcess(argv, code, "".join(lines), "")


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="envbisect-gpu-"))
    tr = Transcript(out / "transcript.txt")
    py = sys.executable
    eb = [py, "-m", "envbisect"]
    cfg = _good_state(root, py)
    good_env = _good_env(root)
    good, bad = root / "manifests" / "good.yaml", root / "manifests" / "bad.yaml"
    snap = [*eb, "snapshot", "--config", str(cfg), "--python", py]
    tr.run([*snap, "--label", "good", "-o", str(good)], good_env, root)
    good_median = _measure_good(tr, py, good_env, root)

    tr.say("drifting: a commit, the field's patch, a grown dataset, three env vars")
    bad_env = _drift(root, good_env)
    tr.run([*snap, "--label", "bad", "-o", str(bad)], bad_env, root)
    diff = tr.run([*eb, "diff", str(good), str(bad)], bad_env, root)
    tr.say("diff:\n" + diff.stdout)

    threshold = THRESHOLD_FRACTION * good_median
    t = time.monotonic()
    run_argv = [
        *eb, "run", "--config", str(cfg), "--python", py,
        "--good", str(good), "--bad", str(bad),
        "--until-ktoks", f"{threshold / 1000:.1f}k",
        "--session", str(root / "session"), "--timeout", "240",
        "--json", str(out / "run.json"), "--report", str(out / "report.md"),
    ]  # fmt: skip
    run = tr.run(run_argv, bad_env, root)
    tr.say(f"run: exit {run.returncode}, wall {time.monotonic() - t:.1f}s")
    tr.say("run stdout:\n" + run.stdout)
    _say_trial_walls(tr, root / "session")
    shutil.copy(good, out / "good.yaml")
    shutil.copy(bad, out / "bad.yaml")
    return run.returncode


def _good_state(root: Path, py: str) -> Path:
    """The training repo (one commit), the dataset and envbisect.yaml under ``root``;
    returns the config's path."""
    repo = root / "repo"
    shutil.copytree(FIXTURE / "repo", repo)
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    _git(repo, "add", "-A", when="2026-11-02T09:00:00Z")
    _git(repo, "commit", "-q", "-m", "drafter training: first run", when="2026-11-02T09:00:00Z")
    (root / "data").mkdir()
    (root / "manifests").mkdir()
    _write_prompts(root / "data" / "prompts.jsonl", 2000, seed=1, max_words=96)
    config = {
        "label": "h200",
        "repos": ["repo"],
        "files": ["repo/*.py"],
        "data": ["data/prompts.jsonl"],
        "data_map": {"data/prompts.jsonl": "data/prompts-v1.jsonl"},
        "probes": ["torch.fx._symbolic_trace.is_fx_symbolic_tracing"],
        "keep_blobs": True,
        "manifests_dir": "manifests",
        "smoke": [py, *SMOKE],
    }
    cfg = root / "envbisect.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return cfg


def _good_env(root: Path) -> dict[str, str]:
    """This environment without the bad state's variables, caches under ``root``."""
    good_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCH_COMPILE_DISABLE", "PYTORCH_CUDA_ALLOC_CONF")
    }
    good_env.update(
        PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"),
        TORCHINDUCTOR_CACHE_DIR=str(root / "cache" / "inductor"),
        TRITON_CACHE_DIR=str(root / "cache" / "triton"),
        OMP_NUM_THREADS="8",
    )
    return good_env


def _measure_good(tr: Transcript, py: str, good_env: dict[str, str], root: Path) -> float:
    """The good state's median tok/s over 3 samples of one process."""
    tr.say("measuring the good state (3 samples from one process; warms the compile cache)")
    res_file = root / "good-smoke.json"
    tr.run([py, *SMOKE, "--samples", "3"], {**good_env, "ENVBISECT_RESULT": str(res_file)}, root)
    result = json.loads(res_file.read_text())
    samples = result.get("samples") or []
    good_median = sorted(samples)[len(samples) // 2]
    tr.say(
        f"good: samples {[round(s) for s in samples]} tok/s, warm-up {result['warmup_s']:.1f}s, "
        f"MFU {100 * (result.get('mfu') or 0):.1f}%"
    )
    return good_median


def _drift(root: Path, good_env: dict[str, str]) -> dict[str, str]:
    """Drift the files the way the field's box did; returns the bad state's environment."""
    repo = root / "repo"
    train = repo / "train.py"
    train.write_text(train.read_text() + "\n# log every 10 steps\n")
    _git(repo, "commit", "-q", "-am", "train: log every 10 steps", when="2026-11-20T15:30:00Z")
    model = repo / "dflash_model.py"
    model.write_text(model.read_text() + FIELD_PATCH)
    (root / "data" / "prompts.jsonl").rename(root / "data" / "prompts-v1.jsonl")
    _write_prompts(root / "data" / "prompts.jsonl", 11000, seed=2, max_words=96)
    return dict(
        good_env,
        PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
        OMP_NUM_THREADS="4",
        TORCH_COMPILE_DISABLE="1",
    )


def _say_trial_walls(tr: Transcript, session: Path) -> None:
    """Each trial's drafter wall time per process, from the session's result files."""
    for d in sorted(session.glob("trials/*")):
        walls = []
        for res in sorted(d.glob("*.result.json")):
            with contextlib.suppress(ValueError):
                walls.append(round(json.loads(res.read_text()).get("elapsed_s") or 0, 1))
        tr.say(f"trial {d.name}: drafter elapsed_s per process {walls}")


if __name__ == "__main__":
    raise SystemExit(main())
