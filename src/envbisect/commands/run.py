"""`envbisect run`: re-run the smoke test on in-between states and name the culprit."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from envbisect.commands.common import (
    at_once,
    command_words,
    config_option,
    hang_option,
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
    from envbisect.model.config import Config
    from envbisect.model.metric import Threshold
    from envbisect.run.launch import SmokeCommand
    from envbisect.run.options import RunOptions
    from envbisect.run.result import RunResult
    from envbisect.snapshot.reconstruct import Reconstruction
    from envbisect.transport import Transport


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option(
    "--good", "good", metavar="PATH", help="Known-good manifest (default: good: in envbisect.yaml)."
)
@click.option(
    "--good-as-of",
    "good_as_of",
    metavar="WHEN",
    help="No good manifest? Reconstruct the good state as it most probably was at WHEN "
    "('2026-11-20 09:00', local time) from what the machine still holds (see snapshot --as-of).",
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
@click.option(
    "--max-trials",
    type=int,
    default=None,
    help="Budget of distinct states, the steps below a culprit included (commits, hunks, "
    "torch stack components, releases).",
)
@timeout_option
@hang_option
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
@click.option(
    "--crash-rate-runs",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Runs of a culprit's own state that crashed, so that the culprit line says its "
    "crash rate ('crashed 5 of 5') with the error.",
)
@click.option(
    "--rate-runs-at-once",
    "rate_together",
    default="auto",
    show_default=True,
    callback=at_once,
    help="How many processes at once for every run that only counts crashes: the bad "
    "state's crash-rate estimate, the clean runs that clear a state of it, the good "
    "state's own rate, a culprit's rate. auto: as many as the cores, the host memory and "
    "the GPU memory allow, judged by what the first runs used (said as it is chosen; one "
    "at a time through --via/--target or with --workers); N: that many; 1: one after the "
    "other. A state's first run goes alone (its figure is the one kept); each process gets "
    "its own copy of the compile caches. A crash rate needs no clean timing (on an H100, 3 "
    "at once took about 40 s, where one after the other takes about 3 x 45 s).",
)
@click.option(
    "--cpu-threads",
    default="auto",
    show_default=True,
    callback=lambda _c, _p, v: _cpu_threads(v),
    help="OMP_NUM_THREADS and MKL_NUM_THREADS for every trial of your command: a number; "
    "'auto' sets them to the free cores when other processes keep some busy at the start "
    "(a CPU job with a thread per core collapses when one core is busy), and only on a "
    "machine without GPUs; 'off' leaves your environment's. Never where the states "
    "themselves differ in those variables. The built-in smoke test sizes its own.",
)
@click.option(
    "--recheck-under-load",
    "recheck_loaded",
    is_flag=True,
    help="On a shared box whose load comes and goes: a state judged slow mostly on samples "
    "taken while other processes loaded the machine is measured again, those samples set "
    "aside, before a culprit is named from it (costs a process per such state).",
)
@click.option(
    "--find-all",
    is_flag=True,
    help="Go on after the first cause while reverting it does not restore speed: name every "
    "change that brings the regression on its own (e.g. a cleared compile cache and a grown "
    "dataset that each make training crash). Without it the run stops at the first cause "
    "and says when others remain.",
)
@click.option(
    "--profile",
    is_flag=True,
    help="Once the culprit is confirmed, run its evidence (the good state and the culprit's "
    "state) once each with a few training steps under torch.profiler, and show which "
    "kernels and ops appeared, vanished or got slower (a step ends when an optimizer's "
    "step() returns); the Chrome traces are kept in the session. Your own Python command.",
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
@click.option(
    "--report",
    "report_path",
    metavar="PATH",
    help="Write the report: PATH.html is one self-contained page with pictures of the "
    "samples, the search and the kernels (needs matplotlib: pip install 'envbisect[report]'); "
    "any other name is markdown, its pictures written beside it as PATH-*.svg when "
    "matplotlib is there. The session keeps its own report.md and report.html.",
)
@click.option(
    "--trust",
    "trust",
    multiple=True,
    metavar="MANIFEST",
    help="Run this manifest although someone else made it and it names entries that can "
    "run code (env vars that load code, package sources, .pth files, repos with hooks); "
    "review it first (envbisect diff marks them). Repeatable.",
)
@metric_regex_option
@target_options
@config_option
@click.argument("smoke_argv", nargs=-1, type=click.UNPROCESSED, metavar="[-- SMOKE CMD ...]")
def command(**flags: Any) -> int:
    """Bisect the changes between GOOD and BAD down to the one that made training slow.

    Each trial realizes an in-between state in a sandbox (uv venv, git worktree, journaled
    file swap, per-trial env and compile caches), runs the smoke command (after --; default
    the built-in drafter smoke test) and reads its tok/s. Before the first trial, every
    package version either endpoint needs is looked up in the sources envbisect.yaml names
    (indexes, find_links, index_strategy, offline, pins): what is missing is listed in one
    message (exit 2). Below a culprit it goes on: a repo to its first bad commit and hunk;
    a guilty torch stack to its component (torch itself, triton, the CUDA wheels, ...);
    one guilty package to its first bad release among those the sources hold. Exit 0
    culprit found, 1 no single culprit, 2 bad input, 130 interrupted (resume with
    --resume; clean up with reset).
    """
    from envbisect.model.escape import terminal
    from envbisect.model.paths import check_writable
    from envbisect.model.units import showing
    from envbisect.render import report
    from envbisect.run.options import validate_options

    args = RunFlags(**flags)
    args = replace(args, smoke_argv=command_words(args.smoke_argv, "run"))
    when, options = _options(args)
    if args.print_command:
        return _print_command(options, good_known=when is None)
    validate_options(options)
    # Outputs are checked before the first trial: a typo must not cost a whole run.
    for flag, path in (("--json", args.json_path), ("--report", args.report_path)):
        if path and path != "-":
            check_writable(flag, Path(path))
    if args.report_path and Path(args.report_path).suffix.lower() in (".html", ".htm"):
        from envbisect.render.pictures import require_matplotlib

        require_matplotlib()  # before the first trial: a page needs its pictures
    rec = None
    if when is not None:
        config = options.config or load_config(args.config_path)
        rec, rebuilt = (
            _reconstructed_earlier(options.session_dir, _say)
            if args.resume
            else _reconstruct_good(
                config, (options.transport, options.python), when, args.timeout_s, _say
            )
        )
        options = replace(options, good=rebuilt.absolute())
    _say(
        f"envbisect run: {options.goal.describe()}; smoke: {options.smoke.describe()}; "
        f"session {options.session_dir}"
    )
    # Figures in the unit the command's log prints (a recognized form says it on its first
    # run): every line, table and report of this run.
    with showing(options.smoke.metric.unit if options.smoke.metric else None):
        result = _run_bisect(options, _say)
        if rec is not None:
            result = _with_reconstruction_notes(result, rec, _say)
        click.echo(terminal(report.render_text(result)), nl=False)
        _write_outputs(result, args.json_path, args.report_path)
    return result.exit_code


def _options(args: RunFlags) -> tuple[datetime | None, RunOptions]:
    """``--good-as-of``'s time (or None) and the run the flags ask for; a good state named
    nowhere, or named twice, is a usage error."""
    from envbisect.model.errors import UsageError
    from envbisect.snapshot.when import parse_as_of

    when = parse_as_of(args.good_as_of) if args.good_as_of else None
    if when is not None and args.good:
        raise UsageError("--good and --good-as-of: give one good state")
    config = load_config(args.config_path)
    good_path = Path(args.good) if args.good else config.good
    if good_path is None and when is None:
        raise UsageError(
            "no good state: give --good PATH or --good-as-of WHEN, or set good: in envbisect.yaml"
        )
    transport, py = resolve_target(config, args.python, args.via, args.target_name)
    py = _interpreter(args, transport, py, good_path)
    smoke = smoke_command(
        args.smoke_argv,
        config,
        args.metric_regex,
        no_probe=args.no_probe,
        warmup_lines=args.warmup_lines,
        step_fn=args.step_fn,
        full_exit=args.full_exit,
        direction=args.direction,
        steps=args.steps,
        max_trial_s=args.max_trial_s,
    )
    threshold = resolve_threshold(args.until_ktoks, args.until, config, metric=smoke.metric)
    # With --good-as-of the good path is known once the state is rebuilt.
    options = args.options(config, threshold, good_path or Path(), (transport, py), smoke)
    return when, options


def _print_command(options: RunOptions, *, good_known: bool) -> int:
    """``--print-command``: the good state's whole command line where it is known here,
    else the smoke command as it reaches the target."""
    from envbisect.run.endpoints import good_command_line

    smoke, transport = options.smoke, options.transport
    whole = not smoke.builtin and not transport.layers and good_known
    if whole:
        click.echo(good_command_line(options))
    else:
        click.echo(smoke_command_line(transport, options.python, smoke))
    return 0


def _say(line: str) -> None:
    """One progress line on stderr; it is often tee'd to a file, so it passes the same
    secret rules as the report."""
    from envbisect.agent.redact import redact_text
    from envbisect.model.escape import terminal

    click.echo(terminal(redact_text(line)), err=True)


@dataclass(frozen=True)
class RunFlags:
    """``envbisect run``'s command line as click parsed it: one field per parameter."""

    good: str | None
    good_as_of: str | None
    bad: str | None
    until_ktoks: str | None
    until: str | None
    repeats: int | None
    max_trials: int | None
    timeout_s: float
    on_crash: str
    crash_runs: int
    crash_rate_runs: int
    rate_together: int | None
    hang_after_s: float
    find_all: bool
    recheck_loaded: bool
    cpu_threads: str
    session_dir: str | None
    resume: bool
    fresh: bool
    workers_opt: str | None
    json_path: str | None
    report_path: str | None
    metric_regex: str | None
    warmup_lines: int | None
    no_probe: bool
    step_fn: str | None
    full_exit: bool
    direction: str | None
    steps: int | None
    max_trial_s: float | None
    python: str | None
    via: tuple[str, ...]
    target_name: str | None
    print_command: bool
    config_path: str | None
    smoke_argv: tuple[str, ...]
    trust: tuple[str, ...] = ()
    profile: bool = False

    def options(
        self,
        config: Config,
        threshold: Threshold,
        good: Path,
        target: tuple[Transport, str],
        smoke: SmokeCommand,
    ) -> RunOptions:
        """The run these flags ask for (the workers resolved on ``target``)."""
        from envbisect.model.kernels import ProfileRequest
        from envbisect.run.options import RunOptions
        from envbisect.run.workers import resolve as resolve_workers

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
            crash_rate_runs=self.crash_rate_runs,
            rate_together=self.rate_together,
            hang_after_s=self.hang_after_s,
            find_all=self.find_all,
            recheck_loaded=self.recheck_loaded,
            cpu_threads=self.cpu_threads,
            trust=tuple(Path(p).absolute() for p in self.trust),
            profile=ProfileRequest() if self.profile else None,
        )


