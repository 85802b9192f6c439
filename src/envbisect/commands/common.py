"""Options shared by several verbs."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from envbisect.model.errors import TransportError

if TYPE_CHECKING:
    from envbisect.model.config import Config
    from envbisect.model.metric import MetricSpec, Threshold
    from envbisect.run.launch import SmokeCommand
    from envbisect.transport import Transport

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_PYTHON = "python3"


def target_options(func: F) -> F:
    """``--python``, ``--via`` (repeatable), ``--target``, ``--print-command``."""
    func = click.option(
        "--print-command",
        is_flag=True,
        help="Print the exact composed command (safe to paste into bash or zsh) and exit.",
    )(func)
    func = click.option(
        "--target",
        "target_name",
        metavar="NAME",
        help="A layer chain named under 'targets:' in envbisect.yaml.",
    )(func)
    func = click.option(
        "--via",
        "via",
        multiple=True,
        metavar="LAYER",
        help="A layer in front of the target, outermost first; repeatable. "
        "E.g. --via 'ssh root@10.1.2.6' --via 'pct exec 200 --'.",
    )(func)
    func = click.option(
        "--python",
        "python",
        metavar="PATH",
        default=None,
        help="The target Python (default: python3 on the target's PATH).",
    )(func)
    return func


def config_option(func: F) -> F:
    """``--config PATH``."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        default=None,
        help="envbisect.yaml to use (default: found by walking up from the current directory).",
    )(func)


def load_config(config_path: str | None) -> Config:
    """The envbisect.yaml given by ``--config``, else the one found from the current directory."""
    from envbisect.model.config import Config

    return Config.load(Path(config_path) if config_path else None)


def session_option(func: F) -> F:
    """``--session DIR``."""
    return click.option(
        "--session",
        "session_dir",
        metavar="DIR",
        help="Session directory (default .envbisect/session).",
    )(func)


def session_root(config: Config, session_dir: str | None) -> Path:
    """The ``--session`` directory, by default ``.envbisect/session`` beside envbisect.yaml."""
    return Path(session_dir) if session_dir else config.root / ".envbisect" / "session"


def at_once(ctx: click.Context, param: click.Parameter, value: Any) -> int | None:
    """Callback of ``--rate-runs-at-once``: ``auto`` (None) or a whole number of at least 1."""
    from envbisect.model.errors import UsageError

    text = str(value).strip()
    if text == "auto":
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--rate-runs-at-once {value!r}: expected auto or a whole number >= 1")
    return int(text)


def seconds(ctx: click.Context, param: click.Parameter, value: Any) -> float:
    """Callback of every ``--timeout``: a positive, finite number of seconds, else one
    UsageError line (nan, inf, 0 and negatives would never end a run or end it at once)."""
    from envbisect.model.errors import UsageError

    name = param.opts[0] if param.opts else "--timeout"
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} {value!r}: expected a number of seconds") from None
    if not math.isfinite(number) or number <= 0:
        raise UsageError(f"{name} {value}: must be a positive, finite number of seconds")
    return number


def timeout_option(func: F) -> F:
    """``--timeout SECONDS`` of one smoke run (check, run)."""
    return click.option(
        "--timeout",
        "timeout_s",
        default=600.0,
        show_default=True,
        callback=seconds,
        help="Seconds per run.",
    )(func)


def hang_seconds(ctx: click.Context, param: click.Parameter, value: Any) -> float:
    """Callback of ``--hang-after``: 0 or "off" (off), else as ``--timeout``."""
    if str(value).strip().lower() in ("0", "0.0", "off"):
        return 0.0
    return seconds(ctx, param, value)


def hang_option(func: F) -> F:
    """``--hang-after SECONDS`` of each run of the command (run)."""
    return click.option(
        "--hang-after",
        "hang_after_s",
        default=120.0,
        show_default=True,
        callback=hang_seconds,
        help="End a run of your command whose processes used no CPU time for this many "
        "seconds, as hung (threads waiting on each other for good: the field's own threaded "
        "script deadlocked compiling in threads), instead of waiting for --timeout; its "
        "every thread's stack ends its stderr log. It counts as a crash. A training process "
        "that works uses a core (a compile, the CUDA driver waiting on the GPU); one that "
        "may wait that long doing nothing (a slow network read) needs a longer one. 0 turns "
        "it off. Local targets only.",
    )(func)


