"""`envbisect log`: the trials of a bisection session."""

from __future__ import annotations

import click

from envbisect.commands.common import config_option, load_config, session_option, session_root
from envbisect.model.errors import UsageError


@click.command("log")
@click.argument("session", required=False, metavar="[SESSION]")
@session_option
@config_option
def command(session: str | None, session_dir: str | None, config_path: str | None) -> int:
    """Print the trial table of the current (or last) bisection session, or of SESSION
    (a session directory, as --session names it: ``envbisect log ../sess1``)."""
    from envbisect.model.escape import terminal
    from envbisect.model.session import Session
    from envbisect.render.report import log_table

    if session and session_dir and session != session_dir:
        raise UsageError(f"two sessions named: {session} and --session {session_dir}")
    root = session_root(load_config(config_path), session_dir or session)
    click.echo(terminal(log_table(Session.existing(root))), nl=False)
    return 0
