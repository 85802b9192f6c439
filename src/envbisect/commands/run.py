"""`envbisect run`."""

from __future__ import annotations

import click

from envbisect.errors import UsageError


@click.command("run")
def command() -> int:
    """Not built yet."""
    raise UsageError("'envbisect run' is not built yet")