def metric_regex_option(func: F) -> F:
    """``--metric-regex REGEX``, ``--warmup-lines W``, ``--no-probe``, ``--step-fn`` and
    ``--full-exit``."""
    func = click.option(
        "--full-exit",
        "full_exit",
        is_flag=True,
        help="Let each run's program finish its own exit (its atexit handlers, module "
        "teardown). By default the probe ends a Python command once its main body and "
        "threads are done and its output and facts are in: a trial needs no more, and "
        "torch's compile workers alone can take 10 s to shut down. Give this when the "
        "figure is written by an atexit handler.",
    )(func)
    func = click.option(
        "--step-fn",
        "step_fn",
        metavar="MODULE:QUALNAME",
        default=None,
        help="The probe times each return of this function as one training step (e.g. "
        "train:train_step, __main__:step); default: each optimizer step() ends a step.",
    )(func)
    func = click.option(
        "--no-probe",
        "no_probe",
        is_flag=True,
        help="Run a Python command as typed, without the probe that records compile, "
        "flex_attention, FX-flag and memory facts for the report.",
    )(func)
    func = click.option(
        "--warmup-lines",
        "warmup_lines",
        type=click.IntRange(min=0),
        default=None,
        help="With --metric-regex: each matched line is a sample after the first W "
        "(default: the first third are warm-up).",
    )(func)
    func = click.option(
        "--max-trial-s",
        "max_trial_s",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="End each run of a Python command after S seconds of its program (it exits 0; "
        "its steps so far are its figure).",
    )(func)
    func = click.option(
        "--steps",
        "steps",
        type=click.IntRange(min=2),
        default=None,
        help="End each run of a Python command after N timed training steps. By default a "
        "long run ends once its rate is known: 20 steps spanning 1 s after a third as warm-up, "
        "none of them compiling, their median within ±3%, and 6 lines of the log's figure shown "
        "(--full-exit: every run whole).",
    )(func)
    func = click.option(
        "--lower-is-better",
        "direction",
        flag_value="lower",
        default=None,
        help="The --metric-regex figure is a cost (a time, a loss): lower is better.",
    )(func)
    func = click.option(
        "--higher-is-better",
        "direction",
        flag_value="higher",
        help="The --metric-regex figure is a rate: higher is better.",
    )(func)
    return click.option(
        "--metric-regex",
        metavar="REGEX",
        help="Read the figure from the output with this regex: its group is the number, the "
        "text right after it the unit, which says which way is better: '([0-9.]+) Ktok/s', "
        "'([0-9.]+)it/s', 'samples/s' (higher), 'time ([0-9.]+)ms', '([0-9.]+)s/it' (lower). "
        "Without it, common logs are read as they are (a tok/s line, Hugging Face "
        "Trainer's train_samples_per_second, tqdm's it/s, nanoGPT's 'time …ms'), else the "
        "probe's timed steps (steps/s).",
    )(func)


def threshold_options(func: F) -> F:
    """``--until-ktoks N`` and ``--until N|P%`` (run, check)."""
    func = click.option(
        "--until",
        "until",
        metavar="N|P%",
        help="Good means at least this: a throughput (as --until-ktoks) or a percentage of "
        "the good state's measured speed, e.g. 70%.",
    )(func)
    return click.option(
        "--until-ktoks",
        "until_ktoks",
        metavar="N",
        help="Good means at least this many tokens/s: 12000, 12k, 12.8k or 12.8 Ktok/s; a "
        "bare number below 1,000 is refused as ambiguous (write 12.8k, or 15tok/s).",
    )(func)


def resolve_threshold(
    until_ktoks: str | None,
    until: str | None,
    config: Config,
    *,
    relative: bool = True,
    metric: MetricSpec | None = None,
) -> Threshold:
    """The threshold and where it came from: --until-ktoks / --until, else envbisect.yaml's
    ``threshold:``, else none (``Threshold()``: the engine's default); a figure for a
    ``metric`` read in another unit than tokens is taken in that unit (``--until 150``
    with ``time ([0-9.]+)ms``: 150 ms)."""
    from envbisect.model.errors import UsageError
    from envbisect.model.metric import Threshold, parse_ktoks

    if until_ktoks is not None and until is not None:
        raise UsageError("--until-ktoks and --until exclude each other: give one")
    if until_ktoks is not None:
        t = Threshold(value=parse_ktoks(until_ktoks), source=f"--until-ktoks {until_ktoks}")
    elif until is not None:
        unit = metric.unit if metric is not None else None
        t = Threshold.parse(until, f"--until {until}", "--until", unit)
    else:
        t = getattr(config, "threshold", None) or Threshold()
    if t.fraction is not None and not relative:
        raise UsageError(f"{t.source}: a percentage needs a measured good state; give a throughput")
    if metric is not None:
        t = t.in_unit(metric.unit, "--until")
    return t


