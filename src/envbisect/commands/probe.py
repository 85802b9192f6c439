"""`envbisect probe`: run a Python command once under the probe and print its facts."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import click

from envbisect.commands.common import (
    check_json_path,
    command_words,
    config_option,
    emit_json,
    json_output_options,
    load_config,
    resolve_target,
    target_options,
    timeout_option,
)


@click.command("probe", context_settings={"ignore_unknown_options": True})
@json_output_options
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option(
    "--profile",
    "profile",
    is_flag=True,
    help="Run a few training steps under torch.profiler (a step ends when an optimizer's "
    "step() returns); print the top kernels and ops, keep the Chrome trace in the log "
    "directory.",
)
@click.option(
    "--profile-steps",
    type=click.IntRange(1, 20),
    default=3,
    show_default=True,
    help="Steps profiled.",
)
@click.option(
    "--profile-skip",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Warm-up steps before the profiler starts.",
)
@timeout_option
@target_options
@config_option
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD ...")
def command(
    json_path: str | None,
    fmt: str,
    log_dir: Path | None,
    profile: bool,
    profile_steps: int,
    profile_skip: int,
    timeout_s: float,
    python: str | None,
    via: tuple[str, ...],
    target_name: str | None,
    print_command: bool,
    config_path: str | None,
    argv: tuple[str, ...],
) -> int:
    """Run CMD (python train.py ..., python -m pkg ..., torchrun ...) once under the probe
    and print what torch.compile, flex_attention, the FX tracing flag, threads, CUDA memory
    and warnings did. The program's output is kept in the log directory. Exit status: the
    program's (0 when it succeeded, 1 otherwise). --json [PATH] writes the facts as JSON,
    as run's --json does (--format json: the same on stdout).
    """
    from envbisect.model.facts import describe
    from envbisect.model.kernels import ProfileRequest
    from envbisect.run.probed import STACKS_NOTE, left_stacks, probe_command, shown

    argv = command_words(argv, "probe")
    if python is not None and argv and re.fullmatch(r"python(\d+(\.\d+)*)?", argv[0]):
        argv = (python, *argv[1:])  # --python X -- python train.py: X runs it
    config = load_config(config_path)
    check_json_path(json_path)
    transport, py = resolve_target(config, python, via, target_name)
    if print_command:
        from envbisect.run.probed import wrap

        click.echo(" ".join(shown(transport.compose(list(wrap(argv, py).argv)))))
        return 0
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="envbisect-probe-"))
    request = ProfileRequest(profile_steps, profile_skip) if profile else None
    run = probe_command(
        argv, transport=transport, python=py, timeout_s=timeout_s, log_dir=log_dir, profile=request
    )
    from envbisect.agent.redact import redact_tree

    # As run's: a secret typed on the command line (--hf-token hf_...) is never written.
    document = json.dumps(redact_tree(run.as_dict()), indent=2, sort_keys=True)
    if not emit_json(document, json_path, fmt):
        lines = describe(run.facts) if run.facts else ["no facts came back (see the logs)"]
        if profile and run.facts:
            lines += _profile_lines(run.facts)
        if run.timed_out:
            lines.append(f"timed out after {timeout_s:g} s")
            stderr = log_dir / "probe.stderr"
            if stderr.is_file() and left_stacks(stderr.read_bytes()):
                lines.append(f"  {STACKS_NOTE}")
        click.echo("\n".join([*lines, f"program output: {log_dir}/probe.stdout, probe.stderr"]))
    return 0 if run.exit_status == 0 and not run.timed_out else 1


def _profile_lines(facts: dict[str, object]) -> list[str]:
    """The profiled steps' table, or the one line saying why there is none."""
    from envbisect.model.kernels import ProfileTable
    from envbisect.render.kernels import table_lines

    try:
        return table_lines(ProfileTable.from_facts(facts))
    except ValueError as exc:
        return [f"profile: {exc}"]
