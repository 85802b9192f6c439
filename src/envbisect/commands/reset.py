"""`envbisect reset`: put back every file a session swapped, remove its sandboxes."""

from __future__ import annotations

import click

from envbisect.commands.common import config_option, load_config, session_option, session_root


@click.command("reset")
@session_option
@config_option
def command(session_dir: str | None, config_path: str | None) -> int:
    """Restore journaled files (e.g. after kill -9), remove worktrees, venvs and cache copies.

    The session's log and trial logs stay, so 'envbisect log' still shows what was measured.
    """
    from envbisect.model.escape import printable
    from envbisect.model.session import Session

    root = session_root(load_config(config_path), session_dir)
    session = Session.existing(root)
    session.lock()  # refuses while a live envbisect process still uses it
    done = session.reset()
    from envbisect.realize.remote import reset_remote

    for line in reset_remote(session):  # a remote target's journal, worktrees and venvs
        click.echo(printable(line))
    for path in done.restored:
        click.echo(printable(f"restored {path}"))
    for kept in done.kept:
        click.echo(printable(kept.describe()))
    for path in done.worktrees:
        click.echo(printable(f"removed worktree {path}"))
    for path in done.removed:
        click.echo(printable(f"removed {path}"))
    click.echo(printable(f"session {session.root} reset"), err=True)
    return 0