_STEP_FN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*$")


def smoke_command(
    smoke_argv: Sequence[str],
    config: Config,
    metric_regex: str | None,
    *,
    no_probe: bool = False,
    warmup_lines: int | None = None,
    step_fn: str | None = None,
    full_exit: bool = False,
    direction: str | None = None,
    steps: int | None = None,
    max_trial_s: float | None = None,
) -> SmokeCommand:
    """The command after ``--``, else envbisect.yaml's ``smoke:``, else the built-in drafter;
    its tok/s read with ``--metric-regex`` when given (a sample per matched line after the
    first ``warmup_lines``); a Python command under the probe unless ``no_probe``, its
    training steps timed by each return of ``step_fn`` when given, and the process ended
    after the program unless ``full_exit``."""
    import dataclasses

    from envbisect.model.errors import UsageError
    from envbisect.model.metric import MetricSpec
    from envbisect.run.launch import SmokeCommand

    regex = metric_regex or getattr(config, "metric_regex", None)
    if warmup_lines is not None and not regex:
        raise UsageError("--warmup-lines counts lines matched by --metric-regex: give one")
    if direction is not None and not regex:
        raise UsageError(
            f"--{direction}-is-better says which way a --metric-regex figure is better: "
            "give one (a recognized log form knows its own way)"
        )
    spec = MetricSpec.parse(regex, direction) if regex else None
    if spec is not None and warmup_lines is not None:
        spec = dataclasses.replace(spec, warmup=warmup_lines)
    argv = tuple(smoke_argv) or tuple(config.smoke or ())
    if step_fn is not None:
        if not _STEP_FN.match(step_fn):
            raise UsageError(
                f"--step-fn {step_fn!r}: expected MODULE:QUALNAME, e.g. train:train_step"
            )
        if no_probe or not argv:
            raise UsageError(
                "--step-fn is timed by the probe inside a Python command: give the command "
                "after -- and drop --no-probe"
            )
    if (steps or max_trial_s) and (no_probe or not argv or full_exit):
        raise UsageError(
            "--steps and --max-trial-s end a Python command's run through the probe: give "
            "the command after --, and drop --no-probe and --full-exit"
        )
    return SmokeCommand(
        argv,
        spec,
        probe=not no_probe,
        step_fn=step_fn,
        full_exit=full_exit,
        steps=steps,
        max_trial_s=max_trial_s,
    )


def smoke_command_line(transport: Transport, python: str, smoke: SmokeCommand) -> str:
    """What ``--print-command`` of check and run prints: the built-in drafter run by
    ``python``, or the user's smoke command, through the chain."""
    if smoke.builtin:
        return composed_command(transport, python)
    return transport.command_line(list(smoke.argv))


def resolve_target(
    config: Config, python: str | None, via: Sequence[str], target_name: str | None
) -> tuple[Transport, str]:
    """The Transport and target python for ``--python/--via/--target``.

    ``--via`` layers (outermost first) and ``--target NAME`` (a chain under ``targets:`` in
    envbisect.yaml) are mutually exclusive. ``--python`` wins over the target's ``python``;
    the default is ``python3`` on the target's PATH. Every layer is checked before anything
    runs (TransportError naming the layer).
    """
    from envbisect.model.errors import ConfigError, UsageError
    from envbisect.transport import Transport

    if via and target_name:
        raise UsageError("--via and --target are mutually exclusive: give one or the other")
    if target_name is None:
        return Transport.from_specs(tuple(via)), python or DEFAULT_PYTHON
    targets = getattr(config, "targets", None) or {}
    where = getattr(config, "path", None) or "envbisect.yaml"
    if target_name not in targets:
        known = ", ".join(sorted(str(name) for name in targets)) or "none defined"
        raise ConfigError(f"{where}: no target named {target_name!r} under 'targets:' ({known})")
    spec = targets[target_name]
    if isinstance(spec, Mapping):
        target_via, target_python = spec.get("via") or (), spec.get("python")
    else:
        target_via, target_python = getattr(spec, "via", ()), getattr(spec, "python", None)
    try:
        transport = Transport.from_specs(tuple(target_via))
    except TransportError as exc:
        raise ConfigError(f"{where}: targets.{target_name}.via: {exc}") from None
    return transport, python or target_python or DEFAULT_PYTHON


