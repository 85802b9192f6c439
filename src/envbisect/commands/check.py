"""`envbisect check`: one measurement of the current state → exit 0 good, 1 bad, 125 skip.

Made for ``git bisect run envbisect check --until-ktoks 12000 -- python train.py``.
"""

from __future__ import annotations

import click

from envbisect.commands.common import (
    config_option,
    load_config,
    metric_regex_option,
    resolve_target,
    smoke_command,
    smoke_command_line,
    target_options,
    timeout_option,
)


@click.command("check", context_settings={"ignore_unknown_options": True})
@click.option(
    "--until-ktoks",
    "until",
    required=True,
    metavar="N",
    help="Good means at least this many tokens/s: 12000, 12k or 12.8k.",
)
@click.option("--repeats", default=1, show_default=True, help="Runs; their median counts.")
@timeout_option
@metric_regex_option
@target_options
@config_option
@click.argument("smoke_argv", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD ...]")
def command(
    until: str,
    repeats: int,
    timeout_s: float,
    metric_regex: str | None,
    python: str | None,
    via: tuple[str, ...],
    target_name: str | None,
    print_command: bool,
    config_path: str | None,
    smoke_argv: tuple[str, ...],
) -> int:
    """Measure the current state once: exit 0 good, 1 bad, 125 cannot test.

    CMD (after --) must report throughput: an ENVBISECT_RESULT JSON (the file named by
    $ENVBISECT_RESULT or an 'ENVBISECT_RESULT {...}' line) or a log line matched by
    --metric-regex. Without CMD, the smoke: command of envbisect.yaml, else the built-in
    drafter smoke test, runs in --python.
    """
    from envbisect.errors import UsageError
    from envbisect.metric import format_tok, parse_ktoks
    from envbisect.report import start_line
    from envbisect.runner import check

    threshold = parse_ktoks(until)
    if repeats < 1:
        raise UsageError("--repeats must be at least 1")
    config = load_config(config_path)
    transport, py = resolve_target(config, python, via, target_name)
    smoke = smoke_command(smoke_argv, config, metric_regex)
    if print_command:
        click.echo(smoke_command_line(transport, py, smoke))
        return 0
    click.echo(f"envbisect check: {start_line(threshold)}; running {smoke.describe()}", err=True)
    result = check(
        smoke,
        threshold=threshold,
        transport=transport,
        python=py,
        repeats=repeats,
        timeout_s=timeout_s,
    )
    if result.verdict == "skip":
        click.echo(f"cannot test: {result.failure}; logs in {result.log_dir}")
    else:
        sign = "≥" if result.verdict == "good" else "<"
        click.echo(f"{result.verdict}: {format_tok(result.median)} {sign} {threshold:,.0f} tok/s")
    return result.exit_code
