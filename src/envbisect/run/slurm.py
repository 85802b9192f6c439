"""Slurm workers: the trials run as Slurm jobs, through Slurm's own tools.

A Slurm worker (``workers: [{name, slurm: {partition, gres, time, count, mode}}]``) gets a
transport whose one layer is ``srun``: everything of a trial — the actuation agent that
realizes the state on the node and every smoke run — goes through it, so the state is built
and measured where the job runs.

- ``mode: salloc`` (the default): one ``salloc --no-shell`` allocation per worker, reused for
  every trial; each process is a step, ``srun --jobid=J --overlap -n1 --time=T``. Every
  process of a trial lands on the same node (the venv built by the realize step is the one
  the smoke run uses) and waits in the queue once per worker, not once per process; a step
  starts no faster than a new job on an idle cluster (benchmarks/RESULTS.md, "Slurm").
- ``mode: srun``: a new job per process (``srun -n1 --job-name=N --time=T ...``), for
  clusters that do not allow long allocations; on several nodes the realize and the run
  may land on different nodes, so it needs a shared file system.

``time`` is the limit of each process (a step's or a job's). A process that Slurm ends (time
limit, out of memory) is a *crash* result carrying Slurm's own reason, read from what
``srun``/``slurmstepd`` wrote on stderr (``*** STEP 12.3 ON node CANCELLED AT ... DUE TO TIME
LIMIT ***``, ``oom-kill``/``OUT_OF_MEMORY``, srun's exit 253). Every job a run started is
cancelled with ``scancel`` on exit, on Ctrl-C and after a per-trial timeout (killing ``srun``
alone does not always end the job).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from envbisect.model.errors import WorkerError
from envbisect.model.failure import Failure
from envbisect.model.metric import Measurement
from envbisect.run.workers import Worker
from envbisect.transport import Transport, parse_layer

_CANCELLED = re.compile(
    r"\*\*\* (JOB|STEP) (\S+) ON (\S+) CANCELLED AT (\S+) DUE TO ([A-Z][A-Z _]*?)\s*\*\*\*"
)
_OOM = re.compile(r"oom[-_ ]kill|OUT_OF_MEMORY|[Ee]xceeded (?:job|step) memory limit")
_GRANTED = re.compile(r"Granted job allocation (\d+)")
# srun's own exit status when the step or job it ran was ended by Slurm (out of memory among
# others): the reason is in the slurmstepd lines.
SRUN_KILLED = 253


def slurm_reason(stderr: bytes, returncode: int | None) -> str | None:
    """Slurm's account of why it ended a process, from srun's stderr; None when Slurm did
    not end it (the program itself failed)."""
    text = stderr[-65536:].decode("utf-8", "replace")
    m = _CANCELLED.search(text)
    if m:
        what, where = f"{m.group(1).lower()} {m.group(2)}", m.group(3)
        return f"slurm cancelled {what} on {where}: {m.group(5).lower()}"
    if _OOM.search(text):
        line = next((x for x in text.splitlines() if _OOM.search(x)), "out of memory")
        return f"slurm: OUT_OF_MEMORY ({line.strip()[:200]})"
    if returncode == SRUN_KILLED:
        return f"slurm ended it (srun exit {SRUN_KILLED})"
    return None


def annotate(m: Measurement, stderr_path: Path) -> Measurement:
    """A failed measurement of a Slurm worker, with Slurm's reason when Slurm ended it."""
    if m.ok or m.failure is None:
        return m
    try:
        data = stderr_path.read_bytes()
    except OSError:
        return m
    code = re.search(r"\bexit (\d+)", m.failure)
    why = slurm_reason(data, int(code.group(1)) if code else None)
    if why is None:
        return m
    return Measurement(None, Failure.crash(why), m.source)


