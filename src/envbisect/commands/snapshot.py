"""`envbisect snapshot`."""

from __future__ import annotations

import click

from envbisect.errors import UsageError


@click.command("snapshot")
def command() -> int:
    """Not built yet."""
    raise UsageError("'envbisect snapshot' is not built yet")
