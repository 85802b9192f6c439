"""The ``envbisect`` command line: a click group and the one place errors become exit codes.

Each verb lives in ``envbisect.commands.<verb>`` and stays thin: validate, call one core
function, render, return an exit code. Core modules are imported inside the callbacks so
that ``envbisect --help`` and the snapshot path start fast.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from envbisect import __version__
from envbisect.commands import (
    check,
    demo,
    diff,
    log,
    probe,
    profile_diff,
    reset,
    run,
    smoke,
    snapshot,
)
from envbisect.model.errors import CommandFailed, EnvBisectError

EPILOG = """\
\b
Typical session:
  envbisect snapshot --label good        # on the fast machine state
  envbisect snapshot --label bad         # after things changed
  envbisect diff manifests/good-*.yaml manifests/bad-*.yaml
  envbisect run --good manifests/good-*.yaml --until-ktoks 12k

Exit codes: 0 ok / identical / culprit found, 1 different / bad / no single culprit,
2 bad input, 125 cannot test (check), 130 interrupted.
"""


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="envbisect")
def cli() -> None:
    """Find which environment change made ML training slow.

    envbisect records the facts of a machine state (snapshot), shows what differs
    between two states (diff), and re-runs a training smoke test on in-between states
    until it names the change that caused the throughput drop (run).
    """


for _command in (
    snapshot.command,
    diff.command,
    run.command,
    check.command,
    smoke.command,
    probe.command,
    profile_diff.command,
    log.command,
    reset.command,
    demo.command,
):
    cli.add_command(_command)


def printable(value: object) -> str:
    from envbisect.model.escape import printable as escaped

    return escaped(value)


def excerpt(value: object, limit: int) -> str:
    from envbisect.model.escape import excerpt as cut

    return cut(value, limit)


# An error line is read, not scrolled: a value echoed into it (a 100 KB argument, a huge
# reply from a target) is cut, saying how much was left out.
ERROR_CHARS = 2000


def error_text(exc: EnvBisectError) -> str:
    """The error on one escaped line; a command that failed (``CommandFailed``) keeps the
    lines of how it was run (argv, cwd, interpreter, exit, logs), each escaped on its own."""
    if isinstance(exc, CommandFailed):
        return "\n".join(excerpt(line, ERROR_CHARS) for line in str(exc).split("\n"))
    return excerpt(exc, ERROR_CHARS)


class EscapedStream:
    """A text stream that writes everything through :func:`envbisect.model.escape.terminal`:
    whatever a command prints (a target's host name, a program's error text, a file name)
    reaches the terminal with its control characters escaped; layout newlines, tabs and
    envbisect's own colours stay."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        from envbisect.model.escape import terminal

        self._stream.write(terminal(text, keep_colors=True))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the group, map EnvBisectError to one line and its exit code."""
    streams = sys.stdout, sys.stderr
    try:
        if not isinstance(sys.stdout, EscapedStream):
            sys.stdout = EscapedStream(sys.stdout)  # type: ignore[assignment]
        if not isinstance(sys.stderr, EscapedStream):
            sys.stderr = EscapedStream(sys.stderr)  # type: ignore[assignment]
        _main(argv)
    finally:
        sys.stdout, sys.stderr = streams


def _main(argv: list[str] | None) -> None:
    try:
        code = cli.main(args=argv, prog_name="envbisect", standalone_mode=False)
    except EnvBisectError as exc:
        click.echo(f"envbisect: error: {error_text(exc)}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("envbisect: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("envbisect: interrupted", err=True)
        sys.exit(130)
    except OSError as exc:
        # The machine said no (a read-only or full directory, a permission): one line that
        # names the path, like every other error a user can fix.
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"envbisect: error: {printable(where)}{exc.strerror or exc}", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
