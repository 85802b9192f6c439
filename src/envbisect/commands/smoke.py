"""`envbisect smoke`: run the built-in DFlash drafter training smoke test once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from envbisect.commands.common import (
    config_option,
    json_output_options,
    resolve_target,
    seconds,
    target_options,
)
from envbisect.run.smoke import ATTN_BACKENDS, PRESETS


def _load_config(config_path: str | None) -> Any:
    """The envbisect.yaml config, or None where the config module is not available."""
    try:
        from envbisect.model.config import Config
    except ImportError:
        return None
    return Config.load(Path(config_path) if config_path else None)


@click.command("smoke")
@click.option("--preset", type=click.Choice(PRESETS), default=None, help="Default: auto.")
@click.option("--attn", type=click.Choice(ATTN_BACKENDS), default=None, help="Default: auto.")
@click.option("--compile/--no-compile", "compile_", default=None, help="Default: on for CUDA.")
@click.option("--vary-shapes", is_flag=True, default=None, help="New shapes every step.")
@click.option("--data", metavar="PATH", default=None, help="JSONL dataset (on the target).")
@click.option(
    "--drafter-threads",
    type=int,
    default=None,
    help="Drafters stepping at once in threads of one process, each building its block "
    "mask every step (the field's FX-flag race needs 2 or more).",
)
@click.option(
    "--compile-unit",
    type=click.Choice(["auto", "model", "layer", "flex"]),
    default=None,
    help="What torch.compile wraps: the whole drafter, each decoder layer (one graph reused: "
    "the fastest cold start) or only flex_attention and the loss (a model file's "
    "torch.compile(flex_attention)). auto (default): flex with 2+ drafter threads, else layer.",
)
@click.option(
    "--mask-build",
    type=click.Choice(["step", "locked", "once"]),
    default=None,
    help="When block masks are built: every step (default), every step under one lock, or "
    "once before the threads start.",
)
@click.option(
    "--nested-fx",
    type=click.Choice(["error", "unoptimized", "force"]),
    default=None,
    help="Dynamo's check on a call made while a thread FX-traces: torch's error (default), "
    "error_on_nested_fx_trace=False (runs unoptimized), force_compile_during_fx_trace=True.",
)
@click.option(
    "--flex-decoding",
    type=click.Choice(["off", "auto"]),
    default=None,
    help="inductor's flex-decoding kernel for a query shorter than 128 rows: off (default: "
    "the main flex kernel always; torch 2.11 cannot compile the decoding kernel once varying "
    "data lengths make the query length dynamic: NoValidChoicesError) or auto (torch's choice).",
)
@click.option(
    "--patch-module",
    metavar="PATH",
    default=None,
    help="A model file (on the target) imported before the drafters are built, so its "
    "monkey-patches (is_fx_symbolic_tracing = lambda: False) are in effect.",
)
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=None,
    help="Timed windows after one warm-up, each a sample (default 1).",
)
@click.option(
    "--cpu-threads",
    type=click.IntRange(min=1),
    default=None,
    help="torch CPU threads on a CPU device (default: the cores free at start; tiny preset 1).",
)
@click.option("--device", default=None, help="auto, cpu, cuda, cuda:N.")
@click.option("--steps", type=int, default=None, help="Timed steps.")
@click.option("--warmup", type=int, default=None, help="Untimed warm-up steps.")
@click.option("--batch", type=int, default=None)
@click.option("--seq-len", type=int, default=None)
@click.option("--anchors", type=int, default=None)
@click.option("--layers", type=int, default=None)
@click.option("--hidden", type=int, default=None)
@click.option("--seed", type=int, default=None)
@click.option(
    "--env", "env_pairs", multiple=True, metavar="NAME=VALUE", help="Set in the target; repeatable."
)
@click.option("--timeout", "timeout_s", default=900.0, callback=seconds)
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@json_output_options
@target_options
@config_option
def command(
    compile_: bool | None,
    env_pairs: tuple[str, ...],
    timeout_s: float,
    log_dir: Path | None,
    json_path: str | None,
    fmt: str,
    python: str | None,
    via: tuple[str, ...],
    target_name: str | None,
    print_command: bool,
    config_path: str | None,
    # the drafter's knobs (--preset ... --seed): passed on to it by name, unset ones left out
    **drafter_flags: Any,
) -> int:
    """Run the built-in DFlash drafter training smoke test once, in the target Python.

    Prints tok/s, step time, warm-up, MFU (on GPU) and the facts that explain regressions
    (compile, recompiles, flex fallback, memory). Exit 0 ok, 1 the run failed (crash, OOM),
    2 bad input.
    """
    from envbisect.commands.common import check_json_path, composed_command, emit_json
    from envbisect.run.smoke import build_params, parse_env, run_smoke, summary_lines

    config = _load_config(config_path)
    transport, target_python = resolve_target(config, python, via, target_name)
    env = parse_env(env_pairs)
    check_json_path(json_path)
    if print_command:
        click.echo(composed_command(transport.with_env(env), target_python))
        return 0
    params = build_params(compile=compile_, **drafter_flags)
    outcome = run_smoke(
        transport, target_python, params, timeout_s=timeout_s, log_dir=log_dir, env=env
    )
    if not emit_json(json.dumps(outcome.result, sort_keys=True, indent=2), json_path, fmt):
        click.echo("\n".join(summary_lines(outcome)))
    return outcome.exit_code
