"""`envbisect snapshot`: record the facts of a machine state into a manifest."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from envbisect.commands.common import (
    composed_command,
    config_option,
    load_config,
    resolve_target,
    seconds,
    target_options,
)


@click.command("snapshot")
@click.option("--label", default=None, help="Manifest label (default: 'label:' in config).")
@click.option("--repo", "repos", multiple=True, metavar="PATH", help="Git repo to record.")
@click.option("--file", "files", multiple=True, metavar="GLOB", help="Files to hash.")
@click.option("--data", "data", multiple=True, metavar="PATH", help="Dataset to fingerprint.")
@click.option("--probe", "probes", multiple=True, metavar="DOTTED", help="Function to probe.")
@click.option("--env", "env", multiple=True, metavar="NAME", help="Extra env var to record.")
@click.option(
    "-o",
    "--output",
    default=None,
    metavar="PATH",
    help="Where to write the manifest; '-' for stdout "
    "(default: <manifests_dir>/<label>-<UTC time>.yaml).",
)
@click.option(
    "--timeout",
    "timeout_s",
    default=60.0,
    callback=seconds,
    show_default=True,
    help="Seconds the collector may take in the target.",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the collector's full stdout/stderr here.",
)
@click.option(
    "--as-of",
    "as_of",
    default=None,
    metavar="WHEN",
    help="Reconstruct the state as it most probably was at WHEN ('2026-11-20 09:00', local "
    "time; or ISO 8601 with a zone) from what the machine still holds; every rebuilt fact "
    "carries its evidence and confidence.",
)
@click.option(
    "--keep-caches",
    "keep_caches",
    default=None,
    metavar="SIZE|off",
    help="Keep each compile cache's content (inductor, triton) in the blob store, "
    "content-addressed, when it holds at most SIZE (default: keep_caches: in envbisect.yaml; "
    "else 512MiB where keep_blobs is on, none where it is off): a run can then rebuild this "
    "state's warm cache exactly after the cache was cleared. A larger cache is not kept, and "
    "the summary says so and how to raise the cap; 'off' keeps none.",
)
@target_options
@config_option
def command(
    label: str | None,
    repos: tuple[str, ...],
    files: tuple[str, ...],
    data: tuple[str, ...],
    probes: tuple[str, ...],
    env: tuple[str, ...],
    output: str | None,
    timeout_s: float,
    log_dir: Path | None,
    as_of: str | None,
    keep_caches: str | None,
    python: str | None,
    via: tuple[str, ...],
    target_name: str | None,
    print_command: bool,
    config_path: str | None,
) -> int:
    """Record the facts of a machine state (packages, torch build, GPU, git, files,
    data, compile caches, env, probes) into a manifest.

    The collector runs inside the target Python (--python, through any --via layers) and
    never imports torch. A summary goes to stderr; the manifest path to stdout.
    """
    from envbisect.snapshot import summary, take_snapshot, write_snapshot
    from envbisect.snapshot.reconstruct import snapshot_as_of
    from envbisect.snapshot.reconstruct import summary as reconstructed_summary
    from envbisect.snapshot.when import parse_as_of

    when = parse_as_of(as_of) if as_of is not None else None  # a bad date costs nothing
    if output and output != "-":
        from envbisect.model.paths import refuse_not_a_file

        refuse_not_a_file("-o", Path(output))  # before the snapshot: a typo costs nothing
    config = load_config(config_path).with_overrides(
        repos=repos, files=files, data=data, probes=probes, env=env
    )
    if keep_caches is not None:
        config = replace(config, keep_caches=_cache_cap(keep_caches))
    transport, target_python = resolve_target(config, python, via, target_name)
    if print_command:
        click.echo(composed_command(transport, target_python))
        return 0
    if when is None:
        manifest = take_snapshot(
            config, transport, target_python, label=label, log_dir=log_dir, timeout_s=timeout_s
        )
        lines = summary(manifest)
    else:
        rec = snapshot_as_of(
            config,
            transport,
            target_python,
            when,
            label=label,
            log_dir=log_dir,
            timeout_s=timeout_s,
        )
        manifest, lines = rec.manifest, reconstructed_summary(rec)
    path = write_snapshot(manifest, output, config)
    for line in lines:
        click.echo(line, err=True)
    if path is not None:
        click.echo(str(path))
    return 0


def _cache_cap(text: str) -> int | None:
    """``--keep-caches``: a size in bytes, or None for 'off'."""
    from envbisect.model.config import parse_size

    if text.strip().lower() in ("off", "no", "false", "0"):
        return None
    size = parse_size(text)
    if not size:
        raise click.UsageError(f"--keep-caches: {text!r} is not a size (512MiB, 2GiB) or 'off'")
    return size
