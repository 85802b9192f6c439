"""`envbisect diff`: what changed between two machine states, grouped into bisectable units."""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import TYPE_CHECKING

import click

from envbisect.commands.common import config_option, load_config, resolve_target, target_options
from envbisect.model.errors import UsageError

if TYPE_CHECKING:
    from envbisect.model.trust import Review

FORMATS = ("table", "markdown", "json", "yaml")


@click.command("diff")
@click.argument("good", type=click.Path(dir_okay=False))
@click.argument("bad", type=click.Path(dir_okay=False), required=False)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="table to read, markdown to paste into an issue, json/yaml for programs.",
)
@click.option(
    "--section",
    "sections",
    multiple=True,
    metavar="NAME",
    help="Only these sections (torch-stack, packages, files, git, env, data, caches, probes, "
    "python, system, gpu, torch, meta...); repeatable.",
)
@click.option(
    "--all",
    "include_volatile",
    is_flag=True,
    help="Also show volatile facts (times, host, mtimes, mtime-only cache digests).",
)
@target_options
@config_option
def command(
    good: str,
    bad: str | None,
    fmt: str,
    sections: tuple[str, ...],
    include_volatile: bool,
    python: str | None,
    via: tuple[str, ...],
    target_name: str | None,
    print_command: bool,
    config_path: str | None,
) -> int:
    """Show what differs between manifest GOOD and manifest BAD.

    Without BAD, GOOD is compared with a fresh snapshot of the current state (same
    envbisect.yaml, --python, --via/--target). Exit status like diff(1): 0 identical,
    1 different, 2 error.
    """
    from envbisect.diff import diff_manifests
    from envbisect.model import manifest
    from envbisect.model.escape import terminal
    from envbisect.model.guard import indexes
    from envbisect.model.trust import diff_review
    from envbisect.render.diff import render

    good_manifest = manifest.load(good)
    if bad is not None:
        if print_command:
            raise UsageError("--print-command prints the snapshot command: give only GOOD")
        bad_manifest = manifest.load(bad)
    else:
        from envbisect.snapshot import take_snapshot

        config = load_config(config_path)
        transport, target_python = resolve_target(config, python, via, target_name)
        if print_command:
            click.echo(shlex.join(transport.compose([target_python, "-"])))
            return 0
        where = (
            f"{target_python} via {transport.describe()}" if via or target_name else target_python
        )
        click.echo(f"envbisect: comparing with a fresh snapshot of {where}", err=True)
        bad_manifest = take_snapshot(config, transport, target_python, label="now")
    data_map = dict(load_config(config_path).data_map) if bad is not None else config.data_map
    result = diff_manifests(
        good_manifest, bad_manifest, include_volatile=include_volatile, data_map=data_map
    )
    result = result.select(sections)
    color = fmt == "table" and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    review = diff_review(
        good_manifest,
        bad_manifest,
        result.changes,
        indexes(load_config(config_path)),
        own=() if bad is not None else (bad_manifest,),
    )
    text = with_review(render(result, fmt, color=color), fmt, review)
    click.echo(terminal(text, keep_colors=color), nl=False, color=color)
    return 0 if result.identical else 1


def with_review(text: str, fmt: str, review: Review) -> str:
    """``text`` with what can run code and where packages come from: a block after a
    table or markdown, a ``review`` key in json and yaml."""
    import yaml

    from envbisect.agent.redact import redact_text, redact_tree

    if not review.risks and not review.sources:
        return text
    if fmt == "json":
        doc = json.loads(text)
        doc["review"] = redact_tree(review.as_dict())
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "yaml":
        doc = yaml.safe_load(text)
        doc["review"] = redact_tree(review.as_dict())
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    block = redact_text("\n".join(review.lines())) + "\n"
    return text + ("\n```\n" + block + "```\n" if fmt == "markdown" else "\n" + block)
