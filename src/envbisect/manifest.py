"""The manifest: facts of one machine state (schema ``envbisect/manifest@1``).

Loading is shared by every command: a malformed file, a missing or newer ``schema`` or a
section of the wrong type is one ManifestError naming the file and the field. Unknown extra
keys are kept. Saving is atomic (temp file in the same directory, then rename).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from envbisect.errors import ManifestError

SCHEMA_NAME = "envbisect/manifest"
SCHEMA_VERSION = 1
SCHEMA = f"{SCHEMA_NAME}@{SCHEMA_VERSION}"

# Section order in the written file (stable, human-first); unknown sections follow.
SECTIONS: tuple[str, ...] = (
    "meta",
    "system",
    "python",
    "torch",
    "gpu",
    "packages",
    "git",
    "files",
    "data",
    "caches",
    "env",
    "probes",
)

# libyaml's safe loader/dumper when present: several times faster on big package lists.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# Sections whose every entry is itself a mapping of facts.
_KEYED_SECTIONS: tuple[str, ...] = ("packages", "git", "files", "data", "caches", "probes")


@dataclass(frozen=True)
class Manifest:
    """A loaded or freshly collected manifest. ``sections`` maps section name to mapping."""

    sections: dict[str, Any]
    path: Path | None = None

    def section(self, name: str) -> dict[str, Any]:
        value = self.sections.get(name)
        return value if isinstance(value, dict) else {}

    @property
    def label(self) -> str:
        return str(self.section("meta").get("label") or (self.path.stem if self.path else "?"))

    def as_dict(self) -> dict[str, Any]:
        ordered: dict[str, Any] = {"schema": SCHEMA}
        for name in SECTIONS:
            if name in self.sections:
                ordered[name] = self.sections[name]
        for name, value in self.sections.items():
            if name not in ordered:
                ordered[name] = value
        return ordered

    def to_yaml(self) -> str:
        return yaml.dump(
            self.as_dict(),
            Dumper=_DUMPER,
            sort_keys=False,
            allow_unicode=True,
            default_flow_style=False,
            width=120,
        )

    @classmethod
    def from_dict(cls, data: Any, source: str, path: Path | None = None) -> Manifest:
        """Validate the top level of a parsed manifest; ``source`` names it in errors."""
        if not isinstance(data, dict):
            raise ManifestError(f"{source}: not a manifest (top level is not a mapping)")
        schema = data.get("schema")
        if schema is None:
            raise ManifestError(f"{source}: field 'schema' is missing (expected {SCHEMA!r})")
        if not isinstance(schema, str) or "@" not in schema:
            raise ManifestError(
                f"{source}: field 'schema' must look like {SCHEMA!r}, got {schema!r}"
            )
        name, _, version = schema.partition("@")
        if name != SCHEMA_NAME:
            raise ManifestError(
                f"{source}: field 'schema' is {schema!r}, not an envbisect manifest"
            )
        if not version.isdigit():
            raise ManifestError(f"{source}: field 'schema' has a bad version {version!r}")
        if int(version) > SCHEMA_VERSION:
            raise ManifestError(
                f"{source}: field 'schema' is {schema!r}, newer than this envbisect reads "
                f"({SCHEMA}); upgrade envbisect"
            )
        sections = {k: v for k, v in data.items() if k != "schema"}
        for name in SECTIONS:
            if (
                name in sections
                and sections[name] is not None
                and not isinstance(sections[name], dict)
            ):
                kind = type(sections[name]).__name__
                raise ManifestError(f"{source}: field '{name}' must be a mapping, got {kind}")
            if sections.get(name) is None and name in sections:
                sections[name] = {}
        errors = sections.get("meta", {}).get("errors", [])
        if errors is not None and not isinstance(errors, list):
            raise ManifestError(f"{source}: field 'meta.errors' must be a list")
        for name in _KEYED_SECTIONS:
            for key, entry in sections.get(name, {}).items():
                if not isinstance(entry, dict):
                    kind = type(entry).__name__
                    raise ManifestError(
                        f"{source}: field '{name}.{key}' must be a mapping, got {kind}"
                    )
        for key, value in sections.get("env", {}).items():
            if not isinstance(value, (str, dict)):
                kind = type(value).__name__
                raise ManifestError(
                    f"{source}: field 'env.{key}' must be a string or {{redacted: ...}}, got {kind}"
                )
        return cls(sections=sections, path=path)


# Manifests at least this large get a parsed copy (JSON) in the parse cache: libyaml needs
# seconds for a 20,000-entry manifest, JSON tens of milliseconds.
PARSE_CACHE_MIN_BYTES = 256 * 1024


def parse_cache_dir() -> Path:
    """Where parsed copies of large manifests live, keyed by the file's sha256."""
    explicit = os.environ.get("ENVBISECT_CACHE_DIR")
    if explicit:
        return Path(explicit) / "manifests"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "envbisect" / "manifests"


def _cache_path(raw: bytes) -> Path:
    return parse_cache_dir() / f"{hashlib.sha256(raw).hexdigest()}.json"


def _cache_store(raw: bytes, data: Any) -> None:
    """Best effort: a cache that cannot be written only costs speed next time."""
    if len(raw) < PARSE_CACHE_MIN_BYTES:
        return
    with contextlib.suppress(OSError, TypeError, ValueError):
        atomic_write_text(_cache_path(raw), json.dumps(data))


def _cache_lookup(raw: bytes) -> Any:
    if len(raw) < PARSE_CACHE_MIN_BYTES:
        return None
    try:
        return json.loads(_cache_path(raw).read_bytes())
    except (OSError, ValueError):
        return None


def load(path: str | Path) -> Manifest:
    """Read and validate a manifest file.

    A large manifest's parsed form is cached by content hash (see ``parse_cache_dir``), so
    only the first read of a given file pays for YAML parsing; the cached copy is validated
    exactly like a fresh parse.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{p}: no such manifest file") from None
    except IsADirectoryError:
        raise ManifestError(f"{p}: is a directory, not a manifest file") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{p}: not a text file") from None
    except OSError as exc:
        raise ManifestError(f"{p}: cannot read: {exc.strerror}") from None
    data: Any = _cache_lookup(raw)
    if data is None and text.lstrip().startswith("{"):
        # JSON is YAML, and a 20,000-entry manifest parses ~80x faster as JSON than through
        # libyaml; anything that is not strict JSON falls through to the YAML loader.
        try:
            data = json.loads(text)
        except ValueError:
            data = None
    if data is None:
        try:
            data = yaml.load(text, Loader=_LOADER)  # safe: a SafeLoader
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or "invalid YAML"
            raise ManifestError(f"{p}: malformed YAML{where}: {problem}") from None
        _cache_store(raw, data)
    return Manifest.from_dict(data, str(p), path=p)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the whole new one."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def save(manifest: Manifest, path: Path) -> Path:
    """Write ``manifest`` atomically as YAML to ``path`` (and prime the parse cache)."""
    raw = manifest.to_yaml().encode("utf-8")
    atomic_write_bytes(path, raw)
    _cache_store(raw, manifest.as_dict())
    return path
