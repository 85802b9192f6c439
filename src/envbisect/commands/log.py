"""`envbisect log`: the trials of a bisection session."""

from __future__ import annotations

import click

from envbisect.commands.common import config_option, load_config, session_option, session_root
from envbisect.model.errors import UsageError


@click.command("log")
@click.argument("session", required=False, metavar="[SESSION]")
@session_option
@config_option
@click.option(
    "--report",
    "report_path",
    metavar="FILE",
    help="Also draw the session, finished or interrupted, as one self-contained HTML page "
    "(the samples, the search; needs matplotlib: pip install 'envbisect[report]').",
)
def command(
    session: str | None, session_dir: str | None, config_path: str | None, report_path: str | None
) -> int:
    """Print the trial table of the current (or last) bisection session, or of SESSION
    (a session directory, as --session names it: ``envbisect log ../sess1``)."""
    from envbisect.model.escape import terminal
    from envbisect.model.session import Session
    from envbisect.render.report import log_table

    if session and session_dir and session != session_dir:
        raise UsageError(f"two sessions named: {session} and --session {session_dir}")
    root = session_root(load_config(config_path), session_dir or session)
    if report_path:
        from pathlib import Path

        from envbisect.model.paths import atomic_write_text, check_writable
        from envbisect.render.html import log_html

        check_writable("--report", Path(report_path))
        atomic_write_text(Path(report_path), log_html(Session.existing(root)))
    click.echo(terminal(log_table(Session.existing(root))), nl=False)
    return 0
