"""Render bisection results: the trial table, the culprit sentence, markdown and JSON.

No logic beyond formatting; the numbers come from ``runner.RunResult`` or a session log.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from envbisect.bisect.session import Session
from envbisect.metric import format_ktok, format_tok
from envbisect.runner import Culprit, RunResult, TrialRow

# The --json document of ``run``; bump the number when a field changes meaning.
RUN_SCHEMA = "envbisect/run@1"


def start_line(threshold: float | None) -> str:
    """``good means ≥ 12,000 tok/s (12.0 Ktok/s)``."""
    if threshold is None:
        return "good means faster than midway between the endpoints"
    return f"good means ≥ {format_tok(threshold)}"


def _samples(samples: Sequence[float]) -> str:
    return " ".join(format_ktok(s) for s in samples) or "-"


def _applied(applied: Sequence[str], width: int = 60) -> str:
    text = ", ".join(applied) if applied else "(none: good state)"
    return text if len(text) <= width else text[: width - 1] + "…"


def trial_table(rows: Sequence[TrialRow], *, fmt: str = "simple") -> str:
    """Trial | applied units | samples (Ktok/s) | median | verdict."""
    body = [
        [
            r.index,
            _applied(r.applied),
            _samples(r.samples),
            format_ktok(r.median),
            r.verdict
            + (f" ({r.failure})" if r.failure else "")
            + (f" — outlier: {r.outlier}" if r.outlier else ""),
        ]
        for r in rows
    ]
    headers = ["trial", "applied", "samples Ktok/s", "median", "verdict"]
    return tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)


def culprit_sentence(culprit: Culprit, good: float | None, bad: float | None) -> str:
    """``Culprit: env X unset → v — 12.6 → 4.3 Ktok/s``."""
    unit = culprit.unit
    changes = culprit.changes()
    if len(changes) == 1 and unit.section != "torch-stack":
        c = changes[0]
        old = "unset" if c["old"] == "-" and unit.section == "env" else c["old"]
        new = "unset" if c["new"] == "-" and unit.section == "env" else c["new"]
        what = f"{unit.title} {old} → {new}"
        if culprit.commit:
            what = f"{unit.title}: first bad commit {culprit.commit[:12]}"
    else:
        what = unit.title
    effect = ""
    if good is not None and bad is not None:
        effect = f" — {format_ktok(good)} → {format_ktok(bad)} Ktok/s"
    return f"Culprit: {what}{effect}"


def summary_lines(result: RunResult) -> list[str]:
    """The end of ``run``'s output: culprit sentence(s) or why there is none."""
    if result.culprits:
        return [culprit_sentence(c, c.good_median, c.bad_median) for c in result.culprits]
    lines = [f"No single culprit ({result.outcome}): {result.message or 'see the trials'}"]
    if result.blocked:
        lines.append("Not bisected (could not be realized): " + ", ".join(sorted(result.blocked)))
    return lines


def render_text(result: RunResult) -> str:
    return "\n".join([trial_table(result.trials), "", *summary_lines(result)]) + "\n"


def reproduce_command(result: RunResult) -> str:
    argv = [
        "envbisect",
        "run",
        *result.target_args,
        "--good",
        str(result.good_path),
        "--bad",
        str(result.bad_path),
        "--until-ktoks",
        f"{result.threshold:.0f}" if result.threshold else "?",
    ]
    if result.smoke.metric is not None:
        argv += ["--metric-regex", result.smoke.metric.pattern.pattern]
    if result.smoke.argv:
        argv += ["--", *result.smoke.argv]
    return shlex.join(argv)


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
            }
            for c in result.culprits
        ],
        "trials": [t.as_dict() for t in result.trials],
        "good_median_tok_per_s": result.good_median,
        "bad_median_tok_per_s": result.bad_median,
        "not_bisected": dict(result.blocked),
        "notes": list(result.notes),
        "message": result.message,
        "session": str(result.session),
    }


def render_json(result: RunResult) -> str:
    return json.dumps(as_json(result), indent=2, sort_keys=False) + "\n"


def render_markdown(result: RunResult) -> str:
    """Culprit, evidence, trial table, the diff and a command to reproduce."""
    from envbisect.render import render_markdown as diff_markdown

    lines = ["## envbisect run", ""]
    lines += [f"**{line}**" for line in summary_lines(result)]
    lines += [
        "",
        f"- threshold: {start_line(result.threshold)}",
        f"- good: `{result.good_path}` — median {format_ktok(result.good_median)} Ktok/s",
        f"- bad: `{result.bad_path}` — median {format_ktok(result.bad_median)} Ktok/s",
        f"- smoke command: `{result.smoke.describe()}`",
        f"- outcome: {result.outcome}; {len(result.trials)} trials; session `{result.session}`",
    ]
    for note in result.notes:
        lines.append(f"- note: {note}")
    for unit, why in sorted(result.blocked.items()):
        lines.append(f"- not bisected: `{unit}`: {why}")
    lines += ["", "### Evidence", ""]
    if result.culprits:
        ids = {c.unit.id for c in result.culprits}
        for r in result.trials:
            mark = "with" if ids & set(r.applied) else "without"
            lines.append(
                f"- trial {r.index} ({mark} culprit): median {format_ktok(r.median)} Ktok/s → "
                f"{r.verdict}"
            )
    else:
        lines.append("No trial isolated a single unit.")
    lines += ["", "### Trials", "", trial_table(result.trials, fmt="github"), ""]
    lines += ["### Diff", "", diff_markdown(result.diff), ""]
    lines += ["### Reproduce", "", "```", reproduce_command(result), "```", ""]
    return "\n".join(lines)


def session_rows(session: Session) -> list[TrialRow]:
    """The trial rows of a session, as ``run`` showed them: the finished run's own table
    when it ended, else the logged trials with the verdicts logged so far."""
    end = session.end_event()
    if end is not None and session.finished() and end.get("trials") is not None:
        return [TrialRow.from_dict(t) for t in end["trials"]]
    verdicts = session.verdicts()
    rows = []
    for r in session.trials():
        v = verdicts.get(r.index, {})
        applied = tuple(
            f"{u}@{dict(r.positions)[u]}" if u in dict(r.positions) else u for u in r.applied
        )
        rows.append(
            TrialRow(
                index=r.index,
                applied=applied,
                samples=r.samples,
                median=_median(r.samples),
                verdict=str(v.get("verdict") or "-"),
                failure=r.failure,
                outlier=v.get("outlier"),
            )
        )
    return rows


def log_table(session: Session) -> str:
    """``envbisect log``: the trials of the session, numbered and judged as ``run`` did."""
    header = session.header() or {}
    threshold = header.get("threshold")
    lines = [
        f"session {session.root}",
        f"good {header.get('good')}  bad {header.get('bad') or '(fresh snapshot)'}",
    ]
    if threshold is not None:
        lines.append(start_line(float(threshold)))
    lines += ["", trial_table(session_rows(session)), ""]
    end = session.end_event()
    if end is not None and session.finished():
        lines.append(f"ended: {end.get('outcome')}: {end.get('message') or ''}".rstrip(": "))
    elif not session.finished():
        lines.append("unfinished: continue with 'envbisect run --resume'")
    return "\n".join(lines) + "\n"


def _median(samples: Sequence[float]) -> float | None:
    if not samples:
        return None
    xs = sorted(samples)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
