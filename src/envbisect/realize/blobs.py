"""Stored file contents (blobs): where a manifest's may be, and the one a files entry names.

A blob is ``<dir>/<name>``, its name the entry's ``blob`` field, else its sha256; it counts
only when its content hashes to the entry's sha256 (a stale or foreign file is not used).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from envbisect.agent.durable import sha256_of
from envbisect.model.files import FileEntry
from envbisect.model.manifest import Manifest

BlobCache = MutableMapping[tuple[int, str], Path | None]  # (id of the manifest, name) → blob


def blob_dirs(manifest: Manifest, extra: Sequence[Path] = ()) -> list[Path]:
    """Where the stored contents of ``manifest``'s files may be, first match wins."""
    out: list[Path] = []
    recorded = manifest.section("meta").get("blobs_dir")
    if isinstance(recorded, str) and recorded:
        out.append(Path(recorded))
    if manifest.path is not None:
        here = manifest.path.absolute().parent
        out += [here / "blobs", here.parent / "blobs", here / "manifests" / "blobs"]
    out += [Path(p) for p in extra]
    return list(dict.fromkeys(out))


def find_blob(
    manifest: Manifest,
    value: Mapping[str, Any] | FileEntry,
    places: Callable[[], Sequence[Path]],
    cache: BlobCache,
) -> Path | None:
    """The stored content of ``value`` (a files entry of ``manifest``): the first of
    ``places`` that holds it, checked by sha256; remembered in ``cache``."""
    entry = value if isinstance(value, FileEntry) else FileEntry.of(value)
    name = entry.blob_name if entry is not None else None
    if entry is None or not name:
        return None
    key = (id(manifest), name)
    if key not in cache:
        cache[key] = next(
            (
                base / name
                for base in places()
                if (base / name).is_file() and sha256_of(str(base / name)) == entry.content_sha
            ),
            None,
        )
    return cache[key]
