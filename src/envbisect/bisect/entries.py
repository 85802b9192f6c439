"""Typed views of the manifest entries the actuators read.

A manifest stores each entry as a plain mapping (the schema is in ``manifest.py``); these
frozen views read one entry and are as tolerant of missing fields as the code that used to
probe the mapping with ``.get``: a missing field is ``None`` (or ``False``), a value that is
not a mapping gives no entry at all (``None`` from ``of``). Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FileEntry:
    """A ``files:`` entry: the content's sha256, its size and the stored blob's name."""

    sha256: str | None
    size: int | None = None
    blob: str | None = None

    @classmethod
    def of(cls, value: Any) -> FileEntry | None:
        """The entry of ``value`` (None: the file is absent in that state)."""
        if not isinstance(value, Mapping):
            return None
        sha, blob, size = value.get("sha256"), value.get("blob"), value.get("size")
        return cls(
            sha256=None if sha is None else str(sha),
            size=size if isinstance(size, int) else None,
            blob=str(blob) if blob else None,
        )

    @property
    def blob_name(self) -> str | None:
        """The file name of the stored content: the blob field, else the sha256."""
        return self.blob or self.sha256 or None

    @property
    def content_sha(self) -> str | None:
        """What the stored content must hash to (the sha256, else the blob's name)."""
        return self.sha256 or self.blob_name


@dataclass(frozen=True)
class GitEntry:
    """A ``git:`` entry: the commit checked out, the branch and whether the tree was dirty."""

    head: str | None
    branch: str | None = None
    dirty: bool = False

    @classmethod
    def of(cls, value: Any) -> GitEntry:
        """The entry of ``value``; an absent or malformed one has no head."""
        if not isinstance(value, Mapping):
            return cls(head=None)
        head, branch = value.get("head"), value.get("branch")
        return cls(
            head=str(head) if head else None,
            branch=str(branch) if branch else None,
            dirty=bool(value.get("dirty")),
        )


@dataclass(frozen=True)
class CacheEntry:
    """A ``caches:`` entry: the directory and what it held."""

    path: str | None
    exists: bool | None = None
    files: int | None = None
    bytes: int | None = None

    @classmethod
    def of(cls, value: Any) -> CacheEntry | None:
        """The entry of ``value`` (None when the state recorded no such cache)."""
        if not isinstance(value, Mapping):
            return None
        path = value.get("path")
        return cls(
            path=str(path) if path else None,
            exists=value.get("exists"),
            files=value.get("files"),
            bytes=value.get("bytes"),
        )

    @property
    def warm(self) -> bool:
        """True when the cache held files (the file count when known, else its bytes)."""
        if self.exists is False:
            return False
        return bool(self.files) if self.files is not None else bool(self.bytes)


def is_warm(value: Any) -> bool:
    """True when ``value`` (a raw ``caches:`` entry) is a warm cache."""
    entry = CacheEntry.of(value)
    return entry is not None and entry.warm


@dataclass(frozen=True)
class PackageEntry:
    """A ``packages:`` entry: a version, or a mapping with the version and how it came."""

    version: str | None
    editable: bool = False
    direct_url: Any = None  # PEP 610 ``direct_url.json`` as recorded (a mapping or a URL)

    @classmethod
    def of(cls, value: Any) -> PackageEntry | None:
        """The entry of ``value`` (None: the package is absent in that state)."""
        if value is None:
            return None
        if not isinstance(value, Mapping):
            return cls(version=str(value))
        version = value.get("version")
        return cls(
            version=None if version is None else str(version),
            editable=bool(value.get("editable")),
            direct_url=value.get("direct_url"),
        )

    def requirement(self, name: str) -> str:
        """What ``uv pip install`` gets for this entry: a pinned version or a direct URL."""
        direct = self.direct_url
        if isinstance(direct, Mapping) and direct.get("url"):
            vcs = direct.get("vcs_info") or {}
            if vcs.get("vcs") and vcs.get("commit_id"):
                return f"{name} @ {vcs['vcs']}+{direct['url']}@{vcs['commit_id']}"
            return f"{name} @ {direct['url']}"
        if isinstance(direct, str) and direct:
            return f"{name} @ {direct}"
        return f"{name}=={self.version}"
