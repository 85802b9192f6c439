"""The culprit in words: its sentence (``Culprit: … — 12.6 → 4.3 Ktok/s``), a hunk culprit's
sentence and section, the closing lines of ``run`` and the facts under each culprit."""

from __future__ import annotations

from envbisect.model.history import UNCOMMITTED, HunkCulprit
from envbisect.model.metric import figure_unit, format_ktok
from envbisect.run.result import Culprit, RunResult, TrialRow, TrialVerdict


def culprit_sentence(culprit: Culprit, good: float | None, bad: float | None) -> str:
    """``Culprit: env X unset → v — 12.6 → 4.3 Ktok/s``."""
    if culprit.hunk is not None:
        return hunk_sentence(culprit.hunk)
    unit = culprit.unit
    changes = culprit.changes()
    if len(changes) == 1 and unit.section != "torch-stack":
        c = changes[0]
        old = "unset" if c["old"] == "-" and unit.section == "env" else c["old"]
        new = "unset" if c["new"] == "-" and unit.section == "env" else c["new"]
        what = f"{unit.title} {old} → {new}"
        if culprit.commit == UNCOMMITTED:  # a file's versions end with the uncommitted edit
            what = f"{unit.title}: its uncommitted edit"
        elif culprit.commit:
            what = f"{unit.title}: first bad commit {culprit.commit[:12]}"
    else:
        what = unit.title
    effect = ""
    if good is not None and bad is not None:
        effect = f" — {format_ktok(good)} → {format_ktok(bad)} {figure_unit()}"
    elif culprit.with_rest is not None:
        g, b = culprit.with_rest
        effect = (
            f" — {format_ktok(g)} → {format_ktok(b)} {figure_unit()} with the rest of the change"
        )
    if culprit.crash:
        effect += f" — {culprit.crash}"
    if culprit.hidden:
        effect += " — hidden in the bad state: bad alone, but the other changes mask it"
    return f"Culprit: {what}{effect}"


def hunk_sentence(h: HunkCulprit) -> str:
    """``Culprit: commit e4c6327 "model: …" — repo/model.py hunk @@ -10,1 +10,1 @@ — 218.9 →
    52.4 Ktok/s``, or ``Culprit: uncommitted hunk @@ … @@ in repo/model.py — …``."""
    v = h.version
    if h.culprit is None and h.apart_unjudged:
        where = (
            f"{h.shown}, hunks " + " and ".join(x.header for x in h.candidates) + " together "
            "(none of them alone could be judged)"
        )
    elif h.culprit is None:
        where = f"{h.shown}, one of hunks " + ", ".join(x.header for x in h.candidates)
    elif v.committed:
        where = f"{h.shown} hunk {h.culprit.header}"
    else:
        where = f"hunk {h.culprit.header} in {h.shown}"
    what = (
        f'commit {v.item[:7]} "{v.subject or "?"}" — {where}'
        if v.committed
        else (f"uncommitted {where}")
    )
    if h.together:
        what += " (slow together with " + ", ".join(x.header for x in h.together) + ")"
    effect = ""
    if h.good is not None and h.bad is not None:
        effect = f" — {format_ktok(h.good)} → {format_ktok(h.bad)} {figure_unit()}"
    return f"Culprit: {what}{effect}"


def hunk_section(h: HunkCulprit) -> list[str]:
    """The report's view of a hunk culprit: the version, the hunk, the cleared hunks."""
    v = h.version
    if v.committed:
        head = f'### The hunk: commit `{v.item[:12]}` "{v.subject or "?"}" ({v.date or "?"})'
    else:
        head = "### The hunk: the uncommitted edit on top of the bad commit"
    lines = ["", head, ""]
    several = len(h.files) > 1
    lines.append(
        f"`{', '.join(h.files)}` — {len(h.hunks)} hunk(s) in this change; trials "
        f"{h.good_trial} (without it) and {h.bad_trial} (with it); {h.trials} trial(s) "
        "searched the hunks"
    )
    shown = [h.culprit] if h.culprit is not None else list(h.candidates)
    for x in shown:
        lines += ["", *([f"`{h.where(x)}`:"] if several else []), "```diff", *x.lines, "```"]
    if h.together:
        lines += ["", "slow only together with: " + ", ".join(f"`{x.header}`" for x in h.together)]
    if h.cleared:
        lines += ["", "The other hunks of this change, cleared:", "", "```diff"]
        for x in h.cleared:
            where = f"{h.where(x)} " if several else ""
            lines += [f"{where}{x.header} cleared", *x.lines[1:]]
        lines.append("```")
    return lines


