"""`envbisect reset`."""

from __future__ import annotations

import click

from envbisect.errors import UsageError


@click.command("reset")
def command() -> int:
    """Not built yet."""
    raise UsageError("'envbisect reset' is not built yet")
