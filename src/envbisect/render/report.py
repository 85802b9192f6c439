"""Render bisection results: the trial table, markdown and JSON (the culprit in words:
``render.culprit``).

No logic beyond formatting; the numbers come from ``runner.RunResult`` or a session log.
Every rendered form passes the secret rules of ``envbisect.agent.redact`` (a smoke command
or a ``--via`` layer may carry a token on its command line).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from envbisect.agent.redact import redact_text, redact_tree
from envbisect.model.escape import printable
from envbisect.model.metric import Threshold, figure_unit, format_ktok, format_tok, ktok_list
from envbisect.model.session import Session
from envbisect.model.steps import describe_timing
from envbisect.model.units import shown
from envbisect.render import kernels
from envbisect.render.culprit import hunk_section, summary_lines, why_lines
from envbisect.run.result import Culprit, RunResult, TrialRow, unit_of

# The --json document of ``run``; bump the number when a field changes meaning.
RUN_SCHEMA = "envbisect/run@1"


def start_line(
    threshold: float | None, source: str = "default", fraction: float | None = None
) -> str:
    """``good means ≥ 12,000 tok/s (12.0 Ktok/s), from --until-ktoks 12k``; for ``--until
    70%`` also the value it came to once the good state was measured."""
    if fraction is not None:
        line = Threshold(fraction=fraction, source=source).describe()
        if threshold is not None:
            line += f" (= {format_tok(threshold)})"
        return line
    if threshold is None:
        return Threshold().describe()
    if source == "default":
        return f"good means ≥ {format_tok(threshold)}, midway between the measured endpoints"
    return Threshold(value=threshold, source=source).describe()


def result_start_line(result: RunResult) -> str:
    return start_line(result.threshold, result.threshold_source, result.threshold_fraction)


def _samples(samples: Sequence[float]) -> str:
    return ktok_list(samples, sep=" ")


WIDTH = 60  # an applied list longer than this turns the table into numbers + a legend


def _applied(applied: Sequence[str], legend: Mapping[str, int] | None = None) -> str:
    if not applied:
        return "(none: good state)"
    if legend is None:
        return ", ".join(applied)
    return " ".join(f"[{legend[unit_of(a)]}]" + _at(a) for a in applied)


def _at(applied: str) -> str:
    head, sep, tail = applied.rpartition("@")
    return f"@{tail}" if sep and tail.isdigit() else ""


def unit_legend(rows: Sequence[TrialRow]) -> dict[str, int] | None:
    """unit id → number, when some row's applied list is too long to read in a column
    (nothing is ever cut off: the legend lists every unit in full)."""
    if all(len(", ".join(r.applied)) <= WIDTH for r in rows):
        return None
    ids: dict[str, int] = {}
    for r in rows:
        for a in r.applied:
            ids.setdefault(unit_of(a), 0)
    return {u: i for i, u in enumerate(sorted(ids), start=1)}


def _verdict(r: TrialRow) -> str:
    return (
        r.verdict
        + (f" ({r.failure})" if r.failure else "")
        + (f"; {r.crash_rate}" if r.crash_rate else "")
        + (f"; {r.contended} of {len(r.samples)} samples under load" if r.contended else "")
        + (f"; measured again, {len(r.set_aside)} set aside (under load)" if r.set_aside else "")
        + (f" — outlier: {r.outlier}" if r.outlier else "")
    )


def trial_table(rows: Sequence[TrialRow], *, fmt: str = "simple") -> str:
    """Trial | applied units | samples (Ktok/s) | median | verdict; a numbered legend of
    the units below it when the applied lists are long; with several workers also the round
    and the worker of every trial."""
    legend = unit_legend(rows)
    parallel = any(r.worker for r in rows)
    body = [
        [
            r.index,
            *([r.round or "-", r.worker or "-"] if parallel else []),
            _applied(r.applied, legend),
            _samples(r.samples),
            format_ktok(r.median),
            _verdict(r),
        ]
        for r in rows
    ]
    headers = [
        "trial",
        *(["round", "worker"] if parallel else []),
        "applied",
        f"samples {figure_unit()}",
        "median",
        "verdict",
    ]
    table = tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)
    if legend:
        md = fmt == "github"
        table += "\n\n" + "\n".join(
            f"- [{n}] `{u}`" if md else f"[{n}] {u}" for u, n in legend.items()
        )
    return table


def render_text(result: RunResult) -> str:
    lines = [trial_table(result.trials), "", *summary_lines(result), *why_lines(result)]
    text = "\n".join([*lines, *kernels.run_lines(result)]) + "\n"
    return redact_text(text)


def reproduce_command(result: RunResult) -> str:
    argv = [
        "envbisect",
        "run",
        *result.target_args,
        "--good",
        str(result.good_path),
        "--bad",
        str(result.bad_path),
        *_threshold_args(result),
    ]
    if result.smoke.metric is not None:
        argv += ["--metric-regex", result.smoke.metric.pattern.pattern]
        if result.smoke.metric.unit.name == "(figure)":  # its way round was said, not read
            lower = result.smoke.metric.unit.lower_is_better
            argv.append("--lower-is-better" if lower else "--higher-is-better")
    if result.smoke.argv:
        argv += ["--", *result.smoke.argv]
    return shlex.join(argv)


def _threshold_args(result: RunResult) -> list[str]:
    """The threshold words of a re-run: as given (a percentage stays a percentage)."""
    if result.threshold_fraction is not None:
        return ["--until", f"{result.threshold_fraction:.0%}"]
    if result.threshold is None:
        return []
    t = result.threshold
    unit = shown()
    if not unit.tokens:
        return ["--until", f"{unit.show(t).replace(',', '')}{unit.name}"]
    return ["--until-ktoks", f"{t:.0f}" if t >= 1000 else f"{t:g}tok/s"]


def next_command(result: RunResult) -> str | None:
    """A command that reproduces the (first) culprit alone on this machine: the change made
    by hand, then the smoke command. None when there is no single culprit."""
    return culprit_command(result, result.culprits[0]) if result.culprits else None


def culprit_command(result: RunResult, c: Culprit) -> str | None:
    """A command that reproduces culprit ``c`` alone on this machine (``next_command``)."""
    cd, smoke = _user_command(result)
    change = c.unit.changes[0]
    key = str(change.key)
    if c.unit.section == "env":
        if change.new is None:
            return f"{cd}env -u {shlex.quote(key)} {smoke}"
        if isinstance(change.new, dict):
            return None  # redacted
        return f"{cd}env {shlex.quote(f'{key}={change.new}')} {smoke}"
    if c.unit.section == "git":
        commit = c.commit or (change.new.get("head") if isinstance(change.new, dict) else None)
        if not commit:
            return None
        return f"git -C {shlex.quote(key)} checkout {str(commit)[:12]} && {cd}{smoke}"
    if c.unit.section in ("packages", "torch-stack"):
        return packages_command(result, c)
    if c.unit.section == "files":
        return (
            f"{cd}{smoke}   # with {key} in its bad content (the diff above); trial "
            f"{c.bad_trial}'s trial.json has the exact argv, cwd and environment"
        )
    return None


def packages_command(result: RunResult, culprit: Culprit) -> str | None:
    """The target environment turned into the culprit's state, then the user's command.

    Every package the diff changed is set to its value in that state (the culprit's new
    value, every other change's good value): ``uv pip uninstall`` of those the state lacks,
    ``uv pip install --no-deps`` of the rest from the run's package sources (the overlay
    venvs were built the same way), then the command in the run's cwd with a bare
    ``python`` replaced by the target interpreter.
    """
    from packaging.utils import canonicalize_name

    from envbisect.sections.packages import PackageEntry

    wanted: dict[str, Any] = {}
    for unit in result.diff.units:
        for x in unit.changes:
            if x.section == "packages":
                wanted[canonicalize_name(str(x.key))] = (
                    x.new if unit.id == culprit.unit.id else x.old
                )
    if not wanted:
        return None
    python = result.python or _python_of(result)
    installs, removals = [], []
    for name, value in sorted(wanted.items()):
        entry = PackageEntry.of(value)
        if entry is None:
            removals.append(name)
        elif entry.version is not None or entry.direct_url:
            installs.append(entry.requirement(name))
    steps = []
    if removals:
        steps.append(shlex.join([result.uv, "pip", "uninstall", "--python", python, *removals]))
    if installs:
        steps.append(
            shlex.join(
                [result.uv, "pip", "install", "--python", python, "--no-deps"]
                + [*result.uv_args, *installs]
            )
        )
    cd, run = _user_command(result)
    return " && ".join([*steps, cd + run])


def _user_command(result: RunResult) -> tuple[str, str]:
    """(``cd <cwd> && `` or "", the user's command): a bare ``python`` as the program is
    the run's target interpreter, as in every trial (``argvmap``)."""
    from envbisect.model.argvmap import PathMapper

    cd = f"cd {shlex.quote(result.cwd)} && " if result.cwd else ""
    if not result.smoke.argv:
        python = ["--python", result.python] if result.python else []
        return cd, shlex.join(["envbisect", "smoke", *python])
    return cd, shlex.join(PathMapper().argv(result.smoke.argv, result.python))


def _python_of(result: RunResult) -> str:
    words = list(result.target_args)
    return words[words.index("--python") + 1] if "--python" in words else "python3"


def _not_causes(result: RunResult) -> dict[str, Any]:
    found = result.not_causes()
    return {
        "not_causes": [
            {"unit": u, "good_trial": t.index, "median_tok_per_s": t.median}
            for t, units in found.cleared
            for u in units
        ],
        "not_settled": [
            {"unit": u, "trial": t.index, "verdict": str(t.verdict), "median_tok_per_s": t.median}
            for t, units in found.unsettled
            for u in units
        ],
        "not_judged_apart": list(found.untried),
    }


def as_json(result: RunResult) -> dict[str, Any]:
    """The ``--json`` document."""
    return {
        "schema": RUN_SCHEMA,
        "outcome": result.outcome,
        "threshold_tok_per_s": result.threshold,
        "culprits": [
            {
                "unit": c.unit.id,
                "section": c.unit.section,
                "title": c.unit.title,
                "commit": c.commit,
                "changes": c.changes(),
                "details": list(c.details),
                "why": list(c.why),
                "crash": c.crash,
                "hidden": c.hidden,
                "with_rest_tok_per_s": list(c.with_rest) if c.with_rest else None,
                "evidence": {"good_trial": c.good_trial, "bad_trial": c.bad_trial},
                "hunk": c.hunk.as_dict() if c.hunk is not None else None,
                "within": c.within.as_dict() if c.within is not None else None,
            }
            for c in result.culprits
        ],
        "trials": [t.as_dict() for t in result.trials],
        **_not_causes(result),
        "good_median_tok_per_s": result.good_median,
        "bad_median_tok_per_s": result.bad_median,
        "not_bisected": dict(result.blocked),
        "notes": list(result.notes),
        "findings": list(result.findings),
        "message": result.message,
        "session": str(result.session),
        "threshold_source": result.threshold_source,
        "threshold_fraction": result.threshold_fraction,
        "noise_per_sample": result.noise,
        "outliers": [{"trial": t.index, "outlier": t.outlier} for t in result.trials if t.outlier],
        "machine": dict(result.machine),
        "next": next_command(result),
        "kernels": kernels.run_json(result),
        **_figure_json(result),
    }


def _figure_json(result: RunResult) -> dict[str, Any]:
    """Where the command's figure is not tokens per second (``ms``, ``it/s``): the medians
    and threshold in its own unit (the ``*_tok_per_s`` keys hold the engine's rate)."""
    unit = shown()
    if unit.tokens:
        return {}

    def fig(rate: float | None) -> float | None:
        return None if rate is None else round(unit.figure(rate), 6)

    return {
        "figure": {
            "unit": unit.name,
            "lower_is_better": unit.lower_is_better,
            "threshold": fig(result.threshold),
            "good_median": fig(result.good_median),
            "bad_median": fig(result.bad_median),
            "trial_medians": {str(t.index): fig(t.median) for t in result.trials},
        }
    }


def render_json(result: RunResult) -> str:
    return json.dumps(redact_tree(as_json(result)), indent=2, sort_keys=False) + "\n"


_PURPOSE = {
    "endpoint: good": "the good state as recorded, nothing applied",
    "endpoint: bad": "every change applied: the bad state",
    "isolate": "a split of the changes, to halve the suspects",
    "isolate: context": "narrowing what the culprit is slow with",
    "confirm: alone": "the culprit alone on top of the good state",
    "confirm: without": "every change but the culprit",
}


def _purpose(r: TrialRow) -> str:
    """What a trial was for, in words."""
    if r.purpose in _PURPOSE:
        return _PURPOSE[r.purpose]
    if r.purpose == "narrow: torch stack":
        return "some components of the torch stack as in the bad state, the rest as in the good"
    if r.purpose.startswith("narrow: releases of "):
        return f"a release of {r.purpose.rsplit(' ', 1)[1]} between the two versions"
    if r.purpose.startswith("narrow: hunks of "):
        return f"testing some hunks of {r.purpose.split(' of ', 1)[1]}'s first bad change"
    if r.purpose.startswith("narrow: files:"):
        return (
            f"bisecting {r.purpose.split(': ', 1)[1]} over its versions (each commit that "
            "touched it, then the uncommitted edit)"
        )
    if r.purpose.startswith("narrow: "):
        return f"bisecting {r.purpose.split(': ', 1)[1]} over its commits"
    return r.purpose or "a state"


def explain_trial(r: TrialRow, culprits: set[str]) -> str:
    """One evidence line: what the trial was, what it measured, what that means."""
    what = _purpose(r)
    applied = {unit_of(a) for a in r.applied}
    below = r.purpose.startswith(("narrow: torch stack", "narrow: releases of "))
    if culprits and r.applied and not below:  # below a culprit: part of it, said by `what`
        what += "; with the culprit" if culprits & applied else "; without the culprit"
    if r.failure and r.verdict == "unresolved":
        meaning = f"unresolved: {r.failure}, so it counts neither way"
    elif r.failure:
        meaning = f"{r.verdict}: {r.failure} (a failure counts as slow)"
    elif r.verdict == "unresolved":
        meaning = "unresolved: within the noise of the threshold, so it counts neither way"
    elif r.verdict == "good":
        meaning = "good: at or above the threshold"
    else:
        meaning = "bad: below the threshold"
    line = f"- trial {r.index} ({what}): median {format_ktok(r.median)} {figure_unit()} → {meaning}"
    if r.outlier:
        line += f"; **outlier: {r.outlier}**, which no mix of the recorded changes explains"
    if r.timing:  # where its time went (issue 32): realize, start-up, compile, steps
        line += f" ({describe_timing(r.timing)})"
    return line


def machine_line(result: RunResult) -> str:
    """``- machine `h`: CPU … ×16; GPU 1× NVIDIA H200, driver 580; torch …; python …; load …``."""
    m = result.machine
    if not m:
        return "- machine: unknown (no facts in the bad state's manifest)"
    gpu = f"GPU {m.get('gpu') or '?'}" + (f", driver {m['driver']}" if m.get("driver") else "")
    torch = f"torch {m.get('torch') or 'absent'}" + (
        f" (CUDA {m['cuda']})" if m.get("cuda") else ""
    )
    parts = [
        f"CPU {m.get('cpu') or '?'} ×{m.get('cpus') or '?'}",
        gpu,
        torch,
        f"python {m.get('python') or '?'}",
        f"load {m.get('load') or 'unknown'} (1/5/15 min, at the end)",
    ]
    host = f" `{m['host']}`" if m.get("host") else ""
    return f"- machine{host}: " + "; ".join(parts)


def render_markdown(result: RunResult) -> str:
    """A report to paste into an issue: the culprit and what it changed, the machine, the
    evidence explained, every trial, the diff, what to run next and how to reproduce."""
    from envbisect.render.diff import render_markdown as diff_markdown

    lines = ["## envbisect run", ""]
    lines += [
        f"- {line.strip()}" if line.startswith("  ") else f"**{line}**"
        for line in summary_lines(result)
    ]
    lines += [
        "",
        machine_line(result),
        f"- threshold: {result_start_line(result)}",
        f"- good: `{result.good_path}` — median {format_ktok(result.good_median)} {figure_unit()}",
        f"- bad: `{result.bad_path}` — median {format_ktok(result.bad_median)} {figure_unit()}",
        f"- smoke command: `{result.smoke.describe()}`",
        f"- outcome: {result.outcome}; {len(result.trials)} trials{_rounds(result.trials)}; "
        f"session `{result.session}`",
    ]
    if result.noise is not None:
        lines.append(f"- noise: ±{result.noise:.1%} per sample")
    for note in result.notes:
        lines.append(f"- note: {note}")
    for unit, why in sorted(result.blocked.items()):
        lines.append(f"- not bisected: `{unit}`: {why}")
    for c in result.culprits:
        if c.why:
            lines += ["", f"### Why `{c.unit.id}` is slower (facts, good vs bad)", ""]
            lines += [f"- {line}" for line in c.why]
        if c.details:
            fence = "diff" if c.unit.section == "files" else ""
            # Recorded data never ends a code block: a newline in it is escaped (escape.py).
            details = [printable(d) for d in c.details]
            lines += ["", f"### What `{printable(c.unit.id)}` changed", "", f"```{fence}", *details]
            lines.append("```")
        if c.hunk is not None:
            lines += hunk_section(c.hunk)
    lines += kernels.run_markdown(result)
    lines += ["", "### Evidence", ""]
    culprits = {c.unit.id for c in result.culprits}
    lines += [explain_trial(r, culprits) for r in result.trials] or ["No trial was measured."]
    if not result.culprits:
        lines += ["", "No trial isolated a single unit."]
    lines += ["", "### Trials", "", trial_table(result.trials, fmt="github"), ""]
    lines += ["### Changes between the two states", "", diff_markdown(result.diff, embedded=True)]
    lines += _next_lines(result)
    lines += ["### Reproduce", "", "```", printable(reproduce_command(result)), "```", ""]
    return redact_text("\n".join(lines))


def _next_lines(result: RunResult) -> list[str]:
    """The report's Next: each culprit alone, on this machine (one block per culprit)."""
    lines: list[str] = []
    several = len(result.culprits) > 1
    for c in result.culprits:
        nxt = culprit_command(result, c)
        if not nxt:
            continue
        if not lines:
            lines += ["### Next", ""]
        said = f"The culprit {c.unit.id} alone" if several else "The culprit alone"
        lines += [f"{said}, on this machine:", "", "```", printable(nxt), "```", ""]
        if c.unit.section in ("packages", "torch-stack"):
            lines += [
                "This installs into and uninstalls from the target environment itself (every "
                "package the diff names gets its value in the culprit's state); run it in a "
                "copy of the environment to keep yours.",
                "",
            ]
    return lines


def session_rows(session: Session) -> list[TrialRow]:
    """The trial rows of a session, as ``run`` showed them: the finished run's own table
    when it ended, else the logged trials with the verdicts logged so far."""
    end = session.end_event()
    if end is not None and session.finished() and end.get("trials") is not None:
        return [TrialRow.from_dict(t) for t in end["trials"]]
    verdicts = session.verdicts()
    return [TrialRow.from_record(r, verdicts.get(r.index, {})) for r in session.trials()]


def log_table(session: Session) -> str:
    """``envbisect log``: the trials of the session, numbered and judged as ``run`` did."""
    header = session.header() or {}
    threshold = header.get("threshold")
    fraction = header.get("threshold_fraction")
    lines = [
        f"session {session.root}",
        f"good {header.get('good')}  bad {header.get('bad') or '(fresh snapshot)'}",
    ]
    if threshold is not None or fraction is not None:
        source = str(header.get("threshold_source") or "default")
        lines.append(start_line(threshold, source, fraction))
    for ev in session.events():
        if ev.get("type") == "calibration-refused":
            lines.append(f"calibration {ev.get('worker')}: left out: {ev.get('reason')}")
        if ev.get("type") == "calibration":
            lines.append(
                f"calibration {ev.get('worker')}: good state {format_ktok(ev.get('median'))} "
                f"{figure_unit()}, factor {float(ev.get('factor') or 1):.3f} ({ev.get('decision')})"
            )
    lines += ["", trial_table(session_rows(session)), ""]
    end = session.end_event()
    if end is not None and session.finished():
        lines.append(f"ended: {end.get('outcome')}: {end.get('message') or ''}".rstrip(": "))
    elif not session.finished():
        lines.append("unfinished: continue with 'envbisect run --resume'")
    return redact_text("\n".join(lines) + "\n")


def _rounds(rows: Sequence[TrialRow]) -> str:
    """`` in 4 rounds on 2 workers (cpu0, cpu1)`` for a parallel run, else nothing."""
    workers = sorted({r.worker for r in rows if r.worker})
    if not workers:
        return ""
    rounds = max((r.round for r in rows), default=0)
    return f" in {rounds} rounds on {len(workers)} workers ({', '.join(workers)})"
