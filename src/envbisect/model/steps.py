"""Samples from inside the process: the training steps the probe timed
(``envbisect.agent.probe_steps``) turned into a run's samples, and where a run's and a
trial's time went (start-up, compile, steps, realize).

The rule, as users read it: each ``step()`` of the optimizer that stepped most ends a
training step (or, with ``--step-fn MODULE:QUALNAME``, each outermost return of that
function, in the thread that returned from it most): one used only to warm up is not it.
Threads training an optimizer each (those that stepped while the most-stepped one did) give
windows of one step of each, from their merged ends, as the steps: one thread's own steps
take turns with the others' and are not the program's rate. A step's time runs from the end
of the step before to its own end, so step 1 (the first compile) has none; of the rest the
first third are warm-up and left out, as with ``--warmup-lines``. When a run's own figure
(``--metric-regex``, an ``ENVBISECT_RESULT``) gives fewer samples than the trial asked of
the process, the kept steps become its samples around that figure: their median is the
figure, each step's sample the figure times its rate over the median step rate. The verdict
reads the command's figure, whatever it spans (start-up, a compile a cleared cache no longer
saves: found as a user, whose figure fell 7.2 → 2.3 Ktok/s on a cold cache while the kept
steps, all after the compile, ran faster); the steps say how much one process's rate moves.
Tokens are not counted by the probe: the command's own figure says how much is done.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbisect.model.metric import Measurement, figure_unit, format_ktok
from envbisect.model.units import shown as shown_unit


@dataclass(frozen=True)
class StepSamples:
    """The steps one process timed: the rule, how many, and the kept steps' times."""

    rule: str  # "optimizer" | "function MODULE:QUALNAME"
    steps: int  # step ends seen (of the source that stepped most; windows' ends with per > 1)
    first_kept: int  # 1-based number of the first kept step (window)
    times: tuple[float, ...]  # seconds per kept step (window)
    compiled: tuple[int, ...] = ()  # kept steps that spent >= HELD of their time compiling
    compile_s: float = 0.0  # the backend compile time inside those steps
    sources: int = 1  # optimizers (threads, for a step function) whose steps were seen
    per: int = 1  # steps to a sample: one of each source stepping beside the timed one

    @classmethod
    def of(cls, facts: Mapping[str, Any] | None) -> StepSamples | None:
        """The kept steps of a run's facts, or None when it timed fewer than two steps.
        Several sources stepping together (threads with an optimizer each): windows of one
        step of each, from their merged ends, are the steps."""
        steps = (facts or {}).get("steps")
        if not isinstance(steps, Mapping):
            return None
        sources, per = _count(steps.get("sources")), _count(steps.get("beside"))
        merged = steps.get("merged_ends_s")
        ends = [float(x) for x in merged or () if _num(x) is not None]
        if per > 1 and len(ends) > 2 * per:
            ends = ends[::per]  # each window: from one end to the per-th after it
            times = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        else:
            per, ends = 1, [float(x) for x in steps.get("ends_s") or () if _num(x) is not None]
            raw = steps.get("intervals_s") or []
            times = [float(x) for x in raw if _num(x) is not None]
        if not times or not all(t > 0 for t in times):
            return None
        skip = len(times) // 3
        rule = "optimizer" if steps.get("rule") == "optimizer" else f"function {steps['step_fn']}"
        compiled, compile_s = _held_by_compiles(ends, steps.get("compile_spans_s") or [], skip)
        seen = len(ends) if per > 1 else int(steps.get("steps") or 0)
        return cls(rule, seen, skip + 2, tuple(times[skip:]), compiled, compile_s, sources, per)

    def scaled(self, figure: float) -> tuple[float, ...]:
        """One sample per kept step, in the units of ``figure``, their median the figure
        itself: a step's sample is the figure times its own rate over the median step rate.
        The verdict reads the command's figure, whatever it spans (start-up, a compile the
        cache no longer holds); the steps say how much one process's rate moves."""
        rates = [1.0 / t for t in self.times]
        mid = statistics.median(rates)
        return tuple(figure * r / mid for r in rates)

    def used(self, figure: float, source: str | None) -> dict[str, Any]:
        """Which samples were used, as the trial log and ``--json`` say it."""
        what = "steps"
        if self.per > 1:
            what = "windows"
            who = "optimizers" if self.rule == "optimizer" else "threads"
            fn = "step()" if self.rule == "optimizer" else f"return of {self.rule.split(' ')[1]}"
            how = (
                f"{self.per} {who} stepped together: a window of {self.per} steps, one "
                f"{fn} of each, is a sample"
            )
        elif self.rule == "optimizer":
            how = "each step() of the optimizer that stepped most ends a step"
        else:
            how = f"each return of {self.rule.split(' ', 1)[1]} ends a step"
        if self.sources > self.per:
            how += f"; {self.sources - self.per} more stepped only before or after it"
        last = self.first_kept + len(self.times) - 1
        return {
            "from": "probe",
            "rule": how,
            "steps_seen": self.steps,
            "steps_used": [self.first_kept, last],
            "steps_per_sample": self.per,
            "left_out": f"{what} 1-{self.first_kept - 1} (first compile, warm-up)",
            "scaled_to": figure,
            "figure_from": source,
            "text": (
                f"{what} {self.first_kept}-{last} of {self.steps} timed by the probe ({how}), "
                f"their median the reported {format_ktok(figure)} {figure_unit()}"
            ),
        }