@dataclass
class Allocation:
    """The jobs of one Slurm worker: its salloc allocation (mode salloc) or its job name
    (mode srun), and how to cancel them."""

    worker: Worker
    job_name: str
    log_dir: Path
    jobid: str | None = None

    def open(self) -> Worker:
        """Allocate (salloc mode) and return the worker with its srun transport."""
        spec = self.worker.slurm
        assert spec is not None
        for tool in ("srun", "scancel") + (("salloc",) if spec.mode == "salloc" else ()):
            if shutil.which(tool) is None:
                raise WorkerError(
                    f"worker {self.worker.name}: no {tool!r} on PATH", self.worker.name
                )
        step = [f"--time={spec.time}"] if spec.time else []
        if spec.mode == "salloc":
            opts = [o for o in spec.options() if not o.startswith("--time=")]
            argv = ["salloc", "--no-shell", "-n1", f"--job-name={self.job_name}", *opts]
            self.log_dir.mkdir(parents=True, exist_ok=True)
            try:
                proc = subprocess.run(
                    argv, capture_output=True, text=True, timeout=600, check=False
                )
            except subprocess.TimeoutExpired:
                self.cancel()
                raise WorkerError(
                    f"worker {self.worker.name}: salloc got no allocation in 600 s",
                    self.worker.name,
                ) from None
            (self.log_dir / f"salloc-{self.worker.name}.stderr").write_text(proc.stderr)
            m = _GRANTED.search(proc.stderr + proc.stdout)
            if proc.returncode != 0 or not m:
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise WorkerError(
                    f"worker {self.worker.name}: salloc failed (exit {proc.returncode}): {last}",
                    self.worker.name,
                )
            self.jobid = m.group(1)
            words = ["srun", f"--jobid={self.jobid}", "--overlap", "-n1", *step, "--"]
        else:
            opts = [o for o in spec.options() if not o.startswith("--time=")]
            words = ["srun", "-n1", f"--job-name={self.job_name}", *opts, *step, "--"]
        layer = parse_layer(" ".join(_quote(w) for w in words))
        return replace(self.worker, transport=Transport((layer,)))

    def cancel(self) -> None:
        """scancel every job of this worker (never raises)."""
        argv = ["scancel", self.jobid] if self.jobid else ["scancel", f"--name={self.job_name}"]
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, capture_output=True, timeout=60, check=False)
        if self.jobid:
            # Jobs of srun mode carry the same name; an allocation's steps end with it.
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    ["scancel", f"--name={self.job_name}"],
                    capture_output=True,
                    timeout=60,
                    check=False,
                )


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


class Allocations:
    """Every Slurm worker of a run; ``cancel_all`` is safe to call from any thread, twice."""

    def __init__(self) -> None:
        self.items: list[Allocation] = []
        self._lock = threading.Lock()

    def open(self, workers: list[Worker], session_root: Path) -> list[Worker]:
        """The workers, Slurm ones with their transport (allocating where salloc mode)."""
        tag = hashlib.sha256(str(session_root).encode()).hexdigest()[:8]
        out: list[Worker] = []
        try:
            for w in workers:
                if w.slurm is None:
                    out.append(w)
                    continue
                alloc = Allocation(w, f"envbisect-{tag}-{w.name}", session_root / "slurm")
                with self._lock:
                    self.items.append(alloc)
                out.append(alloc.open())
        except BaseException:
            self.cancel_all()
            raise
        return out

    def cancel_worker(self, name: str) -> None:
        for a in list(self.items):
            if a.worker.name == name and a.jobid is None:
                a.cancel()  # srun mode: the job of a timed-out trial

    def cancel_all(self, wait_s: float = 30) -> None:
        """scancel every job, then wait (up to ``wait_s``) until squeue no longer lists them:
        a cancelled job stays COMPLETING while its processes are killed."""
        with self._lock:
            items, self.items = self.items, []
        for a in items:
            a.cancel()
        names = ",".join(a.job_name for a in items)
        if not names or shutil.which("squeue") is None:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                out = subprocess.run(
                    ["squeue", "-h", "-n", names, "-o", "%i"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired):
                return
            if out.returncode != 0 or not out.stdout.strip():
                return
            time.sleep(0.2)
