"""`envbisect diff`."""

from __future__ import annotations

import click

from envbisect.errors import UsageError


@click.command("diff")
def command() -> int:
    """Not built yet."""
    raise UsageError("'envbisect diff' is not built yet")
