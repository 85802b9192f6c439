"""`envbisect check`."""

from __future__ import annotations

import click

from envbisect.errors import UsageError


@click.command("check")
def command() -> int:
    """Not built yet."""
    raise UsageError("'envbisect check' is not built yet")
