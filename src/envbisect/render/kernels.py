"""Profiled steps as text: one run's table of kernels and ops, a good/bad kernel diff, and
``run --profile``'s lines in the terminal, the report and ``--json``.

No logic beyond formatting; the numbers come from ``model.kernels``. Names are escaped
(a kernel's name is whatever a library called it) and cut to fit one line.
"""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from envbisect.model.escape import printable
from envbisect.model.kernels import Change, KernelChange, KernelDiff, ProfileTable
from envbisect.run.result import RunResult

TABLE_ROWS = 15  # rows of one run's table shown in text
DIFF_LINES = 10  # changes shown in the terminal and the report
NAME_WIDTH = 60


def _name(name: str) -> str:
    text = printable(name)
    return text if len(text) <= NAME_WIDTH else text[: NAME_WIDTH - 1] + "…"


def _us(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value / 1000:,.2f} ms"
    return f"{value:,.1f} µs"


def table_lines(table: ProfileTable, n: int = TABLE_ROWS) -> list[str]:
    """``profiled 3 steps after 3 warm-up (cpu): 41.3 ms a step``, then the top ``n`` rows
    by self time, per step, with their share of the step, and the trace's path."""
    head = (
        f"profiled {table.steps} step{'s' if table.steps != 1 else ''} "
        f"({table.device}, stopped {table.stopped or '?'}): {_us(table.step_us)} a step"
    )
    rows = []
    for r in table.top(n):
        per_step = r.time_us / table.steps
        share = per_step / table.step_us if table.step_us else 0.0
        rows.append(
            [_name(r.name), r.kind, f"{r.count / table.steps:g}", _us(per_step), f"{share:.1%}"]
        )
    out = [head]
    if rows:
        body = tabulate(rows, headers=["op / kernel", "kind", "calls/step", "self/step", "of step"])
        out += body.splitlines()
    out.append(f"trace (Chrome trace, opens in Perfetto): {table.trace or 'not written'}")
    return out


def change_line(c: KernelChange) -> str:
    """``appeared  aten::bmm (op): 0 → 812.0 µs a step, +12.4 % of the step, 0 → 8 calls``."""
    calls = ""
    if c.good_calls != c.bad_calls:
        calls = f", {c.good_calls:g} → {c.bad_calls:g} calls"
    return (
        f"{c.change.value:<11} {_name(c.name)} ({c.kind}): "
        f"{_us(c.good_us)} → {_us(c.bad_us)} a step, {c.share:+.1%} of the step{calls}"
    )


def diff_lines(d: KernelDiff, n: int = DIFF_LINES) -> list[str]:
    """The kernel diff's top lines: the step times, then the ``n`` biggest changes, then
    both traces."""
    ratio = d.step_ratio
    head = f"kernels, good → culprit: step {_us(d.good.step_us)} → {_us(d.bad.step_us)}"
    if ratio is not None:
        head += f" ({ratio:.2f}x)"
    notable = d.notable
    out = [head]
    if not notable:
        out.append("no kernel or op changed by more than noise")
    out += ["  " + change_line(c) for c in notable[:n]]
    if len(notable) > n:
        counts: dict[Change, int] = {}
        for c in notable[n:]:
            counts[c.change] = counts.get(c.change, 0) + 1
        rest = ", ".join(f"{v} {k.value}" for k, v in counts.items())
        out.append(f"  … {len(notable) - n} more changes ({rest}): see --json")
    out.append(f"  traces: good {d.good.trace or 'not written'}")
    out.append(f"          culprit {d.bad.trace or 'not written'}")
    return out


def run_lines(result: RunResult) -> list[str]:
    """``run --profile``'s lines under the culprit: the kernel diff's top, or why none."""
    if result.kernels is not None:
        return diff_lines(result.kernels)
    return [result.kernels_note] if result.kernels_note else []


def run_json(result: RunResult) -> dict[str, Any] | None:
    """``run --profile``'s part of ``--json``: the whole diff, or why there is none."""
    if result.kernels is not None:
        return result.kernels.as_dict()
    return {"note": result.kernels_note} if result.kernels_note else None


def run_markdown(result: RunResult) -> list[str]:
    """``run --profile``'s section of the report."""
    lines = run_lines(result)
    if not lines:
        return []
    return ["", "### Kernels and ops, good vs culprit (torch.profiler)", "", "```", *lines, "```"]
