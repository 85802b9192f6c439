"""What the drafter reports about the run around it (torch, Python 3.8+ syntax; shipped with
``envbisect.agent.drafter``): dynamo, FX, cache, memory, device and CPU-thread facts."""

from __future__ import annotations

import os
import time

from envbisect.agent.drafter_params import BF16_PEAK_TFLOPS, error_dict

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = ("envbisect.agent.drafter_params",)


def reset_dynamo(torch):
    try:
        from torch._dynamo.utils import counters

        torch._dynamo.reset()  # private: torch's own reset of compiled state
        counters.clear()
        from torch._dynamo.utils import compilation_time_metrics

        compilation_time_metrics.clear()
    except Exception:
        pass


def frames_ok(torch):
    try:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["ok"])
    except Exception:
        return 0


def dynamo_facts(torch, frames_after_first):
    try:
        from torch._dynamo.utils import counters
    except Exception as exc:
        return {"error": error_dict(exc)}
    frames_ok = int(counters["frames"]["ok"])
    return {
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "frames_compiled": frames_ok,
        "graph_breaks": int(sum(counters["graph_break"].values())),
        # the first line of each reason, as the probe keeps them (one fact schema)
        "graph_break_reasons": {
            (str(k).strip().splitlines() or ["?"])[0][:200]: int(v)
            for k, v in counters["graph_break"].items()
        },
        # compiles after the first step: shape changes or guard failures
        "recompiles": max(0, frames_ok - int(frames_after_first or 0)),
        "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
    }


def fx_facts(torch):
    try:
        import torch.fx._symbolic_trace as st

        fn = st.is_fx_symbolic_tracing
        code = getattr(fn, "__code__", None)
        return {
            "flag": bool(getattr(st, "_is_fx_tracing_flag", False)),
            "is_fx_symbolic_tracing": "{}.{}".format(
                getattr(fn, "__module__", "?"), getattr(fn, "__qualname__", "?")
            ),
            "defined_in": code.co_filename if code else None,
            "module_file": getattr(st, "__file__", None),
        }
    except Exception as exc:
        return {"error": error_dict(exc)}


def cache_dir_facts(torch):
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    source = "env"
    if not path:
        source = "default"
        try:
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            path = cache_dir()
        except Exception:
            path = None
    files = 0
    if path and os.path.isdir(path):
        for _root, _dirs, names in os.walk(path):
            files += len(names)
    return {
        "path": path,
        "source": source,
        "files_before": files,
        "state": "warm" if files else "cold",
    }


def memory_facts(torch, device):
    if device.startswith("cuda"):
        try:
            stats = torch.cuda.memory_stats()
            return {
                "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
                "total_bytes": int(torch.cuda.get_device_properties(device).total_memory),
                "alloc_retries": int(stats.get("num_alloc_retries", 0)),
                "ooms": int(stats.get("num_ooms", 0)),
            }
        except Exception as exc:
            return {"error": error_dict(exc)}
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:
        rss = None
    return {"peak_rss_bytes": rss}


def device_facts(torch, device):
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return {
            "type": "cuda",
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_bytes": int(props.total_memory),
            "sms": int(props.multi_processor_count),
        }
    return {"type": "cpu", "name": _cpu_name(), "threads": int(torch.get_num_threads())}


def _cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def peak_tflops(p, dev_facts):
    if p.get("peak_tflops"):
        return float(p["peak_tflops"])
    name = dev_facts.get("name") or ""
    if dev_facts.get("type") != "cuda":
        return None
    for key, value in BF16_PEAK_TFLOPS:
        if key in name:
            return value
    return None


# ----------------------------------------------------------------------------- CPU threads


def _cpu_jiffies():
    """(busy, total) jiffies of all CPUs from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def _own_cpu_s():
    """CPU seconds used by this process so far (all its threads)."""
    t = os.times()
    return t.user + t.system


class CpuWindow:
    """The CPU time other processes used while this one ran: /proc/stat's busy time minus
    this process's own, in cores (1.0: one core busy all along)."""

    def __init__(self):
        self.start = _cpu_jiffies()
        self.own = _own_cpu_s()
        self.t0 = time.monotonic()

    def others_busy_cores(self):
        end = _cpu_jiffies()
        wall = time.monotonic() - self.t0
        if self.start is None or end is None or wall <= 0:
            return None
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        busy_s = (end[0] - self.start[0]) / float(hz)
        others = busy_s - (_own_cpu_s() - self.own)
        return max(0.0, others / wall)


def _affinity():
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def loadavg():
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def size_cpu_threads(p, usable, busy_cores, omp_env):
    """(threads, why) for torch's CPU pool: asked for, $OMP_NUM_THREADS, one for the tiny
    preset, else the usable cores minus those other processes keep busy (at least one)."""
    if p.get("cpu_threads"):
        return int(p["cpu_threads"]), "asked (--cpu-threads)"
    if omp_env:
        return None, "OMP_NUM_THREADS=" + omp_env
    if p["preset"] == "tiny":
        return 1, "tiny preset: one thread (its ops are too small to share)"
    busy = int(round(busy_cores or 0.0))
    free = max(1, usable - busy)
    return free, f"{usable} usable cores, {busy} busy at start"


def set_cpu_threads(torch, p):
    """Size torch's CPU threads before anything runs; what was seen and chosen."""
    window = CpuWindow()
    time.sleep(0.2)  # a short look at /proc/stat: what other processes are doing now
    busy = window.others_busy_cores()
    affinity = _affinity()
    threads, why = size_cpu_threads(p, len(affinity), busy, os.environ.get("OMP_NUM_THREADS"))
    if threads is not None and p["device"] == "cpu":
        torch.set_num_threads(threads)
    return {
        "threads": int(torch.get_num_threads()),
        "why": why,
        "affinity": affinity,
        "cores": os.cpu_count(),
        "load_start": loadavg(),
        "busy_cores_start": None if busy is None else round(busy, 2),
    }
