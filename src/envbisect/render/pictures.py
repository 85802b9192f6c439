"""The pictures of a bisection, drawn with matplotlib as SVG text (an optional extra:
``pip install 'envbisect[report]'``).

Three pictures, each from the same trial rows the text report is made of (no second
computation): every trial's samples on one log-scaled axis, one row per state, with the
threshold and its good side shaded and the samples taken under load marked; the search as
a ladder (which units each trial applied, in order, the culprits' columns marked); the
culprit's kernels and ops as bars, good against bad, as a share of the step. Each drawn
element carries an id (``sample-<trial>-<n>``, ``rung-<trial>``, ``kernel-<n>``) that a
browser test can count.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from envbisect.model.errors import UsageError
from envbisect.model.escape import printable
from envbisect.model.kernels import KernelDiff
from envbisect.run.result import TrialRow

VERDICT_COLORS = {"good": "#2e7d32", "bad": "#c62828"}
OTHER_COLOR = "#757575"
LOAD_COLOR = "#ef6c00"
MAX_LABEL = 48
KERNEL_BARS = 12


@dataclass(frozen=True)
class Figures:
    """What the pictures show: the trials, the threshold, the culprits' unit names, the
    figure's unit and direction, and the kernel diff (if the run profiled). ``scale``
    turns a recorded figure into the shown one (tok/s into Ktok/s), as the tables do."""

    rows: tuple[TrialRow, ...]
    threshold: float | None
    culprits: tuple[str, ...]
    unit: str
    lower_is_better: bool = False
    kernels: KernelDiff | None = None
    scale: float = 1.0


def require_matplotlib() -> None:
    """UsageError, saying how to install it, when matplotlib is missing."""
    _pyplot()


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "the report's pictures are drawn with matplotlib, which this Python lacks: "
            "pip install 'envbisect[report]' (or matplotlib), then run again"
        ) from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "envbisect"  # the same run draws the same bytes
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, escaped
    import matplotlib.pyplot as plt

    return plt


def _svg(fig: Any) -> str:
    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = out.getvalue()
    return text[text.index("<svg") :]  # the XML prolog and doctype stay out of HTML


def _label(row: TrialRow) -> str:
    applied = ", ".join(row.applied) if row.applied else "good state"
    text = printable(f"{row.index}: {applied}")
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def _color(row: TrialRow) -> str:
    return VERDICT_COLORS.get(str(row.verdict), OTHER_COLOR)


def samples_svg(f: Figures) -> str:
    """Every trial's samples, one row per state, on a log axis."""
    plt = _pyplot()
    rows = [r for r in f.rows if r.samples]
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(rows), 2) + 1.2))
    for y, row in enumerate(reversed(rows)):
        for n, sample in enumerate(row.samples):
            value = sample * f.scale
            loaded = n < len(row.loaded) and row.loaded[n]
            spread = (n - (len(row.samples) - 1) / 2) * min(0.5 / len(row.samples), 0.08)
            ax.scatter(
                [value], [y + spread], s=36, marker="x" if loaded else "o",
                color=LOAD_COLOR if loaded else _color(row), alpha=0.85, zorder=3,
                gid=f"sample-{row.index}-{n}",
            )  # fmt: skip
    values = [v * f.scale for r in rows for v in r.samples if v > 0]
    if values:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log")
        plain = FuncFormatter(lambda v, _pos: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(plain)
        ax.tick_params(axis="x", which="minor", labelsize=7)
    if f.threshold and values:
        line = f.threshold * f.scale
        ax.axvline(line, color="#1565c0", linewidth=1.2, gid="threshold")
        low, high = (min([*values, line]) / 1.5, max([*values, line]) * 1.5)
        good_side = (low, line) if f.lower_is_better else (line, high)
        ax.axvspan(*good_side, color="#1565c0", alpha=0.07, gid="good-side")
        ax.set_xlim(low, high)
    ax.set_yticks(range(len(rows)), [_label(r) for r in reversed(rows)], fontsize=8)
    for tick, row in zip(ax.get_yticklabels(), reversed(rows), strict=True):
        tick.set_color(_color(row))
    ax.set_xlabel(f"{f.unit} per sample (log scale; × taken under load)")
    ax.set_title("Samples of every trial: good side shaded, threshold in blue", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def search_svg(f: Figures) -> str:
    """The search as a ladder: a rung per trial, a column per unit it applied."""
    plt = _pyplot()
    units = list(dict.fromkeys(u for r in f.rows for u in r.applied))
    rows = list(f.rows)
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * len(units) + 3), 0.4 * max(len(rows), 2) + 1.8))
    for y, row in enumerate(reversed(rows)):
        xs = [units.index(u) for u in row.applied]
        ax.plot(
            [-0.5, max(len(units) - 0.5, 0.5)], [y, y], color=_color(row), alpha=0.25,
            linewidth=6, solid_capstyle="butt", gid=f"rung-{row.index}",
        )  # fmt: skip
        ax.scatter(xs, [y] * len(xs), s=60, color=_color(row), marker="s", zorder=3)
    for x, unit in enumerate(units):
        if unit in f.culprits:
            ax.axvspan(x - 0.45, x + 0.45, color="#ffd54f", alpha=0.35, gid=f"culprit-{x}")
    ax.set_yticks(range(len(rows)), [f"trial {r.index}: {r.verdict}" for r in reversed(rows)])
    ax.set_xticks(range(len(units)), [_short(u) for u in units], rotation=60, ha="right")
    ax.tick_params(labelsize=8)
    ax.set_title("The search: units applied by each trial (culprits highlighted)", fontsize=10)
    return _svg(fig)


def _short(name: str) -> str:
    text = printable(name)
    return text if len(text) <= 40 else "…" + text[-39:]


def kernels_svg(f: Figures) -> str | None:
    """The culprit's kernels and ops as bars, good vs bad, as a share of the step; None
    when the run did not profile."""
    if f.kernels is None or not f.kernels.notable:
        return None
    plt = _pyplot()
    changes = list(f.kernels.notable[:KERNEL_BARS])
    good_step = f.kernels.good.step_us or 1.0
    bad_step = f.kernels.bad.step_us or 1.0
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(changes) + 1.4))
    for y, c in enumerate(reversed(changes)):
        ax.barh(y + 0.2, c.good_us / good_step, height=0.4, color=VERDICT_COLORS["good"],
                gid=f"kernel-{len(changes) - 1 - y}")  # fmt: skip
        ax.barh(y - 0.2, c.bad_us / bad_step, height=0.4, color=VERDICT_COLORS["bad"])
    ax.set_yticks(range(len(changes)), [_short(c.name) for c in reversed(changes)], fontsize=8)
    ax.set_xlabel("share of the step (green: good, red: with the culprit)")
    ax.set_title("Kernels and ops that changed", fontsize=10)
    return _svg(fig)


def all_svgs(f: Figures) -> dict[str, str]:
    """``{samples, search[, kernels]}`` → SVG text."""
    out = {"samples": samples_svg(f), "search": search_svg(f)}
    kernels = kernels_svg(f)
    if kernels is not None:
        out["kernels"] = kernels
    return out
