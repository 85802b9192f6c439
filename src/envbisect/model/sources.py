"""Package sources: the one place that knows where packages come from.

``Sources`` is built from envbisect.yaml (``indexes``, ``find_links``, ``index_strategy``,
``offline``, ``pins`` and the older ``index_url`` / ``extra_index_urls``). Everything that
calls uv for packages takes its options from ``uv_args``; everything that asks "which
releases of X can be installed" asks ``envbisect.model.listing.available_versions``, which
reads the same sources the way uv reads them: PEP 503 simple pages (HTML, or PEP 691 JSON
where a server offers it) over file:// or http(s)://, and find-links directories or pages;
``envbisect.model.needs`` checks a run's package versions against them before it starts.

Index order follows uv: entries of ``indexes`` are searched in the order written, before the
default index; the default index is the entry marked ``default: true`` (or ``index_url``),
else uv's own default. With ``index_strategy: first-index`` (uv's default) only the first
index that has a package at all is used for it; the ``unsafe-*`` strategies use every index.
A package pinned to an index (``pins: {einops: {index: URL}}``) comes from that index alone,
like uv's ``explicit`` indexes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.utils import (
    canonicalize_name,
)
from packaging.version import Version

from envbisect.model.errors import EnvBisectError

INDEX_STRATEGIES = ("first-index", "unsafe-first-match", "unsafe-best-match")

# A listing that does not answer in this time is a source that cannot be read.
LIST_TIMEOUT_S = 30.0


class SourceError(EnvBisectError):
    """A configured package source cannot be read (unreachable, or not an index)."""


@dataclass(frozen=True)
class Pin:
    """``pins:`` for one package: a version range envbisect may choose from, and/or the one
    index the package comes from (uv's ``explicit`` index)."""

    specifier: str = ""  # e.g. "==0.7.0", ">=1,<2"; "" = any version
    index: str | None = None

    def allows(self, version: Version) -> bool:
        """Whether ``version`` satisfies the pinned range (pre-releases included)."""
        return not self.specifier or SpecifierSet(self.specifier).contains(
            version, prereleases=True
        )

    def as_dict(self) -> dict[str, Any]:
        return {"specifier": self.specifier, "index": self.index}


@dataclass(frozen=True)
class Sources:
    """Where packages come from, in uv's terms.

    ``indexes`` are the extra indexes in priority order (searched before the default);
    ``default_index`` replaces uv's own default index when set.
    """

    indexes: tuple[str, ...] = ()
    default_index: str | None = None
    find_links: tuple[str, ...] = ()
    index_strategy: str | None = None  # None: uv's default (first-index)
    offline: bool = False
    pins: Mapping[str, Pin] = field(default_factory=dict)  # canonical name -> Pin
    target_python: str | None = None  # "3.11": wheels must fit it; None: this interpreter

    @classmethod
    def from_config(cls, config: Any) -> Sources:
        """The sources an envbisect.yaml names (a ``Config``, or anything with its fields)."""
        extra = tuple(getattr(config, "extra_index_urls", ()) or ())
        indexes = tuple(getattr(config, "indexes", ()) or ())
        default = getattr(config, "default_index", None) or getattr(config, "index_url", None)
        return cls(
            # uv: earlier --index entries win over --extra-index-url ones.
            indexes=_unique(indexes + extra),
            default_index=default,
            find_links=tuple(getattr(config, "find_links", ()) or ()),
            index_strategy=getattr(config, "index_strategy", None),
            offline=bool(getattr(config, "offline", False)),
            pins=dict(getattr(config, "pins", {}) or {}),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sources:
        """The inverse of ``as_dict`` (sources travel to agents as JSON)."""
        return cls(
            indexes=tuple(data.get("indexes") or ()),
            default_index=data.get("default_index"),
            find_links=tuple(data.get("find_links") or ()),
            index_strategy=data.get("index_strategy"),
            offline=bool(data.get("offline")),
            pins={
                str(k): Pin(specifier=v.get("specifier") or "", index=v.get("index"))
                for k, v in (data.get("pins") or {}).items()
            },
            target_python=data.get("target_python"),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "indexes": list(self.indexes),
            "default_index": self.default_index,
            "find_links": list(self.find_links),
            "index_strategy": self.index_strategy,
            "offline": self.offline,
            "pins": {k: p.as_dict() for k, p in sorted(self.pins.items())},
            "target_python": self.target_python,
        }

    def pin(self, name: str) -> Pin | None:
        return self.pins.get(canonicalize_name(name))

    def bound_index(self, name: str) -> str | None:
        """The one index ``name`` must come from, if its pin names one."""
        pin = self.pin(name)
        return pin.index if pin else None

    @property
    def configured(self) -> bool:
        """Whether the config names any source at all (else uv's defaults apply)."""
        return bool(self.indexes or self.default_index or self.find_links or self.pins)

    def describe(self, name: str | None = None) -> str:
        """The sources looked at for ``name`` (all of them without a name), for messages."""
        bound = self.bound_index(name) if name else None
        if bound:
            return f"index {bound} (pinned)"
        parts = [f"index {u}" for u in self.indexes]
        parts.append(f"default index {self.default_index or uv_default_index() or '(uv default)'}")
        parts += [f"find-links {u}" for u in self.find_links]
        if self.offline:
            parts.append("offline: uv's cache")
        return ", ".join(parts)


def uv_args(sources: Sources, package: str | None = None) -> list[str]:
    """uv's options for ``sources`` (``uv pip install`` / ``compile`` / ``venv`` alike).

    With ``package`` bound to an index by a pin, only that index: the package cannot come
    from anywhere else (what uv's ``explicit`` index does in a project).
    """
    args: list[str] = []
    bound = sources.bound_index(package) if package else None
    if bound:
        args += ["--default-index", bound]
    else:
        for url in sources.indexes:
            args += ["--index", url]
        if sources.default_index:
            args += ["--default-index", sources.default_index]
        for link in sources.find_links:
            args += ["--find-links", link]
        if sources.index_strategy:
            args += ["--index-strategy", sources.index_strategy]
    if sources.offline:
        args.append("--offline")
    return args


def install_groups(
    requirements: Mapping[str, str], sources: Sources
) -> list[tuple[list[str], list[str]]]:
    """``{name: requirement}`` as ``(uv options, requirements)`` per ``uv pip install`` call:
    one call for everything from the shared sources, one per index a pin binds a package to
    (installs are ``--no-deps``, so splitting them changes nothing else)."""
    shared: list[str] = []
    bound: dict[str, list[tuple[str, str]]] = {}
    for name, req in sorted(requirements.items()):
        index = sources.bound_index(name)
        if index is None or "@" in req:  # a direct URL comes from where it says
            shared.append(req)
        else:
            bound.setdefault(index, []).append((name, req))
    groups = [(uv_args(sources), shared)] if shared else []
    for pairs in bound.values():
        groups.append((uv_args(sources, pairs[0][0]), [req for _name, req in pairs]))
    return groups


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def uv_default_index() -> str | None:
    """uv's default index when the config names none: uv's own variables, else the one pip
    knows (uv and pip share it); None when neither says."""
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(var):
            return os.environ[var].split()[0]
    try:
        from pip._internal.models.index import PyPI  # noqa: PLC0415  (optional; pip may be absent)
    except Exception:  # noqa: BLE001  (any failure of an optional import means "unknown")
        return None
    return str(PyPI.simple_url)
