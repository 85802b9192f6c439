"""`envbisect run`: re-run the smoke test on in-between states and name the culprit."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from envbisect.commands.common import (
    config_option,
    load_config,
    metric_regex_option,
    resolve_target,
    resolve_threshold,
    session_option,
    session_root,
    smoke_command,
    smoke_command_line,
    target_options,
    threshold_options,
    timeout_option,
)

if TYPE_CHECKING:
    from envbisect.config import Config
    from envbisect.metric import Threshold
    from envbisect.runner import RunOptions, RunResult, SmokeCommand
    from envbisect.transport import Transport


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    # SIGTERM/SIGHUP take the same path as Ctrl-C: files restored, session saved, exit 130.
    raise KeyboardInterrupt(f"signal {signum}")


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option(
    "--good", "good", metavar="PATH", help="Known-good manifest (default: good: in envbisect.yaml)."
)
@click.option(
    "--bad", "bad", metavar="PATH", help="Broken-state manifest (default: a fresh snapshot now)."
)
@threshold_options
@click.option(
    "--repeats",
    type=int,
    default=None,
    help="Samples per state to start with (default: repeats: in envbisect.yaml, else 3).",
)
@click.option("--max-trials", type=int, default=None, help="Budget of distinct states.")
@timeout_option
@click.option(
    "--on-crash",
    type=click.Choice(["bad", "skip"]),
    default="bad",
    show_default=True,
    help="A crash/timeout/OOM counts as slow (bad) or cannot-test (skip).",
)
@click.option(
    "--crash-runs",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="When the bad state is not slow, run it up to N times looking for an intermittent "
    "crash before calling it not reproduced (a crash that strikes 1 run in 8 needs ~24).",
)
@session_option
@click.option(
    "--resume", is_flag=True, help="Continue the session (after an interruption, or to add trials)."
)
@click.option("--fresh", is_flag=True, help="Replace an earlier session's history with a new run.")
@click.option(
    "--workers",
    "workers_opt",
    metavar="N|auto",
    help="Measure N states at once, one per GPU of the target (CUDA_VISIBLE_DEVICES); "
    "'auto': one per visible GPU; on a host without GPUs, N workers pinned to their own "
    "cores (default: workers: in envbisect.yaml, else one).",
)
@click.option("--json", "json_path", metavar="PATH", help="Write the result as JSON ('-': stdout).")
@click.option("--report", "report_path", metavar="PATH", help="Write a markdown report.")
@metric_regex_option
@target_options
@config_option
@click.argument("smoke_argv", nargs=-1, type=click.UNPROCESSED, metavar="[-- SMOKE CMD ...]")
def command(**flags: Any) -> int:
    """Bisect the changes between GOOD and BAD down to the one that made training slow.

    Each trial realizes an in-between state in a sandbox (uv venv, git worktree, journaled
    file swap, per-trial env and compile caches), runs the smoke command (after --; default
    the built-in drafter smoke test) and reads its tok/s. Exit 0 culprit found, 1 no single
    culprit, 2 bad input, 130 interrupted (resume with --resume; clean up with reset).
    """
    from envbisect import report
    from envbisect.agent.redact import redact_text
    from envbisect.errors import UsageError
    from envbisect.manifest import check_writable
    from envbisect.runner import good_command_line, validate_options

    args = RunFlags(**flags)
    config = load_config(args.config_path)
    threshold = resolve_threshold(args.until_ktoks, args.until, config)
    good_path = Path(args.good) if args.good else config.good
    if good_path is None:
        raise UsageError("no good state: give --good PATH or set good: in envbisect.yaml")
    transport, py = resolve_target(config, args.python, args.via, args.target_name)
    py = _interpreter(args, transport, py, good_path)
    smoke = smoke_command(args.smoke_argv, config, args.metric_regex)
    options = args.options(config, threshold, good_path, (transport, py), smoke)
    if args.print_command:
        click.echo(
            good_command_line(options)
            if not smoke.builtin and not transport.layers
            else smoke_command_line(transport, py, smoke)
        )
        return 0
    validate_options(options)
    # Outputs are checked before the first trial: a typo must not cost a whole run.
    for flag, path in (("--json", args.json_path), ("--report", args.report_path)):
        if path and path != "-":
            check_writable(flag, Path(path))

    # Progress is often tee'd to a file: it passes the same secret rules as the report.
    def say(line: str) -> None:
        click.echo(redact_text(line), err=True)

    say(
        f"envbisect run: {threshold.describe()}; smoke: {smoke.describe()}; "
        f"session {options.session_dir}"
    )
    result = _run_bisect(options, say)
    click.echo(report.render_text(result), nl=False)
    _write_outputs(result, args.json_path, args.report_path)
    return result.exit_code


@dataclass(frozen=True)
class RunFlags:
    """``envbisect run``'s command line as click parsed it: one field per parameter."""

    good: str | None
    bad: str | None
    until_ktoks: str | None
    until: str | None
    repeats: int | None
    max_trials: int | None
    timeout_s: float
    on_crash: str
    crash_runs: int
    session_dir: str | None
    resume: bool
    fresh: bool
    workers_opt: str | None
    json_path: str | None
    report_path: str | None
    metric_regex: str | None
    python: str | None
    via: tuple[str, ...]
    target_name: str | None
    print_command: bool
    config_path: str | None
    smoke_argv: tuple[str, ...]

    def options(
        self,
        config: Config,
        threshold: Threshold,
        good: Path,
        target: tuple[Transport, str],
        smoke: SmokeCommand,
    ) -> RunOptions:
        """The run these flags ask for (the workers resolved on ``target``)."""
        from envbisect.bisect.workers import resolve as resolve_workers
        from envbisect.runner import RunOptions

        transport, py = target
        repeats = self.repeats if self.repeats is not None else (config.repeats or 3)
        session_dir = session_root(config, self.session_dir)
        workers = resolve_workers(
            self.workers_opt,
            config,
            transport=transport,
            python=py,
            log_dir=session_dir.parent / "probe",
        )
        return RunOptions(
            # what to bisect, and against which goal
            good=good.absolute(),
            bad=Path(self.bad).absolute() if self.bad else None,
            goal=threshold,
            smoke=smoke,
            # where it runs
            python=py,
            transport=transport,
            cwd=Path.cwd(),
            config=config,
            workers=workers,
            # the session, and how much to measure
            session_dir=session_dir,
            resume=self.resume,
            fresh=self.fresh,
            max_samples=max(9, repeats),
            repeats=repeats,
            max_trials=self.max_trials,
            timeout_s=self.timeout_s,
            on_crash=self.on_crash,
            crash_runs=self.crash_runs,
        )


def _interpreter(args: RunFlags, transport: Transport, py: str, good: Path) -> str:
    """The target interpreter: ``--python`` (or the target's) resolved once, else the one
    the manifests recorded (``envbisect.interpreter``)."""
    from envbisect import interpreter

    local = not transport.layers
    if args.python is None and args.target_name is None and local:
        py = interpreter.recorded(good, Path(args.bad) if args.bad else None) or py
    return interpreter.resolve_given(py, local=local)


def _run_bisect(options: RunOptions, say: Callable[[str], None]) -> RunResult:
    """``run_bisect`` with SIGTERM and SIGHUP taking Ctrl-C's path."""
    from envbisect.runner import run_bisect

    previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return run_bisect(options, say)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _write_outputs(result: RunResult, json_path: str | None, report_path: str | None) -> None:
    """``--json`` (``-``: stdout) and ``--report``."""
    from envbisect import report
    from envbisect.manifest import atomic_write_text

    if json_path == "-":
        sys.stdout.write(report.render_json(result))
    elif json_path:
        atomic_write_text(Path(json_path), report.render_json(result))
    if report_path:
        atomic_write_text(Path(report_path), report.render_markdown(result))
