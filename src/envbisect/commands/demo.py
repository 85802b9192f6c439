"""`envbisect demo`."""

from __future__ import annotations

import click

from envbisect.errors import UsageError


@click.command("demo")
def command() -> int:
    """Not built yet."""
    raise UsageError("'envbisect demo' is not built yet")