def recorded_interpreter(
    transport: Transport, py: str, manifest: str | None, config: Config
) -> str:
    """The interpreter of a command that names no ``--python``/``--target``: on a local
    target the one ``manifest`` (else envbisect.yaml's ``good:``) recorded, like ``run``;
    else ``py``; resolved once where typed (``envbisect.model.interpreter``)."""
    from envbisect.model import interpreter
    from envbisect.model.errors import UsageError

    local = not transport.layers
    if manifest and not local:
        raise UsageError(
            "--manifest picks the interpreter it recorded on this machine; through --via "
            "give the target's with --python"
        )
    path = Path(manifest) if manifest else getattr(config, "good", None)
    if local and path is not None:
        what = f"the manifest {path}" if manifest else f"the good manifest ({path})"
        py = interpreter.recorded_in(path, what) or py
    return interpreter.resolve_given(py, local=local)


def json_output_options(func: F) -> F:
    """``--json [PATH]`` (one spelling with run's ``--json PATH``) and the older
    ``--format text|json``, which stays."""
    func = click.option(
        "--format",
        "fmt",
        type=click.Choice(["text", "json"]),
        default="text",
        help="text, or json: the same as --json alone.",
    )(func)
    return click.option(
        "--json",
        "json_path",
        metavar="[PATH]",
        is_flag=False,
        flag_value="-",
        default=None,
        help="Write the result as JSON to PATH; alone or '-': to stdout, instead of the text.",
    )(func)


def check_json_path(json_path: str | None) -> None:
    """A ``--json PATH`` that cannot be written is said before anything runs."""
    from envbisect.model.argvmap import PYTHON_NAME
    from envbisect.model.errors import UsageError
    from envbisect.model.paths import check_writable

    if json_path and PYTHON_NAME.fullmatch(json_path):
        # ``--json python s.py``: the interpreter was taken for the file to write.
        raise UsageError(
            f"--json {json_path}: that is the command, not a file; write --json -- "
            f"{json_path} ... (JSON on stdout) or --json FILE -- {json_path} ..."
        )
    if json_path and json_path != "-":
        check_writable("--json", Path(json_path))


def emit_json(document: str, json_path: str | None, fmt: str) -> bool:
    """``--json PATH`` written; True when the JSON went to stdout in place of the text."""
    from envbisect.model.paths import atomic_write_text

    if json_path and json_path != "-":
        atomic_write_text(Path(json_path), document + "\n")
    if fmt == "json" or json_path == "-":
        click.echo(document)
        return True
    return False


# What an option a verb does not have most likely meant there.
_OPTION_HINTS = {
    "--format": "machine-readable output is --json PATH ('-': stdout)",
    "--json": "only run and probe write JSON (--json PATH)",
}


def command_words(argv: Sequence[str], verb: str) -> tuple[str, ...]:
    """The command after ``--``; UsageError when its first word is an option this verb does
    not know (click hands unknown options over as the command's words, and no command's
    program starts with ``-``)."""
    from envbisect.model.errors import UsageError

    if argv and argv[0].startswith("-"):
        name = argv[0].split("=", 1)[0]
        hint = _OPTION_HINTS.get(name)
        raise UsageError(
            f"{verb} has no option {name}"
            + (f": {hint}" if hint else "")
            + "; the command to run goes after --"
        )
    return tuple(argv)


def composed_command(transport: Transport, python: str, argv: Sequence[str] = ("-",)) -> str:
    """What ``--print-command`` prints: the exact command line that runs ``python argv...``
    through the chain, safe to paste into bash or zsh (the program itself goes on stdin)."""
    return transport.command_line([python, *argv])