HELD = 0.25  # a kept step that spent this share of its time in torch.compile's backend


def _held_by_compiles(
    ends: Sequence[float], spans: Sequence[Any], skip: int
) -> tuple[tuple[int, ...], float]:
    """The kept steps (1-based numbers) that compiled for at least ``HELD`` of their time,
    and the compile time inside them, from the steps' ends and the compile spans."""
    held: list[int] = []
    total = 0.0
    for i in range(skip + 1, len(ends)):  # step i + 1 runs from ends[i - 1] to ends[i]
        a, b = float(ends[i - 1]), float(ends[i])
        inside = sum(max(0.0, min(b, float(e)) - max(a, float(s))) for s, e in spans)
        if b > a and inside >= HELD * (b - a):
            held.append(i + 1)
            total += inside
    return tuple(held), total


def _figure_alone(
    m: Measurement, what: str, which: Sequence[int], cost: str, hot: Mapping[str, Any], **used: Any
) -> Measurement:
    """``m`` with its figure as its one sample, said as the samples used: torch compiled
    during the timed ``what`` (window, step) numbers ``which``, ``cost`` long — the
    program's own cost, not noise. ``hot`` becomes the result's ``compiled_in_windows``."""
    assert m.tok_per_s is not None
    shown = ", ".join(str(n) for n in which[:6]) + (", …" if len(which) > 6 else "")
    figure = (
        f"the reported {format_ktok(m.tok_per_s)} {figure_unit()}"
        if what == "step"
        else f"{figure_unit()} over all {what}s ({format_ktok(m.tok_per_s)})"
        if not shown_unit().tokens
        else f"tok/s over all {what}s ({format_ktok(m.tok_per_s)} Ktok/s)"
    )
    said = {
        "from": "figure",
        f"compiled_{what}s": list(which),
        **used,
        "text": (
            f"torch compiled during timed {what}(s) {shown} ({cost}): that is the program's "
            f"own cost, not noise, so {figure} is the one sample, not each {what}'s"
        ),
    }
    result = {**m.result, "samples": [m.tok_per_s], "samples_from": said}
    return Measurement(m.tok_per_s, None, m.source, {**result, "compiled_in_windows": hot})


