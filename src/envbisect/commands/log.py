"""`envbisect log`."""

from __future__ import annotations

import click

from envbisect.errors import UsageError


@click.command("log")
def command() -> int:
    """Not built yet."""
    raise UsageError("'envbisect log' is not built yet")
