"""Turn a DiffResult into text: table, markdown, json or yaml. No logic, no I/O.

The table groups units by section, most regression-relevant first (the order of
``envbisect.diff.SECTION_ORDER``); the markdown form is meant to be pasted into a GitHub issue
and keeps the full change list in a collapsed ``<details>`` block. Colours are ANSI codes
added only when the caller says the output is a terminal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
import yaml
from tabulate import tabulate

from envbisect.agent.redact import redact_text, redact_tree
from envbisect.diff import Change, ChangeKind, DiffResult, Unit
from envbisect.model.escape import printable
from envbisect.run.shown import show_value

FORMATS: tuple[str, ...] = ("table", "markdown", "json", "yaml")

_SECTION_TITLES = {
    "torch-stack": "torch stack",
    "packages": "packages",
    "files": "files",
    "git": "git repos",
    "env": "environment variables",
    "data": "data",
    "caches": "caches",
    "probes": "probes",
    "python": "python",
    "system": "system",
    "gpu": "gpu",
    "meta": "meta (volatile)",
}
_KIND_COLORS = {
    ChangeKind.ADDED: "green",
    ChangeKind.REMOVED: "red",
    ChangeKind.UPGRADED: "cyan",
    ChangeKind.DOWNGRADED: "yellow",
    ChangeKind.CHANGED: "magenta",
}


def render(result: DiffResult, fmt: str, *, color: bool = False) -> str:
    """The text for ``fmt`` (one of FORMATS), ending in a newline. Every format passes the
    secret-shape rules of ``envbisect.agent.redact`` (a manifest from an older envbisect, or
    written by hand, may still hold a token in a package URL or a note)."""
    if fmt == "table":
        return redact_text(render_table(result, color=color))
    if fmt == "markdown":
        return redact_text(render_markdown(result))
    if fmt == "json":
        return render_json(result)
    if fmt == "yaml":
        return render_yaml(result)
    raise ValueError(f"unknown format {fmt!r}")


def change_text(change: Change) -> str:
    """``upgraded; CUDA variant cu128 → cu130``."""
    return f"{change.kind.value}; {change.note}" if change.note else change.kind.value


def change_label(change: Change) -> str:
    """The row label: the key, with ``torch`` in front of the torch section's build facts."""
    key = printable(change.key)
    return f"torch {key}" if change.section == "torch" else key


def _groups(result: DiffResult) -> list[tuple[str, list[Unit]]]:
    groups: dict[str, list[Unit]] = {}
    for unit in result.units:  # already in section order
        groups.setdefault(unit.section, []).append(unit)
    return list(groups.items())


# More CUDA wheel changes than this fold into one row of the table (--section lists them).
FOLD_WHEELS = 4


def _is_cuda_wheel(change: Change) -> bool:
    return change.section == "packages" and change.key.startswith(("nvidia-", "cuda-"))


def _wheel_row(wheels: list[Change]) -> list[str]:
    counts: dict[str, int] = {}
    for c in wheels:
        counts[c.kind.value] = counts.get(c.kind.value, 0) + 1
    kinds = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    before = sum(1 for c in wheels if c.old is not None)
    after = sum(1 for c in wheels if c.new is not None)
    return [
        "nvidia-*, cuda-* wheels",
        f"{before} wheels",
        f"{after} wheels",
        f"{kinds} (--section torch-stack lists them)",
    ]


def _side_line(name: str, side: dict[str, Any]) -> str:
    facts = [str(side["label"])]
    if side.get("created"):
        facts.append(str(side["created"]))
    if side.get("host"):
        facts.append(str(side["host"]))
    if side.get("reconstructed_as_of"):
        facts.append(f"reconstructed as of {side['reconstructed_as_of']}")
    where = side.get("path") or "(fresh snapshot)"
    return f"{name:<4}  {where}  ({', '.join(facts)})"


def render_table(result: DiffResult, *, color: bool = False) -> str:
    """Grouped tables with a footer of reasons and the summary line.

    Without a --section filter, the torch stack's CUDA wheels (nvidia-*, cuda-*) fold into
    one row when there are more than FOLD_WHEELS of them: a CUDA 12 -> 13 move changes ~30.
    Torch build facts that repeat a package row (version, triton) are not shown twice.
    """

    def style(text: str, **kw: Any) -> str:
        return click.style(text, **kw) if color else text

    data = result.as_dict()
    lines = [_side_line("good", data["good"]), _side_line("bad", data["bad"]), ""]
    for section, units in _groups(result):
        lines.append(style(_group_heading(section, units), bold=True))
        rows = [row for unit in units for row in _unit_rows(result, unit, style)]
        table = tabulate(rows, headers=["", "good", "bad", "change"], disable_numparse=True)
        lines.extend("  " + row for row in table.splitlines())
        lines.append("")
    for heading, listed in (
        ("not bisectable:", [u for u in result.units if not u.bisectable]),
        ("notes:", [u for u in result.units if u.bisectable and u.reason]),
    ):
        if listed:
            lines.append(style(heading, bold=True))
            lines.extend(f"  {u.id}: {u.reason}" for u in listed)
            lines.append("")
    lines.append(style(result.summary(), bold=True))
    return "\n".join(lines) + "\n"