def compiled_in_windows(m: Measurement) -> Measurement:
    """A drafter run whose timed windows compiled (``compiled_in_windows`` in its result)
    gave tok/s over all windows as its one sample: said as the samples used."""
    hot = m.result.get("compiled_in_windows") if m.ok else None
    if not isinstance(hot, Mapping) or m.result.get("samples_from"):
        return m
    windows = list(hot.get("windows") or ())
    return _figure_alone(m, "window", windows, f"{hot.get('frames')} frame(s)", hot)


def with_steps(m: Measurement, facts: Mapping[str, Any] | None, wanted: int) -> Measurement:
    """``m`` with the probe's timed steps as its samples, where the run's own figure gave
    fewer than ``wanted`` and the steps give more than it did; ``m`` itself otherwise.
    Kept steps that compiled leave the figure the one sample (``compiled_in_windows``)."""
    m = compiled_in_windows(m)
    if not m.ok or wanted <= 1 or len(m.samples) >= wanted or m.result.get("compiled_in_windows"):
        return m  # a drafter window that compiled: its one figure is the sample
    got = StepSamples.of(facts)
    if got is None or len(got.times) <= len(m.samples):
        return m
    assert m.tok_per_s is not None
    figure = m.tok_per_s
    if got.compiled:
        hot = {"steps": list(got.compiled), "compile_s": round(got.compile_s, 3)}
        cost = f"{got.compile_s:.1f}s"
        return _figure_alone(m, "step", got.compiled, cost, hot, figure_from=m.source)
    result = {
        **m.result,
        "samples": list(got.scaled(figure)),
        "samples_from": got.used(figure, m.source),
    }
    return Measurement(figure, None, m.source, result)


def from_steps(facts: Mapping[str, Any] | None) -> Measurement | None:
    """A run whose log printed no figure: the probe's kept steps as its figure, in steps per
    second (their median rate; each step one sample), or None when it timed fewer than two.
    Kept steps that compiled leave the rate over all of them the one sample."""
    got = StepSamples.of(facts)
    if got is None:
        return None
    rates = [1.0 / t for t in got.times]
    figure = len(got.times) / sum(got.times) if got.compiled else statistics.median(rates)
    said = {
        "from": "steps",
        "rule": got.rule,
        "steps": got.steps,
        "kept": len(got.times),
        "text": (
            f"no figure in the log: the probe's {len(got.times)} kept steps "
            f"({got.rule} rule, from step {got.first_kept}) give {figure:.3g} steps/s"
        ),
    }
    samples = [figure] if got.compiled else rates
    result = {
        "samples": samples,
        "samples_from": said,
        "metric_from": {"form": "the probe's steps", "unit": "steps/s", "way": "higher is better"},
    }
    return Measurement(figure, None, "steps", result)


# ----------------------------------------------------------------------------- breakdown

PARTS = ("startup_s", "compile_s", "steps_s", "after_s")


def breakdown(wall_s: float, facts: Mapping[str, Any] | None) -> dict[str, Any]:
    """Where one process's wall time went, from its probe facts: ``startup_s`` (interpreter,
    imports, data, model, the first step less compile), ``compile_s`` (torch.compile's own
    time), ``steps_s`` (first step's end to the last's), ``after_s`` (the program after its
    last step, and exit). Unknown parts are None (no probe, no steps). ``quick_exit``: the
    probe ended the process after the program (its atexit handlers never ran)."""
    out: dict[str, Any] = {"wall_s": round(wall_s, 3), **dict.fromkeys(PARTS)}
    if not facts:
        return out
    if facts.get("quick_exit"):
        out["quick_exit"] = True
    stopped = facts.get("stopped_early")
    if isinstance(stopped, Mapping):
        out["stopped_early"] = dict(stopped)
    comp = facts.get("compile")
    compile_s = _num(comp.get("compile_s")) if isinstance(comp, Mapping) else None
    found = facts.get("steps")
    steps: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    at_exit = _num(steps.get("at_exit_s"))
    first, last = _num(steps.get("first_end_s")), _num(steps.get("last_end_s"))
    out["compile_s"] = compile_s
    if at_exit is None:
        return out
    outside = max(0.0, wall_s - at_exit)  # interpreter start before the probe, exit after it
    if first is not None and last is not None:
        out["startup_s"] = round(max(0.0, outside + first - (compile_s or 0.0)), 3)
        out["steps_s"] = round(last - first, 3)
        out["after_s"] = round(max(0.0, at_exit - last), 3)
    else:
        out["startup_s"] = round(max(0.0, wall_s - (compile_s or 0.0)), 3)
    return out