def _reconstruct_good(
    config: Config,
    target: tuple[Transport, str],
    when: datetime,
    timeout_s: float,
    say: Callable[[str], None],
) -> tuple[Reconstruction, Path]:
    """The good state rebuilt for ``when``, written to ``manifests_dir``; what it cannot know
    is said before the first trial."""
    from envbisect.snapshot import write_snapshot
    from envbisect.snapshot.reconstruct import snapshot_as_of, summary

    transport, py = target
    rec = snapshot_as_of(config, transport, py, when, label="good", timeout_s=min(timeout_s, 300))
    path = write_snapshot(rec.manifest, None, config)
    assert path is not None
    say(f"good state: {path}")
    for line in summary(rec):
        say(line)
    return rec, path


def _reconstructed_earlier(
    session_dir: Path, say: Callable[[str], None]
) -> tuple[Reconstruction, Path]:
    """On --resume, the good state the session was started with: rebuilding it now could
    read a history that moved on since."""
    from envbisect.model.errors import UsageError
    from envbisect.model.manifest import load
    from envbisect.model.session import Session
    from envbisect.snapshot.reconstruct import Reconstruction

    header = Session(session_dir).header() or {}
    if not header.get("good"):
        raise UsageError(f"{session_dir}: no session to resume (no good state recorded)")
    path = Path(header["good"])
    rec = Reconstruction.from_manifest(load(path))
    say(f"good state: {path} (reconstructed when the session started)")
    return rec, path


