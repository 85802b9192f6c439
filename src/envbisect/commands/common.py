"""Options shared by several verbs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


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


def resolve_target(
    config: Any, python: str | None, via: tuple[str, ...], target_name: str | None
) -> tuple[Any, str]:
    """The Transport and target python for ``--python/--via/--target``.

    Placeholder: local only. The transport work replaces this body (layer parsing, targets
    from envbisect.yaml, validation).
    """
    from envbisect.transport import Transport

    return Transport(), python or "python3"
