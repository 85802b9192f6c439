"""Crash rates of the field's race on the GPU: cold cache, warm cache, warm-then-grown data.

Usage (from the repo root, on the GPU machine):

    python3 benchmarks/device/race_rates.py OUTDIR [--tries 10] [--knob-tries 2]
        [--parallel 4] [--budget 420] [--timeout 200]

The race configuration (``--preset h200 --layers 1 --seq-len 1024 --anchors 64
--compile-unit flex --drafter-threads 3``) is run as fresh processes in three scenarios:

* ``cold``:  an empty TorchInductor cache dir for every try (the field's cleared cache);
* ``warm``:  a copy of a warm cache, same data (``--data old.jsonl``: every record 1024
  tokens, the preset's length);
* ``grown``: a copy of the same warm cache (made for the old data), and the grown dataset
  (``--data grown.jsonl``): its first records are the old length, then new lengths (768 to
  2048) come in from the fifth step on -- inside the timed window, so the drafters recompile
  for them in their threads while training, as a training loop on the grown data does.

The warm cache is made once, first, by one single-threaded run of the race configuration on
the old data (``--drafter-threads 1``: compiling in threads is what races), exactly as
``envbisect run`` now makes a warm cache whose content is gone. Each try gets its own copy.
Every workaround knob (``--nested-fx unoptimized``, ``--nested-fx force``, the field's
``--patch-module``, ``--mask-build locked``, ``--mask-build once``) is then run over the
three scenarios ``--knob-tries`` times each.

Tries run ``--parallel`` processes at a time (the H200 has 16 CPU cores; the compiles are
CPU-bound), so their tok/s is lower than a process alone gets: the summary gives it per
scenario as measured under that concurrency, and, if the budget leaves room, one solo try
of each scenario last. The order is chosen so that a spent budget cuts the knobs, not the
baselines: the three baselines' tries first (interleaved), then the knobs round-robin. No
try starts later than ``--budget`` - 30 seconds after the start (the rest are counted as
not started); a process still running 60 s after the budget is cut ("cut": not counted as
a crash); each process is limited to ``--timeout`` seconds (SIGABRT first, so faulthandler
dumps its threads into runs.log). With the defaults the script ends within about 8 minutes.

Writes under OUTDIR: ``race_rates.jsonl`` (one object per process: scenario, knob, try,
exit code, crashed, which drafters died, the error, tok/s, warm-up, wall, how many ran at
once), ``summary.txt`` (the table printed last: crashed k of n per scenario and knob, median
tok/s), ``runs.log`` (every process's stderr), ``data/`` (the two datasets). Cache copies
live under /tmp/race-rates-caches and are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

RACE = [
    "--preset", "h200", "--layers", "1", "--seq-len", "1024", "--anchors", "64",
    "--compile-unit", "flex", "--drafter-threads", "3",
]  # fmt: skip
PATCH_FILE = "/tmp/race-rates-patch/dflash_model.py"
KNOBS = {
    "none": [],
    "unoptimized": ["--nested-fx", "unoptimized"],
    "force": ["--nested-fx", "force"],
    "patch": ["--patch-module", PATCH_FILE],
    "locked": ["--mask-build", "locked"],
    "once": ["--mask-build", "once"],
}
SCENARIOS = ("cold", "warm", "grown")
CACHES = "/tmp/race-rates-caches"
OLD_LEN = 1024
NEW_LENS = (1536, 1024, 2048, 1280, 1024, 1792, 768, 1024)


@dataclass
class Job:
    scenario: str  # cold | warm | grown | fill
    knob: str
    tries: int  # the try number within its cell (1-based)
    solo: bool = False
    result: dict = field(default_factory=dict)


def write_data(out: str) -> tuple[str, str]:
    """old.jsonl: 64 records of the old length; grown.jsonl: 4 of the old length, then new
    lengths among old ones (every record's length field is what the drafter reads)."""
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    old, grown = os.path.join(data, "old.jsonl"), os.path.join(data, "grown.jsonl")
    with open(old, "w") as fh:
        fh.writelines(json.dumps({"length": OLD_LEN}) + "\n" for _ in range(64))
    lengths = [OLD_LEN] * 4 + [NEW_LENS[i % len(NEW_LENS)] for i in range(60)]
    with open(grown, "w") as fh:
        fh.writelines(json.dumps({"length": n}) + "\n" for n in lengths)
    return old, grown


def write_patch() -> None:
    """The demo's model file with the field's hand patch appended (as matrix.py does)."""
    sys.path.insert(0, "src")
    from envbisect.run.demo import FIELD_PATCH

    os.makedirs(os.path.dirname(PATCH_FILE), exist_ok=True)
    with open("fixtures/demo/repo/dflash_model.py") as fh:
        text = fh.read()
    with open(PATCH_FILE, "w") as fh:
        fh.write(text + FIELD_PATCH)


class Runner:
    """Runs the jobs ``parallel`` at a time, warm ones only after the fill; appends every
    result to race_rates.jsonl."""

    def __init__(self, ns: argparse.Namespace, old: str, grown: str, base: list[str]) -> None:
        self.ns, self.old, self.grown, self.base = ns, old, grown, base
        self.start = time.time()
        self.lock = threading.Condition()
        self.filled: bool | None = None  # None: not yet; False: the fill failed
        self.running = 0
        self.seq = 0

    def left(self) -> float:
        return self.ns.budget - (time.time() - self.start)

    def argv_env(self, job: Job) -> tuple[list[str], dict[str, str], str]:
        self.seq += 1
        cache = os.path.join(CACHES, f"{job.scenario}-{job.knob}-{job.tries}-{self.seq}")
        warm = os.path.join(CACHES, "warm-old")
        if job.scenario == "fill":
            cache = warm
            args = [*self.base, "--drafter-threads", "1", "--data", self.old]
        else:
            data = self.grown if job.scenario == "grown" else self.old
            args = [*self.base, *KNOBS[job.knob], "--data", data]
            if job.scenario in ("warm", "grown"):
                shutil.copytree(warm, cache, symlinks=True)
        env = dict(os.environ, PYTHONPATH="src", PYTHONUNBUFFERED="1")
        env.pop("TRITON_CACHE_DIR", None)  # inductor keeps Triton's cache inside its own
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
        result_file = os.path.join(CACHES, f"result-{self.seq}.json")
        env["ENVBISECT_RESULT"] = result_file
        argv = [sys.executable, "-Xfaulthandler", "-m", "envbisect.agent.drafter", *args]
        return argv, env, result_file

    def run(self, job: Job) -> None:
        with self.lock:
            argv, env, result_file = self.argv_env(job)
            self.running += 1
            at_once = self.running
        t0 = time.time()
        # The budget's end cuts a process short: that is no crash, and is said as "cut".
        cut_at = max(30.0, self.left() + 60)
        rc = self._process(job, argv, env, min(self.ns.timeout, cut_at))
        if rc == "timeout" and cut_at < self.ns.timeout:
            rc = "cut"
        wall = time.time() - t0
        res: dict = {}
        if os.path.exists(result_file):
            with open(result_file) as fh:
                res = json.load(fh)
        with self.lock:
            self.running -= 1
            if job.scenario == "fill":
                self.filled = bool(res.get("ok"))
            self.lock.notify_all()
        job.result = record(job, rc, res, wall, at_once)
        with open(os.path.join(self.ns.out, "race_rates.jsonl"), "a") as fh:
            fh.write(json.dumps(job.result) + "\n")
        print(line(job.result), flush=True)

    def _process(self, job: Job, argv: list[str], env: dict[str, str], limit: float) -> int | str:
        with open(os.path.join(self.ns.out, "runs.log"), "a") as log:
            log.write(f"\n===== {job.scenario} {job.knob} try {job.tries}: {argv[4:]}\n")
            log.flush()
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
            try:
                return proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                return "timeout"

    def take(self, queue: list[Job]) -> Job | None:
        """The first job that may start now (warm ones wait for the fill); None when none
        is left or the budget is spent."""
        with self.lock:
            while True:
                if not queue:
                    return None
                if self.left() < 30:  # a try started now would be cut by the budget
                    return None
                for i, job in enumerate(queue):
                    if job.scenario in ("warm", "grown") and self.filled is not True:
                        if self.filled is False:
                            queue.pop(i)  # no warm cache: the warm tries cannot run
                            break
                        continue
                    return queue.pop(i)
                else:
                    self.lock.wait(timeout=5)

    def work(self, queue: list[Job], done: list[Job]) -> None:
        while True:
            job = self.take(queue)
            if job is None:
                return
            self.run(job)
            with self.lock:
                done.append(job)


def record(job: Job, rc: int | str, res: dict, wall: float, at_once: int) -> dict:
    threads = res.get("threads") or {}
    err = res.get("error") or {}
    crashed = rc != "cut" and (rc != 0 or not res.get("ok") or bool(threads.get("crashed")))
    return {
        "scenario": job.scenario,
        "knob": job.knob,
        "try": job.tries,
        "solo": job.solo,
        "rc": rc,
        "crashed": crashed,
        "died": threads.get("died"),
        "error": (f"{err.get('class', '')}: {err.get('message', '')}"[:300]) if err else None,
        "tok_per_s": res.get("tok_per_s"),
        "warmup_s": res.get("warmup_s"),
        "recompiles": (res.get("dynamo") or {}).get("recompiles"),
        "cache": (res.get("inductor_cache") or {}).get("state"),
        "torch": res.get("torch"),
        "wall_s": round(wall, 1),
        "at_once": at_once,
    }


def line(r: dict) -> str:
    tok = f"{r['tok_per_s']:,.0f} tok/s" if r.get("tok_per_s") else "-"
    what = f"CRASHED (died {r['died']}): {r['error']}" if r["crashed"] else "ok"
    return (
        f"{r['scenario']:6} {r['knob']:11} try {r['try']:2}: {what} | {tok} | warm-up "
        f"{r['warmup_s'] or 0:.1f}s, recompiles {r['recompiles']}, cache {r['cache']}, "
        f"wall {r['wall_s']}s, {r['at_once']} at once"
    )


def queue_of(ns: argparse.Namespace) -> list[Job]:
    jobs = [Job("fill", "none", 1)]
    for t in range(1, ns.tries + 1):
        jobs += [Job(s, "none", t) for s in SCENARIOS]
    for t in range(1, ns.knob_tries + 1):
        jobs += [Job(s, k, t) for k in KNOBS if k != "none" for s in SCENARIOS]
    return jobs


def summary(done: list[Job], planned: list[Job], ns: argparse.Namespace) -> str:
    out = [
        f"race configuration: {' '.join(RACE)}; {ns.parallel} processes at a time; "
        f"budget {ns.budget:.0f} s, per process {ns.timeout:.0f} s",
        "",
        "| knob | scenario | crashed | tries planned | median tok/s (ok tries) | warm-up s |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for knob in KNOBS:
        for scenario in SCENARIOS:
            rs = [j.result for j in done if (j.scenario, j.knob) == (scenario, knob)]
            cut = sum(1 for r in rs if r["rc"] == "cut")
            rs = [r for r in rs if not r["solo"] and r["rc"] != "cut"]
            plan = sum(1 for j in planned if (j.scenario, j.knob) == (scenario, knob))
            if not rs and not plan:
                continue
            toks = [r["tok_per_s"] for r in rs if r["tok_per_s"] and not r["crashed"]]
            warm = [r["warmup_s"] for r in rs if r["warmup_s"]]
            out.append(
                f"| {knob} | {scenario} | {sum(r['crashed'] for r in rs)} of {len(rs)} | {plan} "
                f"| {statistics.median(toks):,.0f} | {statistics.median(warm):.1f} |"
                if toks and warm
                else f"| {knob} | {scenario} | {sum(r['crashed'] for r in rs)} of {len(rs)} "
                f"| {plan} | - | - |"
            )
            if cut:
                out[-1] += f" ({cut} cut by the budget, not counted)"
    solo = [j.result for j in done if j.result.get("solo")]
    if solo:
        out += ["", "solo tries (one process alone on the GPU):"]
        out += [line(r) for r in solo]
    fill = [j.result for j in done if j.scenario == "fill"]
    if fill:
        out += ["", "the warm cache was made by: " + line(fill[0])]
    errors = sorted({r["error"] for j in done for r in [j.result] if r.get("error")})
    if errors:
        out += ["", "errors seen:"] + [f"- {e}" for e in errors[:12]]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--knob-tries", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument(
        "--budget",
        type=float,
        default=420.0,
        help="seconds in which tries start; a process still running 60 s after it is cut",
    )
    ap.add_argument("--timeout", type=float, default=200.0, help="seconds per process")
    ap.add_argument(
        "--base",
        default=" ".join(RACE),
        help="the drafter flags of the race configuration (a CPU check of this script can "
        "give a tiny one)",
    )
    ns = ap.parse_args()
    os.makedirs(ns.out, exist_ok=True)
    shutil.rmtree(CACHES, ignore_errors=True)
    os.makedirs(CACHES)
    old, grown = write_data(ns.out)
    write_patch()
    runner = Runner(ns, old, grown, ns.base.split())
    planned = queue_of(ns)
    queue, done = list(planned), []
    workers = [threading.Thread(target=runner.work, args=(queue, done)) for _ in range(ns.parallel)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    # One solo try per scenario with what is left: tok/s without the other processes.
    for scenario in SCENARIOS:
        if runner.left() < 90 or (scenario != "cold" and not runner.filled):
            break
        job = Job(scenario, "none", 0, solo=True)
        runner.run(job)
        done.append(job)
    skipped = [j for j in queue]
    text = summary(done, planned, ns)
    if skipped:
        text += f"\n\nnot started (budget spent): {len(skipped)} tries"
    text += f"\n\nwall {time.time() - runner.start:.0f} s"
    with open(os.path.join(ns.out, "summary.txt"), "w") as fh:
        fh.write(text + "\n")
    print("\n" + text)
    shutil.rmtree(CACHES, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