def _with_reconstruction_notes(
    result: RunResult, rec: Reconstruction, say: Callable[[str], None]
) -> RunResult:
    """Notes on a reconstructed good state: what it took as today's or cold, and, when the
    good state was not fast, the doubtful facts as the likely reason."""
    from envbisect.snapshot.reconstruct import iso

    doubtful = rec.doubtful()
    notes = [
        f"the good state was reconstructed as of {iso(rec.as_of)}: env vars taken as today's, "
        f"compile caches cold; {len(doubtful)} fact(s) of low or unknown confidence"
    ]
    # Measured and not fast (a crash has its own reason, said by the run).
    if result.outcome in ("not-reproduced", "unfaithful") and result.good_median is not None:
        notes.append(
            "the reconstructed good state was not good: its low-confidence facts are the likely "
            "reason: " + "; ".join(f.describe() for f in doubtful)
        )
    for note in notes:
        say(note)
    return replace(result, notes=(*result.notes, *notes))


def _interpreter(args: RunFlags, transport: Transport, py: str, good: Path | None) -> str:
    """The target interpreter: ``--python`` (or the target's) resolved once, else the one
    the manifests recorded (``envbisect.model.interpreter``)."""
    from envbisect.model import interpreter

    local = not transport.layers
    bad = Path(args.bad) if args.bad else None
    # With --good-as-of the good manifest is not written yet: the bad one tells.
    if args.python is None and args.target_name is None and (good or bad):
        if local:
            py = interpreter.recorded(good or Path(), bad) or py
        else:
            py = _recorded_on_target(transport, bad or good or Path()) or py
    return interpreter.resolve_given(py, local=local)


