"""`envbisect profile-diff`: two profiled runs' kernels and ops, compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from envbisect.model.errors import UsageError
from envbisect.model.escape import printable

# A probe's facts with a kernel table are a few MB; anything far larger is another file.
PROFILE_FACTS_CAP = 64 << 20


@click.command("profile-diff")
@click.argument("good", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("bad", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option(
    "--lines",
    type=click.IntRange(1),
    default=10,
    show_default=True,
    help="Changes shown in text.",
)
def command(good: Path, bad: Path, fmt: str, lines: int) -> int:
    """Compare the kernels and ops of two profiled runs: GOOD and BAD are the facts of
    ``envbisect probe --profile`` (its ``probe.facts.json``, or its ``--format json``
    output). Says what appeared, vanished, got slower or faster, or is called more or less
    often, per step and as a share of the step time; ``--format json`` has every change.
    """
    from envbisect.model.kernels import diff
    from envbisect.render.kernels import diff_lines

    result = diff(_table(good), _table(bad))
    if fmt == "json":
        click.echo(json.dumps(result.as_dict(), indent=2, sort_keys=True))
    else:
        click.echo("\n".join(diff_lines(result, lines)))
    return 0


def _table(path: Path) -> Any:
    from envbisect.model.kernels import ProfileTable
    from envbisect.model.paths import read_bounded

    raw = read_bounded(path, PROFILE_FACTS_CAP, "a probe's profile facts")
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise UsageError(f"{path}: not a probe's facts (JSON nested too deep)") from None
    except ValueError as exc:
        raise UsageError(f"{path}: not JSON ({printable(str(exc)[:200])})") from None
    if isinstance(data, dict) and isinstance(data.get("facts"), dict):
        data = data["facts"]  # envbisect probe --format json
    try:
        return ProfileTable.from_facts(data)
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None