def _group_heading(section: str, units: list[Unit]) -> str:
    """``Title  (N units, M changes[, not bisectable])``."""
    title = _SECTION_TITLES.get(section, section)
    if section == "torch-stack":
        title = units[0].title
    n_changes = sum(len(u.changes) for u in units)
    count = f"{len(units)} unit{'s' if len(units) != 1 else ''}"
    if n_changes != len(units):
        count += f", {n_changes} changes"
    if not any(u.bisectable for u in units):
        count += ", not bisectable"
    return f"{title}  ({count})"


def _unit_rows(result: DiffResult, unit: Unit, style: Callable[..., str]) -> list[list[str]]:
    """A unit's table rows; many CUDA wheels of the torch stack fold into one row."""
    changes, wheels = list(unit.changes), []
    if unit.id == "torch-stack" and not result.sections_filter:
        wheels = [c for c in changes if _is_cuda_wheel(c)]
        if len(wheels) > FOLD_WHEELS:
            changes = [c for c in changes if not _is_cuda_wheel(c)]
        else:
            wheels = []
    shown = {(c.old, c.new) for c in changes if c.section == "packages"}
    rows = []
    for c in changes:
        if c.section == "torch" and c.key in ("version", "triton") and (c.old, c.new) in shown:
            continue  # torch's own version/triton facts repeat the package rows
        kind = style(change_text(c), fg=_KIND_COLORS[c.kind])
        rows.append([change_label(c), show_value(c.old), show_value(c.new), kind])
    if wheels:
        rows.append(_wheel_row(wheels))
    return rows


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_side(name: str, side: dict[str, Any]) -> str:
    where = f"`{side['path']}`" if side.get("path") else "a fresh snapshot"
    facts = ", ".join(str(side[k]) for k in ("label", "created", "host") if side.get(k))
    if side.get("reconstructed_as_of"):
        facts += f", reconstructed as of {side['reconstructed_as_of']}"
    return f"- **{name}**: {where} ({_md(facts)})"


def render_markdown(result: DiffResult, *, embedded: bool = False) -> str:
    """A unit table for a GitHub issue, the full change list collapsed below it.

    ``embedded``: inside another document (run's report) that already has the heading and
    names both sides: only the summary and the tables.
    """
    data = result.as_dict()
    lines = (
        []
        if embedded
        else [
            f"### envbisect diff: {_md(data['good']['label'])} → {_md(data['bad']['label'])}",
            "",
            _md_side("good", data["good"]),
            _md_side("bad", data["bad"]),
            "",
        ]
    )
    lines += [f"**{_md(result.summary(cli=False))}**", ""]
    if result.identical:
        return "\n".join(lines)
    rows = []
    for unit in result.units:
        head = unit.changes[0]
        more = len(unit.changes) - 1
        change = change_text(head) + (f" (+{more} more)" if more else "")
        if unit.bisectable:
            verdict = "yes" + (f" ({unit.reason})" if unit.reason else "")
        else:
            verdict = f"no: {unit.reason}"
        # A unit of several changes names the fact its first values belong to.
        prefix = f"{change_label(head)} " if more else ""
        cells = [
            f"`{printable(unit.id)}`",
            prefix + show_value(head.old),
            prefix + show_value(head.new),
            change,
            verdict,
        ]
        rows.append([_md(c) for c in cells])
    headers = ["unit", "good", "bad", "change", "bisectable"]
    lines.append(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    lines += ["", f"<details><summary>All {len(result.changes)} changes</summary>", ""]
    full = [
        [
            _md(c.section),
            _md(change_label(c)),
            _md(show_value(c.old)),
            _md(show_value(c.new)),
            _md(change_text(c)),
        ]
        for c in result.changes
    ]
    headers = ["section", "key", "good", "bad", "change"]
    lines.append(tabulate(full, headers=headers, tablefmt="github", disable_numparse=True))
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def render_json(result: DiffResult) -> str:
    """``DiffResult.as_dict()`` as indented JSON (full values, hashes unshortened)."""
    doc = redact_tree(result.as_dict())
    return json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n"


def render_yaml(result: DiffResult) -> str:
    """``DiffResult.as_dict()`` as YAML, keys in the order they were built."""
    return yaml.safe_dump(
        redact_tree(result.as_dict()),
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=120,
    )
