"""`envbisect log`: the trials of a bisection session."""

from __future__ import annotations

from pathlib import Path

import click

from envbisect.commands.common import config_option


@click.command("log")
@click.option(
    "--session",
    "session_dir",
    metavar="DIR",
    help="Session directory (default .envbisect/session).",
)
@config_option
def command(session_dir: str | None, config_path: str | None) -> int:
    """Print the trial table of the current (or last) bisection session."""
    from envbisect.bisect.session import Session
    from envbisect.config import Config
    from envbisect.report import log_table

    config = Config.load(Path(config_path) if config_path else None)
    root = Path(session_dir) if session_dir else config.root / ".envbisect" / "session"
    click.echo(log_table(Session.existing(root)), nl=False)
    return 0
