"""Host side of the smoke test: params from flags, one run through a Transport, a summary.

The workload itself lives in ``envbisect.agent.drafter`` and runs inside the target Python;
this module never imports torch.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from envbisect.model.errors import SmokeError

AGENT_MODULE = "envbisect.agent.drafter"
PRESETS = ("auto", "tiny", "h200")
ATTN_BACKENDS = ("auto", "flex", "sdpa", "flex-eager")


class SmokeStatus(str, Enum):
    """How a smoke run ended."""

    OK = "ok"
    FAILED = "failed"  # the workload ran and reported ok=false (crash, OOM, NaN loss)


@dataclass(frozen=True)
class SmokeOutcome:
    """The drafter's result dict and what it means for the exit code."""

    result: dict[str, Any]
    log_dir: Path | None  # None: a temporary log dir, removed since the run went well

    @property
    def status(self) -> SmokeStatus:
        return SmokeStatus.OK if self.result.get("ok") else SmokeStatus.FAILED

    @property
    def exit_code(self) -> int:
        return 0 if self.status is SmokeStatus.OK else 1


def build_params(**flags: Any) -> dict[str, Any]:
    """Drafter params from CLI flags: unset (None) flags are left to the preset."""
    params = {key: value for key, value in flags.items() if value is not None}
    if params.get("drafter_threads") is not None and params["drafter_threads"] < 1:
        raise SmokeError("--drafter-threads must be at least 1")
    return params


def parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    """``NAME=VALUE`` words of ``--env`` as a dict."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SmokeError(f"--env {pair!r}: expected NAME=VALUE")
        env[name] = value
    return env


def run_smoke(
    transport: Any,
    python: str,
    params: Mapping[str, Any],
    *,
    timeout_s: float,
    log_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> SmokeOutcome:
    """Ship the drafter to ``python`` through ``transport`` and return its result.

    A result that failed on its parameters (unknown preset, unreadable ``--data``) is a user
    mistake and raises SmokeError; any other failure is a measured result with ok=false.
    """
    temporary = log_dir is None
    if log_dir is None:
        log_dir = Path(tempfile.mkdtemp(prefix="envbisect-smoke-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if env:
        transport = transport.with_env(dict(env))
    result = transport.run_agent(
        python, AGENT_MODULE, dict(params), timeout_s=timeout_s, log_dir=log_dir, name="smoke"
    )
    error = result.get("error") or {}
    if error.get("stage") == "params":
        raise SmokeError(f"smoke parameters rejected by {python}: {error.get('message')}")
    if "ok" not in result:
        raise SmokeError(f"smoke result from {python} has no 'ok' field; log: {log_dir}")
    if temporary and result.get("ok"):
        # Logs of a run that went well are not kept unless asked for (--log-dir).
        shutil.rmtree(log_dir, ignore_errors=True)
        return SmokeOutcome(result=result, log_dir=None)
    return SmokeOutcome(result=result, log_dir=log_dir)


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} Ktok/s" if value >= 1000 else f"{value:.0f} tok/s"


def summary_lines(outcome: SmokeOutcome) -> list[str]:
    """A short human summary of one result."""
    r = outcome.result
    dev = r.get("device") or {}
    comp = r.get("compile") or {}
    dyn = r.get("dynamo") or {}
    mem = r.get("memory") or {}
    dims = r.get("dims") or {}
    lines = [
        f"smoke {r.get('preset')} on {dev.get('name') or dev.get('type')}: "
        f"torch {r.get('torch')}, triton {r.get('triton')}, attn {r.get('attn')}, "
        f"compile {'on' if comp.get('effective') else 'off'}"
        + (" (disabled by env)" if comp.get("disabled_by_env") else ""),
        f"  dims: hidden {dims.get('hidden')}, layers {dims.get('layers')}, "
        f"seq {dims.get('seq_len')}, anchors {dims.get('anchors')}, batch {dims.get('batch')}",
    ]
    if r.get("ok"):
        step = r.get("step_s") or {}
        mfu = f", MFU {100 * r['mfu']:.1f}%" if r.get("mfu") else ""
        lines.append(
            f"  throughput {_fmt_rate(r.get('tok_per_s'))}{mfu}; step median "
            f"{step.get('median', 0):.4f}s (p10 {step.get('p10', 0):.4f}, "
            f"p90 {step.get('p90', 0):.4f}); warm-up {r.get('warmup_s') or 0:.1f}s"
        )
    else:
        err = r.get("error") or {}
        lines.append(f"  FAILED: {err.get('class')}: {err.get('message')}")
    facts = [
        f"graphs {dyn.get('unique_graphs')}",
        f"recompiles {dyn.get('recompiles')}",
        f"graph breaks {dyn.get('graph_breaks')}",
    ]
    if r.get("flex_fallback"):
        facts.append("flex_attention ran WITHOUT torch.compile (unfused fallback)")
    if (r.get("threads") or {}).get("count", 1) > 1:
        t = r["threads"]
        facts.append(f"{t['count']} drafter threads, {t['crashed']} crashed")
    if r.get("samples") and len(r["samples"]) > 1:
        facts.append("samples " + ", ".join(_fmt_rate(x) for x in r["samples"]))
    if mem.get("peak_allocated_bytes") is not None:
        facts.append(f"peak {mem['peak_allocated_bytes'] / 2**30:.1f} GiB")
    elif mem.get("peak_rss_bytes") is not None:
        facts.append(f"peak RSS {mem['peak_rss_bytes'] / 2**20:.0f} MiB")
    lines.append("  " + "; ".join(facts))
    cpu = r.get("cpu") or {}
    if dev.get("type") == "cpu" and cpu:
        lines.append(
            f"  cpu: {cpu.get('threads')} torch thread(s) ({cpu.get('why')}); "
            f"{len(cpu.get('affinity') or [])} usable cores; other processes busy "
            f"{cpu.get('busy_cores_start')} cores at start, {cpu.get('busy_cores_during')} "
            f"during; load {cpu.get('load_start')} → {cpu.get('load_end')}"
        )
    for t in (r.get("threads") or {}).get("per_thread") or []:
        if (r.get("threads") or {}).get("count", 1) < 2:
            break
        err = t.get("error")
        state = (
            f"died after {t['steps_done']} steps ({err['stage']}): {err['class']}: {err['message']}"
            if err
            else f"finished {t['steps_done']} steps"
        )
        died_at_once = err and not t.get("steps_done")
        path = "" if died_at_once else f"; attention {t['path']}"
        lines.append(f"  drafter {t['index']}: {state}{path}")
    if outcome.log_dir is not None:
        lines.append(f"  logs: {outcome.log_dir}")
    return lines