def _recorded_on_target(transport: Transport, manifest: Path) -> str | None:
    """Through layers: the interpreter ``manifest`` recorded when the target still has it
    (checked there, by running it); UsageError when it is gone; None when none is recorded."""
    import tempfile

    from envbisect.model import interpreter
    from envbisect.model.errors import UsageError

    exe = interpreter.recorded_path(manifest)
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix="envbisect-python-") as logs:
        res = transport.run([exe, "-c", "pass"], timeout_s=60, log_dir=Path(logs), name="python")
    if res.returncode != 0:
        raise UsageError(
            f"no --python given and the interpreter {manifest} recorded ({exe}) does not run "
            f"on the target ({transport.describe()}): give --python PATH"
        )
    return exe


def _run_bisect(options: RunOptions, say: Callable[[str], None]) -> RunResult:
    """``run_bisect`` with Ctrl-C, SIGTERM and SIGHUP latched (``run.interrupt``): each takes
    the path of an interrupt, files restored, session saved, exit 130."""
    from envbisect.run.interrupt import latched
    from envbisect.run.runner import run_bisect

    with latched():
        return run_bisect(options, say)


def _write_outputs(result: RunResult, json_path: str | None, report_path: str | None) -> None:
    """``--json`` (``-``: stdout), ``--report`` and the session's own reports; the pictures
    are drawn once for all of them."""
    from envbisect.model.escape import terminal
    from envbisect.model.paths import atomic_write_text
    from envbisect.render import html, report

    if json_path == "-":
        sys.stdout.write(report.render_json(result))
    elif json_path:
        atomic_write_text(Path(json_path), report.render_json(result))
    page = report_path is not None and Path(report_path).suffix.lower() in (".html", ".htm")
    svgs = html.run_svgs(result) if page else _session_svgs(result)
    if report_path:
        path = Path(report_path)
        if page:
            text = html.run_html(result, svgs or {})
        elif svgs is None:
            text = report.render_markdown(result)
        else:
            text = html.markdown_with_pictures(result, path, svgs)
        atomic_write_text(path, terminal(text))
    _session_reports(result, svgs)


def _can_draw() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def _session_svgs(result: RunResult) -> dict[str, str] | None:
    """The run's pictures when matplotlib is there and draws; None (said once) when not:
    beside a markdown report and in the session they are an extra."""
    from envbisect.render import html

    if not _can_draw():
        return None
    try:
        return html.run_svgs(result)
    except (ImportError, OSError, RuntimeError, ValueError) as exc:
        click.echo(f"note: the session's report is written without pictures ({exc})", err=True)
        return None


def _session_reports(result: RunResult, svgs: dict[str, str] | None) -> None:
    """The session's own ``report.md`` and, with pictures, ``report.html``."""
    from envbisect.model.escape import terminal
    from envbisect.model.paths import atomic_write_text
    from envbisect.render import html, report

    if not result.session.is_dir():
        return
    md = result.session / "report.md"
    if svgs is None:
        atomic_write_text(md, terminal(report.render_markdown(result)))
        return
    atomic_write_text(md, terminal(html.markdown_with_pictures(result, md, svgs)))
    atomic_write_text(result.session / "report.html", html.run_html(result, svgs))


def _cpu_threads(value: str) -> str:
    """``--cpu-threads``: auto, off or a positive number of threads."""
    word = value.strip().lower()
    if word in ("auto", "off") or (word.isdigit() and int(word) > 0):
        return word
    raise click.BadParameter(f"{value!r}: expected auto, off or a number of threads ≥ 1")
