"""`envbisect smoke`."""

from __future__ import annotations

import click

from envbisect.errors import UsageError


@click.command("smoke")
def command() -> int:
    """Not built yet."""
    raise UsageError("'envbisect smoke' is not built yet")
