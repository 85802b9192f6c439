"""`envbisect check`: one measurement of the current state → exit 0 good, 1 bad, 125 skip.

Made for ``git bisect run envbisect check --until-ktoks 12000 -- python train.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from envbisect.commands.common import (
    command_words,
    config_option,
    load_config,
    metric_regex_option,
    recorded_interpreter,
    resolve_target,
    resolve_threshold,
    smoke_command,
    smoke_command_line,
    target_options,
    threshold_options,
    timeout_option,
)

if TYPE_CHECKING:
    from envbisect.run.check import CheckResult


@click.command("check", context_settings={"ignore_unknown_options": True})
@threshold_options
@click.option(
    "--repeats",
    type=int,
    default=None,
    help="Runs; their median counts (default: repeats: in envbisect.yaml, else 3).",
)
@timeout_option
@metric_regex_option
@click.option(
    "--manifest",
    "manifest_path",
    metavar="PATH",
    help="The state's manifest: without --python, its recorded interpreter runs the command "
    "(a bare python in CMD, the built-in smoke test); default: good: in envbisect.yaml.",
)
@target_options
@config_option
@click.argument("smoke_argv", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD ...]")
def command(
    until_ktoks: str | None,
    until: str | None,
    repeats: int | None,
    timeout_s: float,
    metric_regex: str | None,
    warmup_lines: int | None,
    no_probe: bool,
    step_fn: str | None,
    full_exit: bool,
    direction: str | None,
    steps: int | None,
    max_trial_s: float | None,
    python: str | None,
    via: tuple[str, ...],
    target_name: str | None,
    print_command: bool,
    config_path: str | None,
    manifest_path: str | None,
    smoke_argv: tuple[str, ...],
) -> int:
    """Measure the current state once: exit 0 good, 1 bad, 125 cannot test.

    CMD (after --) must report throughput: an ENVBISECT_RESULT JSON (the file named by
    $ENVBISECT_RESULT or an 'ENVBISECT_RESULT {...}' line) or a log line matched by
    --metric-regex. Without CMD, the smoke: command of envbisect.yaml, else the built-in
    drafter smoke test, runs in --python.
    """
    from envbisect.model.errors import UsageError
    from envbisect.model.units import showing
    from envbisect.run.check import check

    smoke_argv = command_words(smoke_argv, "check")
    config = load_config(config_path)
    smoke = smoke_command(
        command_words(smoke_argv, "check"),
        config,
        metric_regex,
        no_probe=no_probe,
        warmup_lines=warmup_lines,
        step_fn=step_fn,
        full_exit=full_exit,
        direction=direction,
        steps=steps,
        max_trial_s=max_trial_s,
    )
    goal = resolve_threshold(until_ktoks, until, config, relative=False, metric=smoke.metric)
    if goal.value is None:
        raise UsageError(
            "check needs a threshold: --until-ktoks N, or threshold: in envbisect.yaml"
        )
    threshold = goal.value
    repeats = repeats if repeats is not None else (config.repeats or 3)
    if repeats < 1:
        raise UsageError("--repeats must be at least 1")
    transport, py = resolve_target(config, python, via, target_name)
    if python is None and target_name is None:
        py = recorded_interpreter(transport, py, manifest_path, config)
    if print_command:
        click.echo(smoke_command_line(transport, py, smoke))
        return 0
    from envbisect.agent.redact import redact_text
    from envbisect.model.escape import terminal

    click.echo(
        terminal(
            redact_text(f"envbisect check: {goal.describe()}; running {smoke.describe()} ")
            + f"{repeats}×"
        ),
        err=True,
    )
    with showing(smoke.metric.unit if smoke.metric else goal.unit):
        result = check(
            smoke,
            threshold=threshold,
            transport=transport,
            python=py,
            repeats=repeats,
            timeout_s=timeout_s,
        )
        _echo_verdict(result)
    return result.exit_code


def _echo_verdict(result: CheckResult) -> None:
    """The verdict on stdout; a note on stderr when it sits inside the noise."""
    from envbisect.agent.redact import redact_text
    from envbisect.model.escape import terminal
    from envbisect.model.metric import format_tok
    from envbisect.model.units import shown

    if result.verdict == "skip":
        said = f"cannot test: {result.failure}; logs in {result.log_dir}"
        click.echo(terminal(redact_text(said)))
        if result.detail:
            click.echo(terminal(redact_text(result.detail)))
        return
    sign = "≥" if result.verdict == "good" else "<"
    if shown().lower_is_better:
        sign = "≤" if result.verdict == "good" else ">"
    click.echo(
        f"{result.verdict}: median {format_tok(result.median)} {sign} "
        f"{format_tok(result.threshold)}"
    )
    if result.within_noise:
        click.echo(
            f"note: within the noise of the threshold (±{result.noise:.1%} per sample over "
            f"{len(result.samples)} samples): the verdict may flip; more --repeats decide it",
            err=True,
        )
