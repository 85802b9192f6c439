"""`envbisect log`: the trials of a bisection session."""

from __future__ import annotations

import click

from envbisect.commands.common import config_option, load_config, session_option, session_root


@click.command("log")
@session_option
@config_option
def command(session_dir: str | None, config_path: str | None) -> int:
    """Print the trial table of the current (or last) bisection session."""
    from envbisect.model.escape import terminal
    from envbisect.model.session import Session
    from envbisect.render.report import log_table

    root = session_root(load_config(config_path), session_dir)
    click.echo(terminal(log_table(Session.existing(root))), nl=False)
    return 0
