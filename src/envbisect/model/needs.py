"""The pre-check: is every package version a run needs available from its sources?

Each version is looked for where uv would install it from (``envbisect.model.listing``),
then in uv's own cache; what is missing is said in one message (:func:`missing_message`).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.utils import (
    canonicalize_name,
)
from packaging.version import InvalidVersion, Version

from envbisect.model.errors import EnvBisectError
from envbisect.model.listing import list_package
from envbisect.model.sources import LIST_TIMEOUT_S, SourceError, Sources, uv_args


class SourcesMissing(EnvBisectError):
    """Package versions a run needs are in none of the configured sources."""


@dataclass(frozen=True)
class Need:
    """One package version a run will install: ``name==version``, or a direct URL."""

    name: str
    version: str | None
    requirement: str  # what uv is given
    why: str = ""  # whose state needs it ("good", "bad", "release search")

    @property
    def local_path(self) -> str | None:
        """The file or directory a ``file://`` direct URL names (None: not a local URL)."""
        if "@" not in self.requirement:
            return None
        url = self.requirement.split("@", 1)[1].strip()
        if url.startswith("file://"):
            return urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
        return None

    @property
    def direct(self) -> bool:
        return "@" in self.requirement

    def text(self) -> str:
        return self.requirement if self.direct else f"{self.name}=={self.version}"


def missing_needs(
    needs: Iterable[Need],
    sources: Sources,
    *,
    installed: Mapping[str, str] | None = None,
    uv: str | None = None,
    python: str | None = None,
) -> list[tuple[Need, str]]:
    """Each need that cannot be installed, with the sources looked at for it.

    ``installed``: canonical name → version already in the base interpreter (the overlay
    links those, no source needed). A local direct URL is checked on disk; a remote one is
    left to uv. With ``offline``, a version only an http(s) source lists counts when uv's
    cache holds it (``uv``: the uv to ask). One listing per package name, in parallel.
    """
    from concurrent.futures import ThreadPoolExecutor

    installed = installed or {}
    todo: dict[str, list[Need]] = {}
    out: list[tuple[Need, str]] = []
    for need in needs:
        name = canonicalize_name(need.name)
        if need.version is not None and same_version(installed.get(name), need.version):
            continue
        if need.direct:
            path = need.local_path
            if path is not None and not os.path.exists(path):
                out.append((need, f"no such path {path}"))
            continue
        todo.setdefault(name, []).append(need)
    target = sources if python is None else _with_python(sources, python)

    def check(name: str) -> list[tuple[Need, str]]:
        return _missing_of(name, todo[name], target, uv)

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(todo)))) as pool:
        for found in pool.map(check, sorted(todo)):
            out += found
    return out


def _with_python(sources: Sources, python: str) -> Sources:
    from dataclasses import replace

    parts = python.split(".")
    return replace(sources, target_python=".".join(parts[:2]))


def same_version(have: str | None, want: str) -> bool:
    if have is None:
        return False
    try:
        return Version(have) == Version(want)
    except InvalidVersion:
        return have == want


def _missing_of(
    name: str, needs: list[Need], sources: Sources, uv: str | None
) -> list[tuple[Need, str]]:
    """The needs of one package name that its sources do not hold."""
    looked = sources.describe(name)
    held: set[Version] = set()
    reachable = _reachable(sources, name)
    if reachable is not None:
        try:
            listing = list_package(name, reachable, uv_default=not sources.offline)
        except SourceError as exc:
            if not sources.offline:
                return [(n, f"{looked}; {exc}") for n in needs]
        else:
            held = set(
                listing.versions(
                    finals_only=False, include_yanked=True, python=sources.target_python
                )
            )
    out = []
    for need in needs:
        try:
            wanted = Version(str(need.version))
        except InvalidVersion:
            out.append((need, f"{looked}; not a version: {need.version!r}"))
            continue
        if wanted in held:
            continue
        if sources.offline and _in_uv_cache(need, sources, uv):
            continue
        out.append((need, looked))
    return out


def _reachable(sources: Sources, name: str) -> Sources | None:
    """The sources ``name`` can be listed from: offline, only those on this machine's disk
    (uv reads them without network); None when there are none."""
    if not sources.offline:
        return sources
    from dataclasses import replace

    def local(url: str | None) -> bool:
        return url is not None and not url.startswith(("http://", "https://"))

    bound = sources.bound_index(name)
    if bound is not None:
        return sources if local(bound) else None
    out = replace(
        sources,
        indexes=tuple(u for u in sources.indexes if local(u)),
        default_index=sources.default_index if local(sources.default_index) else None,
        find_links=tuple(u for u in sources.find_links if local(u)),
    )
    return out if out.indexes or out.default_index or out.find_links else None


def _in_uv_cache(need: Need, sources: Sources, uv: str | None) -> bool:
    """Whether uv, offline, can install ``need`` from its cache: it resolves there (the
    index's listing is cached: ``uv pip compile --offline``) and the wheel itself was kept
    (an unpacked ``<name>-<version>.dist-info`` in uv's archive)."""
    import subprocess

    if uv is None or not _uv_archive_has(uv, need.name, str(need.version)):
        return False
    argv = [uv, "pip", "compile", "-q", "--no-header", "--no-deps", "-"]
    argv += uv_args(sources, need.name)
    if sources.target_python:
        argv += ["--python-version", sources.target_python]
    try:
        proc = subprocess.run(
            argv,
            input=need.requirement + "\n",
            capture_output=True,
            text=True,
            timeout=LIST_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _uv_archive_has(uv: str, name: str, version: str) -> bool:
    import glob
    import subprocess

    try:
        proc = subprocess.run(
            [uv, "cache", "dir"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    root = proc.stdout.strip()
    if proc.returncode != 0 or not root:
        return False
    try:
        wanted = Version(version)
    except InvalidVersion:
        return False
    canon = canonicalize_name(name)
    for path in glob.glob(os.path.join(glob.escape(root), "archive-v*", "*", "*.dist-info")):
        stem = os.path.basename(path)[: -len(".dist-info")]
        dist, _, ver = stem.rpartition("-")
        try:
            if canonicalize_name(dist) == canon and Version(ver) == wanted:
                return True
        except InvalidVersion:
            continue
    return False


def missing_message(missing: list[tuple[Need, str]], config_path: Any = None) -> str:
    """One line: every missing version, grouped by the sources looked at."""
    where = str(config_path) if config_path else "envbisect.yaml"
    groups: dict[str, list[str]] = {}
    for need, looked in missing:
        groups.setdefault(looked, []).append(need.text())
    parts = [
        f"{', '.join(sorted(set(names)))} (looked at: {looked})" for looked, names in groups.items()
    ]
    n = len(missing)
    return (
        f"{where}: {n} package version{'s' if n != 1 else ''} the run needs "
        f"{'are' if n != 1 else 'is'} not available from the configured sources: "
        + "; ".join(parts)
        + " — add a source under 'indexes' or 'find_links'"
        + (" (or set offline: false)" if any("offline" in g for g in groups) else "")
        + ", then run again"
    )
