"""The releases of one package between two versions, and what its companions take while
they are tried: the parts of the package step (``pkgrun``) that read the sources."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbisect.model.errors import ActuationError, EnvBisectError

# package name → the final releases the configured sources hold, ascending.
Releases = Callable[[str], Sequence[Version]]
# "torch==2.14.0" → normalised name → version of everything it pins, as the sources resolve it.
Resolve = Callable[[str], Mapping[str, str]]


def version_of(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


def package_entry(version: str) -> dict[str, Any]:
    """A ``packages:`` value for ``version`` from the sources."""
    return {"version": version, "editable": False, "direct_url": None}


@dataclass
class Companions:
    """torch's companions while its releases are tried: resolved per release against the
    sources (``resolve``: ``torch==V`` → the versions it pins), else left where ``kept``
    says (the versions of the state below). Mutable: it records what each release got."""

    keys: tuple[str, ...]  # the unit's other package keys
    kept: str
    resolve: Resolve | None = None
    resolved: dict[str, dict[str, str]] = field(default_factory=dict)  # release → key → v
    failed: dict[str, str] = field(default_factory=dict)  # release → why not

    def values(self, key: str, version: str) -> dict[str, Any]:
        """The companions' values for release ``version`` of ``key`` ({} when unresolved)."""
        if self.resolve is None or not self.keys:
            return {}
        try:
            pins = self.resolve(f"{key}=={version}")
        except (EnvBisectError, OSError, ValueError) as exc:
            self.failed[version] = str(exc)
            return {}
        got = {k: pins[canonicalize_name(k)] for k in self.keys if canonicalize_name(k) in pins}
        self.resolved[version] = got
        return {k: package_entry(v) for k, v in got.items()}

    def note(self) -> str:
        parts = []
        if self.resolved:
            shown = "; ".join(
                f"{v}: " + (", ".join(f"{k} {x}" for k, x in sorted(p.items())) or "none of them")
                for v, p in self.resolved.items()
            )
            parts.append(
                "torch's companions were resolved for each release with uv pip compile "
                f"against the configured sources ({shown})"
            )
        if self.failed or self.resolve is None:
            why = "; ".join(f"{v}: {w}" for v, w in self.failed.items())
            parts.append(self.kept + (f" (could not resolve them: {why})" if why else ""))
        return "during the release search " + "; ".join(parts)


def releases_between(good: str, bad: str, available: Sequence[Version]) -> list[str]:
    """The releases strictly between ``good`` and ``bad`` (public versions compared, so
    ``2.13.0`` lies not between ``2.13.0+cpu`` and ``2.14.1``), one per public version,
    ordered from ``good`` towards ``bad``."""
    lo, hi = sorted((Version(version_of(good).public), Version(version_of(bad).public)))
    # A build of the endpoints' kind first (``+cpu`` between two +cpu builds), else the
    # plain release, else any local build of it.
    labels = [x for x in (version_of(bad).local, version_of(good).local) if x]
    seen: dict[Version, list[Version]] = {}
    for v in available:
        public = Version(v.public)
        if lo < public < hi and not v.is_prerelease and not v.is_devrelease:
            seen.setdefault(public, []).append(v)

    def rank(v: Version) -> tuple[int, Version]:
        local = v.local or ""
        return (labels.index(local) if local in labels else len(labels) + bool(local), v)

    ordered = [str(min(seen[p], key=rank)) for p in sorted(seen)]
    return ordered if version_of(bad) >= version_of(good) else ordered[::-1]


def uv_resolver(uv: str, source_args: Sequence[str], python: str) -> Resolve:
    """``uv pip compile`` of one requirement against the sources (``source_args``: uv's
    options for them) for the target's ``python`` version (``3.12``)."""

    def resolve(requirement: str) -> Mapping[str, str]:
        from envbisect.model.errors import ReconstructError
        from envbisect.snapshot.resolver import uv_compile

        args = ["--python-version", python, *source_args]
        try:
            return uv_compile(uv, "requirements.in", requirement + "\n", args)
        except ReconstructError as exc:
            raise ActuationError(f"{exc} ({requirement})") from None

    return resolve
