"""Host side of the agent protocol: build the program sent on stdin, read its frame back.

A bundle is one Python script that registers the needed envbisect modules from their source
text (so the target needs nothing installed), opens the channel, calls ``main(params)`` of
the program module and emits the returned dict. A module that imports other envbisect agent
modules names them in ``AGENT_REQUIRES``; they are registered before it. Parameters are
embedded as JSON literals: nothing but ``python3 -`` ever appears on a command line, so no
layer can mangle them.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbisect.model.errors import TransportError

_LOADER = """\
import json as _json, sys as _sys, types as _types
def _envbisect_register(name, source):
    parts = name.split(".")
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        if pkg not in _sys.modules or not hasattr(_sys.modules[pkg], "__envbisect_bundle__"):
            m = _types.ModuleType(pkg)
            m.__path__ = []
            m.__envbisect_bundle__ = True
            _sys.modules[pkg] = m
    mod = _types.ModuleType(name)
    mod.__file__ = "<envbisect:" + name + ">"
    mod.__envbisect_bundle__ = True
    _sys.modules[name] = mod
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    return mod
"""

_RUN = """\
for _name in _CHANNEL_ORDER:
    _envbisect_register(_name, _SOURCES[_name])
_ch = _envbisect_register("envbisect.agent.channel", _SOURCES["envbisect.agent.channel"])
_ch.open_channel(_NONCE, _DEADLINE)
try:
    # Registering runs each module's top level: an import the target lacks must come back
    # in the frame too, not as a traceback on stderr only.
    for _name in _ORDER:
        _main = _ch if _name == "envbisect.agent.channel" else _envbisect_register(
            _name, _SOURCES[_name]
        )
    _result = _main.main(_PARAMS)
except BaseException as _exc:  # the caller must learn why, in the frame, not as lost text
    import traceback as _tb
    _tb.print_exc()
    _result = {"__agent_error__": type(_exc).__name__ + ": " + str(_exc)}
_ch.emit(_result)
_sys.stderr.flush()
"""


_REQUIRES = re.compile(r"^AGENT_REQUIRES = (\([^)]*\))", re.MULTILINE)


def _requires(name: str) -> list[str]:
    """``name``'s ``AGENT_REQUIRES``, theirs first, each once. Read from the source text: an
    agent module (the drafter imports torch) is never imported here."""
    found = _REQUIRES.search(_module_source(name))
    order: list[str] = []
    for dep in ast.literal_eval(found.group(1)) if found else ():
        for sub in [*_requires(dep), dep]:
            if sub not in order:
                order.append(sub)
    return order


def _module_source(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise TransportError(f"agent module {name} not found in this installation")
    return Path(spec.origin).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Bundle:
    """A program ready to send on stdin, and the nonce its frame will carry."""

    source: bytes
    nonce: str


def build_bundle(
    module: str,
    params: dict[str, Any],
    *,
    deadline_s: float | None = None,
    extra_modules: tuple[str, ...] = (),
) -> Bundle:
    """Bundle ``module`` (whose ``main(params) -> dict`` is called) with the channel."""
    nonce = secrets.token_hex(8)
    order: list[str] = []
    for name in (*extra_modules, module):
        for sub in [*_requires(name), name]:
            if sub not in order:
                order.append(sub)
    # The channel opens before anything else runs: what it imports is registered first.
    channel_order = _requires("envbisect.agent.channel")
    order = [name for name in order if name not in channel_order]
    sources = {"envbisect.agent.channel": _module_source("envbisect.agent.channel")}
    for name in [*channel_order, *order]:
        sources[name] = _module_source(name)
    text = "\n".join(
        [
            _LOADER,
            f"_SOURCES = {sources!r}",
            f"_CHANNEL_ORDER = {channel_order!r}",
            f"_ORDER = {order!r}",
            f"_PARAMS = _json.loads({json.dumps(params, sort_keys=True)!r})",
            f"_NONCE = {nonce!r}",
            f"_DEADLINE = {deadline_s!r}",
            _RUN,
        ]
    )
    return Bundle(source=text.encode("utf-8"), nonce=nonce)