def trial_timing(calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A trial's time, from its ``trial.json`` calls: ``realize_s`` (the state built and
    checked), ``fill_s`` (a warm cache made), each process part summed, the processes run,
    which samples were used and which compile cache each call ran with."""
    out: dict[str, Any] = {"wall_s": 0.0, "realize_s": 0.0, "fill_s": 0.0, "processes": 0}
    quick = 0
    stopped: list[Any] = []
    parts: dict[str, float | None] = dict.fromkeys(PARTS)
    used: list[Any] = []
    caches: list[Any] = []
    for call in calls:
        runs = [r for r in call.get("runs") or () if isinstance(r, Mapping)]
        wall = float(call.get("wall_s") or 0.0)
        fill = float(call.get("fill_s") or 0.0)
        ran = sum(float(r.get("wall_s") or 0.0) for r in runs)
        out["wall_s"] += wall
        out["fill_s"] += fill
        out["realize_s"] += max(0.0, wall - ran - fill)
        out["processes"] += len(runs)
        for run in runs:
            quick += bool((run.get("breakdown") or {}).get("quick_exit"))
            if (run.get("breakdown") or {}).get("stopped_early"):
                stopped.append(run["breakdown"]["stopped_early"])
            for part in PARTS:
                value = _num((run.get("breakdown") or {}).get(part))
                if value is not None:
                    parts[part] = (parts[part] or 0.0) + value
            if run.get("samples_from"):
                used.append({"run": run.get("name"), **dict(run["samples_from"])})
        if call.get("compile_cache"):
            caches.append(call["compile_cache"])
    out = {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}
    out.update({k: None if v is None else round(v, 3) for k, v in parts.items()})
    out["samples_from"] = used
    out["compile_cache"] = caches
    if quick:
        out["quick_exits"] = quick
    if stopped:
        out["stopped_early"] = stopped
    return out


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _num(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def describe_timing(t: Mapping[str, Any]) -> str:
    """One line of a trial's time: ``2 processes: start-up 9.8s, compile 4.1s, steps 3.0s,
    after 0.2s; realize 0.4s; compile cache 2 (shared, made by trial 1)``."""
    n = int(t.get("processes") or 0)
    words = {"startup_s": "start-up", "compile_s": "compile", "steps_s": "steps"}
    words["after_s"] = "after"
    parts = [f"{w} {t[k]:.1f}s" for k, w in words.items() if t.get(k) is not None]
    stopped = t.get("stopped_early") or []
    if stopped:
        last = stopped[-1]
        parts.append(f"stopped at step {last.get('at_step')} ({last.get('why')})")
    elif t.get("quick_exits") and t.get("after_s") is not None:
        parts[-1] += " (exit cut short by the probe)"
    text = f"{n} process{'es' if n != 1 else ''}" + (": " + ", ".join(parts) if parts else "")
    text += f"; realize {float(t.get('realize_s') or 0):.1f}s"
    if t.get("fill_s"):
        text += f"; warm cache made {float(t['fill_s']):.1f}s"
    caches = t.get("compile_cache") or []
    if caches:
        last = caches[-1]
        number = Path(str(last.get("dir", ""))).name
        how = "shared" if last.get("shared") else "new"
        text += f"; compile cache {number} ({how}, made by trial {last.get('made_by_trial')})"
    return text