def summary_lines(result: RunResult) -> list[str]:
    """The end of ``run``'s output: culprit sentence(s) or why there is none."""
    if result.culprits:
        lines = []
        for c in result.culprits:
            lines.append(culprit_sentence(c, c.good_median, c.bad_median))
            lines += [f"  {line}" for line in (c.within.lines() if c.within else ())]
        causes = {frozenset((c.unit.id, *c.together_with)) for c in result.culprits}
        hidden = [c.unit.id for c in result.culprits if c.hidden]
        if len(causes) > 1 and hidden:
            lines.append(
                f"{len(causes)} causes: each one alone brings the regression on top of the "
                f"good state; the bad state hides {', '.join(hidden)} (reverting the others "
                "restores the speed, and undoing what hides it brings it back)"
            )
        elif len(causes) > 1:
            lines.append(
                f"{len(causes)} independent causes: each one alone brings the regression "
                "on top of the good state; reverting one leaves the others"
            )
        return lines + not_cause_lines(result) + [f"Note: {f}" for f in result.findings]
    lines = [f"No single culprit ({result.outcome}): {result.message or 'see the trials'}"]
    if result.blocked:
        lines.append("Not bisected (could not be realized): " + ", ".join(sorted(result.blocked)))
    return lines


def why_lines(result: RunResult) -> list[str]:
    """Under each culprit, the facts that explain it (good vs bad, only what differs)."""
    return [f"  {line}" for c in result.culprits for line in c.why]


def not_cause_lines(result: RunResult) -> list[str]:
    """The other units beside the culprits: ``Not causes: env:X (good in trial 8, 56.3
    Ktok/s); …``, those whose trials without a culprit were not judged good, and those
    judged only beside a culprit."""
    found = result.not_causes()
    lines = []
    for title, groups in (
        ("Not causes (a trial with them and without the culprits was good)", found.cleared),
        ("Not cleared (without the culprits only in trials not judged good)", found.unsettled),
    ):
        if groups:
            parts = [
                f"{', '.join(_beside(u, result) for u in units)} ({_held(trial)})"
                for trial, units in groups
            ]
            lines.append(f"{title}: " + "; ".join(parts))
    if found.untried:
        lines.append(
            "Not judged apart from a culprit (no trial held them without one): "
            + ", ".join(found.untried)
        )
    return lines


def _beside(unit: str, result: RunResult) -> str:
    """``unit``, and for a repo holding a culprit file (found down to its commit there):
    what of the repo was cleared, lest "not a cause" read as the repo's history."""
    section, _, repo = unit.partition(":")
    inside = repo.rstrip("/") + "/"
    if section == "git" and any(c.unit.id.startswith("files:" + inside) for c in result.culprits):
        return f"{unit} (the rest of its checkout; the culprit's file is a unit of its own)"
    return unit


def _held(trial: TrialRow) -> str:
    """``good in trial 8, 56.3 Ktok/s`` (with its crashes, or its clean runs)."""
    figure = f", {format_ktok(trial.median)} {figure_unit()}" if trial.median is not None else ""
    crash = f", crashed {trial.crashes} of {trial.runs}" if trial.crashes else ""
    clean = f", 0 of {trial.runs} crashed" if trial.runs > 1 and not crash else ""
    verdict = "not judged" if trial.verdict is TrialVerdict.UNJUDGED else str(trial.verdict)
    return f"{verdict} in trial {trial.index}{figure}{crash}{clean}"
