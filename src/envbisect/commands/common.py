"""Options shared by several verbs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from envbisect.errors import TransportError

if TYPE_CHECKING:
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


def resolve_target(
    config: Any, python: str | None, via: Sequence[str], target_name: str | None
) -> tuple[Transport, str]:
    """The Transport and target python for ``--python/--via/--target``.

    ``--via`` layers (outermost first) and ``--target NAME`` (a chain under ``targets:`` in
    envbisect.yaml) are mutually exclusive. ``--python`` wins over the target's ``python``;
    the default is ``python3`` on the target's PATH. Every layer is checked before anything
    runs (TransportError naming the layer).
    """
    from envbisect.errors import ConfigError, UsageError
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


def composed_command(transport: Transport, python: str, argv: Sequence[str] = ("-",)) -> str:
    """What ``--print-command`` prints: the exact command line that runs ``python argv...``
    through the chain, safe to paste into bash or zsh (the program itself goes on stdin)."""
    return transport.command_line([python, *argv])
