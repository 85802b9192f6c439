"""A ``files:`` entry of a manifest (the ``files`` section's value for one path)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FileEntry:
    """A ``files:`` entry: the content's sha256, its size and the stored blob's name."""

    sha256: str | None = None
    size: int | None = None
    blob: str | None = None

    @classmethod
    def of(cls, value: Any) -> FileEntry | None:
        """The entry of ``value`` (None: the file is absent in that state)."""
        return cls.read(value) if isinstance(value, Mapping) else None

    @classmethod
    def read(cls, value: Mapping[str, Any]) -> FileEntry:
        """The entry of a recorded file."""
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
