"""Package sources: the one place that knows where packages come from.

``Sources`` is built from envbisect.yaml (``indexes``, ``find_links``, ``index_strategy``,
``offline``, ``pins`` and the older ``index_url`` / ``extra_index_urls``). Everything that
calls uv for packages takes its options from ``uv_args``; everything that asks "which
releases of X can be installed" asks ``available_versions``, which reads the same sources
the way uv reads them: PEP 503 simple pages (HTML, or PEP 691 JSON where a server offers
it) over file:// or http(s)://, and find-links directories or pages.

Index order follows uv: entries of ``indexes`` are searched in the order written, before the
default index; the default index is the entry marked ``default: true`` (or ``index_url``),
else uv's own default. With ``index_strategy: first-index`` (uv's default) only the first
index that has a package at all is used for it; the ``unsafe-*`` strategies use every index.
A package pinned to an index (``pins: {einops: {index: URL}}``) comes from that index alone,
like uv's ``explicit`` indexes.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, sys_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from envbisect.model.errors import EnvBisectError

INDEX_STRATEGIES = ("first-index", "unsafe-first-match", "unsafe-best-match")

# A listing that does not answer in this time is a source that cannot be read.
LIST_TIMEOUT_S = 30.0

_JSON_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


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
        parts.append(f"default index {self.default_index or _uv_default_index() or '(uv default)'}")
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


@dataclass(frozen=True)
class DistFile:
    """One file a source offers for a package."""

    filename: str
    version: Version
    source: str  # the index or find-links location it was listed in
    url: str
    yanked: bool = False
    requires_python: str | None = None
    tags: frozenset[Tag] | None = None  # None: an sdist (builds anywhere)


@dataclass(frozen=True)
class Listing:
    """Every file the sources offer for one package name, and the sources looked at."""

    name: str
    files: tuple[DistFile, ...]
    looked_at: tuple[str, ...]

    def versions(
        self, *, finals_only: bool = True, include_yanked: bool = False, python: str | None = None
    ) -> list[Version]:
        """Sorted versions with at least one file that fits ``python`` (None: this one)."""
        fits = _fitter(python)
        out = {
            f.version
            for f in self.files
            if (include_yanked or not f.yanked)
            and not (finals_only and (f.version.is_prerelease or f.version.is_devrelease))
            and fits(f)
        }
        return sorted(out)


def available_versions(
    name: str, sources: Sources, *, finals_only: bool = True, include_yanked: bool = False
) -> list[Version]:
    """The versions of ``name`` that ``sources`` can install, ascending.

    Read the way uv reads them (index order, ``index_strategy``, a pin's bound index, the
    find-links); yanked files are left out unless ``include_yanked``; only files that fit
    ``sources.target_python`` (else this interpreter) count. ``finals_only`` leaves out
    pre- and dev releases (a local build such as ``2.13.0+cpu`` is a final release).
    Raises SourceError when a source cannot be read at all (a missing project is not that).
    """
    listing = list_package(name, sources)
    return listing.versions(
        finals_only=finals_only, include_yanked=include_yanked, python=sources.target_python
    )


def list_package(name: str, sources: Sources, *, uv_default: bool = True) -> Listing:
    """Every file ``sources`` offer for ``name``: one read per index / find-links location.

    ``uv_default``: without a default index in ``sources``, list uv's own default index
    too (False: offline, where uv would not reach it)."""
    canon = canonicalize_name(name)
    bound = sources.bound_index(canon)
    if bound:
        indexes: tuple[str, ...] = (bound,)
        links: tuple[str, ...] = ()
    else:
        default = sources.default_index or (_uv_default_index() if uv_default else None)
        if default is None and not sources.indexes and not sources.find_links:
            raise SourceError(
                "envbisect.yaml: no package index to list: name one under 'indexes' "
                "(default: true) or set UV_DEFAULT_INDEX"
            )
        indexes = sources.indexes + ((default,) if default else ())
        links = sources.find_links
    files: list[DistFile] = []
    looked: list[str] = []
    first_index = (sources.index_strategy or "first-index") == "first-index"
    for url in indexes:
        looked.append(url)
        found = _read_index(url, canon)
        files += found
        if found and first_index:
            break  # uv takes the first index that has the package at all
    for link in links:
        looked.append(link)
        files += [f for f in _read_find_links(link) if canonicalize_name(_name_of(f)) == canon]
    return Listing(name=canon, files=tuple(files), looked_at=tuple(looked))


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _uv_default_index() -> str | None:
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


# -- reading sources ------------------------------------------------------------------------


class _Anchors(HTMLParser):
    """The ``<a>`` elements of a simple page: href, text and data-* attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str | None]] = []
        self._open: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open = dict(attrs)
            self._open["#text"] = ""
            self.anchors.append(self._open)

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open["#text"] = (self._open["#text"] or "") + data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._open = None


