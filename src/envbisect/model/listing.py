"""What the package sources offer: every file of a package, read the way uv reads them.

PEP 503 simple pages (HTML, or PEP 691 JSON where a server offers it) over file:// or
http(s)://, and find-links directories or pages, in uv's index order and ``index_strategy``
(``envbisect.model.sources`` says how ``Sources`` orders them); only files that fit the
target interpreter count.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
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

from envbisect.model.sources import LIST_TIMEOUT_S, SourceError, Sources, uv_default_index

_JSON_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


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
        default = sources.default_index or (uv_default_index() if uv_default else None)
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
