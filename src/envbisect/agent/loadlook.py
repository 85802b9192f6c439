"""How busy a machine is, read from its kernel (stdlib only, Python 3.8 syntax): run in the
host process for a local run, shipped as an agent to the target through ``--via`` layers,
so that a remote run warns of other users' load and sizes its threads as a local one does.

CPU time from ``/proc/stat`` (all processes) minus this process's own and its children's
(``os.times``), the load average from ``/proc/loadavg``, the busiest other processes from
``/proc/<pid>/stat``, other processes on the GPUs from ``nvidia-smi`` where it is
installed. On a machine without ``/proc`` every CPU figure is None.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from envbisect.agent.procfs import read_stat

AGENT_REQUIRES = ("envbisect.agent.procfs",)
PROC = "/proc"


def hz():
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100


def busy_s():
    """CPU seconds all processes have been busy since boot (``/proc/stat``'s first line)."""
    try:
        with open(os.path.join(PROC, "stat"), encoding="ascii") as fh:
            first = fh.readline()
        fields = [int(x) for x in first.split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / hz()


def ours_s():
    """CPU seconds of this process and of its children that have been waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def load1():
    try:
        with open(os.path.join(PROC, "loadavg"), encoding="ascii") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def usable_cores():
    """The CPUs this process may run on (its affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def is_ours(pid, me=None):
    """True when ``pid`` is process ``me`` (default: this one) or one of its descendants."""
    me = os.getpid() if me is None else me
    seen = 0
    while pid and pid > 1 and seen < 64:
        if pid == me:
            return True
        proc = read_stat(pid, PROC)
        if proc is None:
            return False
        pid, seen = proc.ppid, seen + 1
    return False


def gpu_others():
    """Other processes on a GPU (``pid N name``), per nvidia-smi; [] without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        proc = subprocess.run(
            [exe, "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in proc.stdout.splitlines():
        pid_s, _, name = line.partition(",")
        if pid_s.strip().isdigit() and not is_ours(int(pid_s)):
            out.append(f"pid {pid_s.strip()} {os.path.basename(name.strip())}")
    return out


def process_cpu():
    """pid → (name, CPU seconds) of every process we may read."""
    out = {}
    rate = hz()
    try:
        entries = [e for e in os.listdir(PROC) if e.isdigit()]
    except OSError:
        return out
    for entry in entries:
        proc = read_stat(int(entry), PROC)
        if proc is not None:
            out[proc.pid] = (proc.comm, (proc.utime + proc.stime) / rate)
    return out


def look(seconds=0.5, min_cores=0.25, gpus=True):
    """A short look at the machine now: ``{cores, others_cores, load1, gpu_others, top}``,
    ``top`` the other processes that took at least ``min_cores`` (busiest first)."""
    t0, busy0, ours0 = time.monotonic(), busy_s(), ours_s()
    before = process_cpu()
    time.sleep(seconds)  # the window measured: CPU time accrues in it
    after = process_cpu()
    wall = max(time.monotonic() - t0, 1e-6)
    busy = busy_s()
    others = None
    if busy is not None and busy0 is not None:
        others = max(0.0, (busy - busy0 - (ours_s() - ours0)) / wall)
    me = os.getpid()
    top = []
    for pid, (name, cpu) in after.items():
        was = before.get(pid)
        if was is None or pid == me:
            continue
        cores = (cpu - was[1]) / wall
        if cores >= min_cores and not is_ours(pid, me):
            top.append({"pid": pid, "name": name, "cores": round(cores, 3)})
    top.sort(key=lambda b: -b["cores"])
    return {
        "cores": usable_cores(),
        "others_cores": others,
        "load1": load1(),
        "gpu_others": gpu_others() if gpus else [],
        "top": top,
    }


def main(params):
    """The agent: one look at the target."""
    return look(float(params.get("seconds") or 0.5), float(params.get("min_cores") or 0.25))