def _fetch(url: str, accept_json: bool) -> tuple[str, str, str] | None:
    """(body, content type, final url) of ``url``; None when it does not exist (404/no file).

    A directory (file://) is answered as a page linking its files, like uv's flat indexes.
    """
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("", "file"):
        path = Path(urllib.request.url2pathname(parsed.path) if parsed.scheme else url)
        if path.is_dir():
            page = path / "index.html"
            if page.is_file():
                return page.read_text(errors="replace"), "text/html", page.as_uri()
            links = "".join(
                f'<a href="{urllib.parse.quote(p.name)}">{p.name}</a>'
                for p in sorted(path.iterdir())
                if p.is_file()
            )
            return f"<html><body>{links}</body></html>", "text/html", path.as_uri() + "/"
        if path.is_file():
            return path.read_text(errors="replace"), "text/html", path.as_uri()
        return None
    if parsed.scheme not in ("http", "https"):
        raise SourceError(f"envbisect.yaml: source {url}: not a file, http or https location")
    headers = {"Accept": _JSON_ACCEPT} if accept_json else {}
    plain = url
    if parsed.username is not None:
        # uv's form user:password@host: urllib wants it as a header, not in the host.
        import base64

        secret = (
            f"{urllib.parse.unquote(parsed.username)}:{urllib.parse.unquote(parsed.password or '')}"
        )
        headers["Authorization"] = "Basic " + base64.b64encode(secret.encode()).decode()
        host = parsed.hostname or ""
        plain = urllib.parse.urlunparse(
            parsed._replace(netloc=host + (f":{parsed.port}" if parsed.port else ""))
        )
    request = urllib.request.Request(plain, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=LIST_TIMEOUT_S) as response:  # noqa: S310  (scheme checked above)
            body = response.read().decode("utf-8", errors="replace")
            return body, response.headers.get("Content-Type", ""), response.geturl()
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            return None
        raise SourceError(f"source {_safe(url)}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceError(f"source {_safe(url)}: cannot be read ({reason})") from None


def _safe(url: str) -> str:
    """``url`` without a password (an index URL may carry credentials)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))


def _read_index(index: str, canon: str) -> list[DistFile]:
    """The files a simple index lists for project ``canon``."""
    url = index.rstrip("/") + "/" + canon + "/"
    got = _fetch(url, accept_json=True)
    if got is None:
        return []
    body, ctype, final = got
    if "json" in ctype:
        return _files_from_json(body, final, index)
    return _files_from_html(body, final, index)


def _read_find_links(location: str) -> list[DistFile]:
    """The files a find-links directory or page offers (all packages)."""
    got = _fetch(location, accept_json=False)
    if got is None:
        raise SourceError(f"envbisect.yaml: find_links {location}: no such directory or page")
    body, _ctype, final = got
    return _files_from_html(body, final, location)


def _files_from_html(body: str, base: str, source: str) -> list[DistFile]:
    parser = _Anchors()
    parser.feed(body)
    out = []
    for a in parser.anchors:
        href = a.get("href")
        if not href:
            continue
        url = urllib.parse.urljoin(base, href)
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        dist = _dist_file(
            filename,
            source,
            url,
            yanked="data-yanked" in a,
            requires_python=a.get("data-requires-python"),
        )
        if dist is not None:
            out.append(dist)
    return out


def _files_from_json(body: str, base: str, source: str) -> list[DistFile]:
    try:
        doc = json.loads(body)
    except json.JSONDecodeError:
        raise SourceError(f"source {_safe(source)}: answered JSON that cannot be read") from None
    out = []
    for entry in doc.get("files") or ():
        if not isinstance(entry, dict) or not isinstance(entry.get("filename"), str):
            continue
        dist = _dist_file(
            entry["filename"],
            source,
            urllib.parse.urljoin(base, str(entry.get("url") or "")),
            yanked=bool(entry.get("yanked")),
            requires_python=entry.get("requires-python"),
        )
        if dist is not None:
            out.append(dist)
    return out


def _dist_file(
    filename: str, source: str, url: str, *, yanked: bool, requires_python: str | None
) -> DistFile | None:
    """A wheel or sdist filename as a DistFile; None for anything else."""
    try:
        if filename.endswith(".whl"):
            _name, version, _build, tags = parse_wheel_filename(filename)
            return DistFile(filename, version, source, url, yanked, requires_python, tags)
        if filename.endswith((".tar.gz", ".zip")):
            _name, version = parse_sdist_filename(filename)
            return DistFile(filename, version, source, url, yanked, requires_python, None)
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return None


def _name_of(dist: DistFile) -> str:
    if dist.filename.endswith(".whl"):
        return str(parse_wheel_filename(dist.filename)[0])
    return str(parse_sdist_filename(dist.filename)[0])


# -- which files fit the target interpreter ---------------------------------------------------


def _fitter(python: str | None) -> Any:
    """A predicate: does a DistFile fit ``python`` ("3.11"; None: this interpreter, with its
    platform tags)?"""
    if python is None:
        here = frozenset(sys_tags())
        version = Version(f"{sys.version_info[0]}.{sys.version_info[1]}")

        def fits_here(f: DistFile) -> bool:
            return _requires_ok(f, version) and (f.tags is None or bool(f.tags & here))

        return fits_here
    target = Version(python)
    major, minor = target.release[0], (target.release[1] if len(target.release) > 1 else 0)

    def fits(f: DistFile) -> bool:
        if not _requires_ok(f, target):
            return False
        return f.tags is None or any(_python_fits(t, major, minor) for t in f.tags)

    return fits


def _requires_ok(f: DistFile, version: Version) -> bool:
    if not f.requires_python:
        return True
    try:
        return SpecifierSet(f.requires_python).contains(version, prereleases=True)
    except InvalidSpecifier:
        return True  # a malformed requirement on an index is uv's problem to judge, not ours


def _python_fits(tag: Tag, major: int, minor: int) -> bool:
    """Whether a wheel tag's interpreter/abi can fit CPython ``major.minor`` (platform is
    not judged: a remote target's platform is not known here)."""
    interp = tag.interpreter
    digits = interp.lstrip("abcdefghijklmnopqrstuvwxyz")
    kind = interp[: len(interp) - len(digits)]
    if not digits.isdigit():
        return False
    tag_major = int(digits[0])
    tag_minor = int(digits[1:]) if len(digits) > 1 else None
    if tag_major != major:
        return False
    if kind == "py":
        return tag_minor is None or tag_minor <= minor
    if kind == "cp":
        if tag_minor == minor:
            return True
        return tag.abi == "abi3" and tag_minor is not None and tag_minor <= minor
    return False


# -- the pre-check: is every version a run needs available? ----------------------------------


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
