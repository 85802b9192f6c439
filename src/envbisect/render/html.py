"""A bisection as one self-contained HTML page: the headline, the pictures (inline SVG from
``render.pictures``) and the text report, all from the same result object. No script, no
stylesheet or font from elsewhere: it opens offline and can be attached to an issue.
Everything recorded is HTML-escaped after the control characters are (``escape.printable``),
so a name holding ``<script>`` or an escape sequence is shown as text."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path

from envbisect.agent.redact import redact_text
from envbisect.model.escape import printable, terminal
from envbisect.model.metric import figure_unit
from envbisect.model.paths import atomic_write_text
from envbisect.model.session import Session
from envbisect.model.units import shown
from envbisect.render import pictures
from envbisect.render.culprit import summary_lines
from envbisect.render.report import log_table, render_markdown, session_rows
from envbisect.run.result import RunResult

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #212121 }
h1 { font-size: 1.4em } h2 { font-size: 1.1em; margin-top: 2em }
.headline { background: #fff8e1; border-left: 4px solid #ffb300; padding: .6em 1em }
.headline p { margin: .2em 0 } figure { margin: 1em 0 } figure svg { max-width: 100% }
pre { background: #f5f5f5; padding: 1em; overflow-x: auto; font-size: .85em }
"""
TITLES = {
    "samples": "How sure is it: every sample of every trial",
    "search": "How the search narrowed",
    "kernels": "What the culprit changed in the step's kernels",
}


def _esc(text: str) -> str:
    return html.escape(printable(text), quote=True)


def page(title: str, headline: Sequence[str], svgs: Mapping[str, str], text: str) -> str:
    """The page: ``headline`` lines, each picture under its title, then ``text`` (the
    report as markdown or the log's table) as preformatted text."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # No request leaves the page: nothing may load from anywhere, scripts never run.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">",
        f"<title>{_esc(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        '<div class="headline">' + "".join(f"<p>{_esc(h)}</p>" for h in headline) + "</div>",
    ]
    for name, svg in svgs.items():
        parts.append(f'<h2>{_esc(TITLES.get(name, name))}</h2><figure id="picture-{name}">')
        parts.append(svg)
        parts.append("</figure>")
    parts.append("<h2>The report</h2>")
    parts.append(f'<pre id="report-text">{html.escape(terminal(text), quote=False)}</pre>')
    parts.append("</body></html>")
    return redact_text("\n".join(parts)) + "\n"


def figures_of(result: RunResult) -> pictures.Figures:
    return pictures.Figures(
        rows=tuple(result.trials),
        threshold=result.threshold,
        culprits=tuple(c.unit.id for c in result.culprits),
        unit=figure_unit(),
        lower_is_better=shown().lower_is_better,
        kernels=result.kernels,
        scale=_scale(),
    )


def _scale() -> float:
    """Recorded figures as the tables show them: tok/s in Ktok/s, other units as they are."""
    return 1e-3 if shown().tokens else 1.0


def run_svgs(result: RunResult) -> dict[str, str]:
    """The run's pictures, drawn once for every report that shows them."""
    return pictures.all_svgs(figures_of(result))


def run_html(result: RunResult, svgs: Mapping[str, str]) -> str:
    """``run --report FILE.html``: the whole report with ``svgs`` (``run_svgs``)."""
    return page(
        "envbisect run",
        [line.strip() for line in summary_lines(result)],
        svgs,
        render_markdown(result),
    )


def log_html(session: Session) -> str:
    """``log --report FILE``: a finished or interrupted session, drawn from its log."""
    header = session.header() or {}
    end = session.end_event() or {}
    culprits = tuple(str(c) for c in end.get("culprits") or ())
    threshold = header.get("threshold")
    figures = pictures.Figures(
        rows=tuple(session_rows(session)),
        threshold=float(threshold) if isinstance(threshold, (int, float)) else None,
        culprits=culprits,
        unit=figure_unit(),
        lower_is_better=shown().lower_is_better,
        scale=_scale(),
    )
    headline = [f"culprit: {c}" for c in culprits] or [
        str(end.get("message") or "unfinished: continue with 'envbisect run --resume'")
    ]
    return page(f"envbisect log: {session.root}", headline, pictures.all_svgs(figures),
                log_table(session))  # fmt: skip


def markdown_with_pictures(result: RunResult, report: Path, svgs: Mapping[str, str]) -> str:
    """The markdown report, with ``svgs`` (``run_svgs``) written beside ``report`` as SVG
    files (``<stem>-samples.svg`` ...) and shown by an image link each (a pasted report
    whose files are attached still shows them)."""
    text = render_markdown(result)
    lines = ["", "### Pictures", ""]
    for name, svg in svgs.items():
        path = report.with_name(f"{report.stem}-{name}.svg")
        atomic_write_text(path, svg)
        lines.append(f"![{TITLES.get(name, name)}]({path.name})")
    return text + "\n".join(lines) + "\n"
