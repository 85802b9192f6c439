"""The manifest: facts of one machine state (schema ``envbisect/manifest@2``).

Schema 2 adds the ``reconstructed:`` block (facts rebuilt for an earlier time, each with its
confidence and evidence: ``envbisect.snapshot.reconstruct``). A manifest without that block is the
same as in schema 1 and is still written as ``@1``, so older envbisect versions keep reading
ordinary snapshots; ``@1`` files load as before.

Loading is shared by every command: a malformed file, a missing or newer ``schema`` or a
section of the wrong type is one ManifestError naming the file and the field. Unknown extra
keys are kept. Saving is atomic (temp file in the same directory, then rename).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from envbisect.model.errors import ManifestError, yaml_kind, yaml_type
from envbisect.model.paths import atomic_write_bytes, atomic_write_text

SCHEMA_NAME = "envbisect/manifest"
SCHEMA_VERSION = 2
# What a manifest without a ``reconstructed:`` block is written as (readable by envbisect
# versions that know schema 1 only).
PLAIN_SCHEMA_VERSION = 1
SCHEMA = f"{SCHEMA_NAME}@{PLAIN_SCHEMA_VERSION}"
RECONSTRUCTED_SCHEMA = f"{SCHEMA_NAME}@{SCHEMA_VERSION}"
CONFIDENCES = ("high", "medium", "low", "unknown")

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
_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# What envbisect reads at most. A real machine's manifest is tens of KB (the H200 example in
# manifests/ is 23 KB; 20,000 entries make about 3 MB). Parsing YAML costs about 1 s per
# 1.5 MB here, and a 50 MB file of 500,000 keys took 82 s and 2.2 GB: such a file is not a
# machine state but data (a dataset listed under files:, a log), so it is refused up front
# with its size. ENVBISECT_MAX_MANIFEST_BYTES raises the limit for a user who means it.
MANIFEST_MAX_BYTES = 16_000_000
CONFIG_MAX_BYTES = 1_000_000
MAX_BYTES_ENV = "ENVBISECT_MAX_MANIFEST_BYTES"
# Deeper nesting than any manifest has (meta.target.via[...] is 4): refused, never recursed.
MAX_DEPTH = 64


class YamlRefused(ValueError):
    """A file that is not read or parsed (the caller adds its path and its error class)."""


class _StrictLoader(_BASE_LOADER):  # type: ignore[misc,valid-type]
    """The safe loader, minus what manifests never need and attackers love: aliases (a
    371-byte 'billion laughs' file expands to gigabytes in whatever walks it), merge keys,
    and duplicate keys (the last one silently winning)."""

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        if node in self.constructed_objects:
            # Only an alias (*name) reaches a node a second time.
            raise YamlRefused(
                f"line {node.start_mark.line + 1}: an anchor (&name) used again through an "
                "alias (*name); manifests and envbisect.yaml never need aliases"
            )
        return super().construct_object(node, deep)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[tuple[str, str], int] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise YamlRefused(
                    f"line {key_node.start_mark.line + 1}: uses a YAML merge key (<<); "
                    "write the entries out"
                )
            if isinstance(key_node, yaml.ScalarNode):
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise YamlRefused(
                        f"line {key_node.start_mark.line + 1}: duplicate key "
                        f"{key_node.value!r} (first at line {seen[ident]}); one would "
                        "silently replace the other"
                    )
                seen[ident] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def max_bytes() -> int:
    """The manifest size limit in bytes (``ENVBISECT_MAX_MANIFEST_BYTES`` overrides it)."""
    raw = os.environ.get(MAX_BYTES_ENV)
    if raw and raw.isdigit() and int(raw) > 0:
        return int(raw)
    return MANIFEST_MAX_BYTES


def read_bounded(path: Path, limit: int, what: str = "manifest") -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes.

    Opened without blocking (a FIFO with no writer must not hang) and checked with fstat
    before any byte is read: a device (/dev/zero, /dev/urandom), FIFO, socket or directory is
    refused, and so is a file over the limit, saying its size and the limit.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise YamlRefused(f"no such {what} file") from None
    except IsADirectoryError:
        raise YamlRefused(f"is a directory, not a {what} file") from None
    except OSError as exc:
        raise YamlRefused(f"cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise YamlRefused(f"is a directory, not a {what} file")
        if not stat.S_ISREG(st.st_mode):
            kind = _file_kind(st.st_mode)
            raise YamlRefused(f"is {kind}, not a regular file; a {what} must be a file")
        if st.st_size > limit:
            raise YamlRefused(_too_large(st.st_size, limit, what))
        with os.fdopen(fd, "rb", closefd=True) as fh:
            fd = -1
            data = fh.read(limit + 1)
    except OSError as exc:
        raise YamlRefused(f"cannot read: {exc.strerror}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:  # it grew while being read
        raise YamlRefused(_too_large(len(data), limit, what))
    return data


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _too_large(size: int, limit: int, what: str) -> str:
    hint = f" (set {MAX_BYTES_ENV} to read it anyway)" if what == "manifest" else ""
    return (
        f"is {_human(size)}, over the {_human(limit)} envbisect reads for a {what}: "
        "a machine state takes well under 5 MB (20,000 entries make about 3 MB), so this is "
        f"probably data (a dataset or log) rather than a {what}{hint}"
    )


def _human(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.1f} MB"
    if n >= 1000:
        return f"{n / 1e3:.1f} KB"
    return f"{n} bytes"


def parse_yaml(text: str) -> Any:
    """Strict safe YAML: no aliases, merge keys or duplicate keys, bounded nesting."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise YamlRefused(f"malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise YamlRefused(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            digits = sys.get_int_max_str_digits()
            raise YamlRefused(f"holds an integer of more than {digits} digits") from None
        raise YamlRefused(f"a value that cannot be read: {str(exc)[:120]}") from None
    _check_depth(data)
    return data


def _pairs_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise YamlRefused(f"duplicate key {key!r}; one would silently replace the other")
            seen.add(key)
    return out


def parse_json(text: str) -> Any:
    """Strict JSON (no duplicate keys, bounded nesting), or None when ``text`` is not JSON."""
    try:
        data = json.loads(text, object_pairs_hook=_pairs_no_duplicates)
    except RecursionError:
        raise YamlRefused(f"nested deeper than {MAX_DEPTH} levels") from None
    except YamlRefused:
        raise
    except ValueError:
        return None
    _check_depth(data)
    return data


def _check_depth(data: Any) -> None:
    """Refuse nesting deeper than MAX_DEPTH (iteratively: the check itself cannot overflow)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise YamlRefused(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


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

    @property
    def reconstructed(self) -> bool:
        """True when some facts were rebuilt for an earlier time rather than collected."""
        return bool(self.section("reconstructed"))

    def as_dict(self) -> dict[str, Any]:
        schema = RECONSTRUCTED_SCHEMA if self.reconstructed else SCHEMA
        ordered: dict[str, Any] = {"schema": schema}
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
        _check_schema(source, data.get("schema"))
        sections = _section_mappings(source, data)
        _check_section_contents(source, sections)
        return cls(sections=sections, path=path)


def _check_schema(source: str, schema: Any) -> None:
    """ManifestError unless ``schema`` names an envbisect manifest this version reads."""
    if schema is None:
        raise ManifestError(f"{source}: field 'schema' is missing (expected {SCHEMA!r})")
    if not isinstance(schema, str) or "@" not in schema:
        raise ManifestError(f"{source}: field 'schema' must look like {SCHEMA!r}, got {schema!r}")
    name, _, version = schema.partition("@")
    if name != SCHEMA_NAME:
        raise ManifestError(f"{source}: field 'schema' is {schema!r}, not an envbisect manifest")
    if not version.isdigit():
        raise ManifestError(f"{source}: field 'schema' has a bad version {version!r}")
    if int(version) > SCHEMA_VERSION:
        raise ManifestError(
            f"{source}: field 'schema' is {schema!r}, newer than this envbisect reads "
            f"({RECONSTRUCTED_SCHEMA}); upgrade envbisect"
        )


def _section_mappings(source: str, data: dict[str, Any]) -> dict[str, Any]:
    """Every key but ``schema``; a known section must be a mapping (an empty one is read
    as ``{}``); unknown sections are kept as they are."""
    sections = {k: v for k, v in data.items() if k != "schema"}
    for name in SECTIONS:
        if name in sections and sections[name] is not None and not isinstance(sections[name], dict):
            kind = yaml_kind(sections[name])
            raise ManifestError(f"{source}: field '{name}' must be a mapping, got {kind}")
        if sections.get(name) is None and name in sections:
            sections[name] = {}
    return sections


def _check_section_contents(source: str, sections: dict[str, Any]) -> None:
    """The fields inside the sections that the code reads have the types it expects."""
    errors = sections.get("meta", {}).get("errors", [])
    if errors is not None and not isinstance(errors, list):
        raise ManifestError(f"{source}: field 'meta.errors' must be a list")
    for name in _KEYED_SECTIONS:
        for key, entry in sections.get(name, {}).items():
            if not isinstance(entry, dict):
                kind = yaml_kind(entry)
                raise ManifestError(f"{source}: field '{name}.{key}' must be a mapping, got {kind}")
    for section, fields in _ENTRY_LEAF_TYPES.items():
        for key, entry in sections.get(section, {}).items():
            _check_leaves(source, f"{section}.{key}", entry, fields)
    for name, fields in _TOP_LEAF_TYPES.items():
        _check_leaves(source, name, sections.get(name, {}), fields)
    _check_identities(source, sections)
    for i, device in enumerate(sections.get("gpu", {}).get("devices") or ()):
        if not isinstance(device, dict):
            kind = yaml_kind(device)
            raise ManifestError(f"{source}: field 'gpu.devices[{i}]' must be a mapping, got {kind}")
    # Not a fact section (no section module): how facts were found; written last.
    _check_reconstructed(source, sections.get("reconstructed") or {})
    for key, value in sections.get("env", {}).items():
        if not isinstance(value, (str, dict)):
            kind = yaml_kind(value)
            raise ManifestError(
                f"{source}: field 'env.{key}' must be a string or {{redacted: ...}}, got {kind}"
            )


def _check_identities(source: str, sections: dict[str, Any]) -> None:
    """The field that says which version an entry is, present where a snapshot always writes
    it: a repo's ``head`` (null in a repo with no commit yet; an entry that failed carries
    ``error`` instead) and a file's ``sha256`` (absent only with ``exists: false``). Deleted
    by a hand edit, the entry would read as "some unknown version" and be realized wrongly."""
    for repo, entry in sections.get("git", {}).items():
        if "head" not in entry and "error" not in entry:
            raise ManifestError(
                f"{source}: field 'git.{repo}.head' is missing (the commit checked out; "
                "null for a repo with no commit yet)"
            )
    for path, entry in sections.get("files", {}).items():
        if entry.get("sha256") is None and entry.get("exists") is not False:
            raise ManifestError(
                f"{source}: field 'files.{path}.sha256' is missing (the file's content hash; "
                "a file that did not exist says exists: false)"
            )


def _check_reconstructed(source: str, block: dict[str, Any]) -> None:
    """``reconstructed.facts.<section>.<key>`` are mappings with a known confidence."""
    if not isinstance(block, dict):
        raise ManifestError(f"{source}: field 'reconstructed' must be a mapping")
    facts = block.get("facts") or {}
    if not isinstance(facts, dict):
        raise ManifestError(f"{source}: field 'reconstructed.facts' must be a mapping")
    for section, entries in facts.items():
        if not isinstance(entries, dict):
            where = f"reconstructed.facts.{section}"
            raise ManifestError(f"{source}: field '{where}' must be a mapping")
        for key, fact in entries.items():
            where = f"reconstructed.facts.{section}.{key}"
            if not isinstance(fact, dict):
                raise ManifestError(f"{source}: field '{where}' must be a mapping")
            if fact.get("confidence") not in CONFIDENCES:
                raise ManifestError(
                    f"{source}: field '{where}.confidence' must be one of "
                    f"{', '.join(CONFIDENCES)}, got {fact.get('confidence')!r}"
                )


# The leaf fields the code reads (per entry of a keyed section, and in the plain sections),
# and the types they may have (None is always allowed: a
# fact that was not collected). A wrong type is refused at load with the field's full name,
# instead of a TypeError deep in diff or render.
_STR = (str,)
_INT = (int,)
_BOOL = (bool,)
_ENTRY_LEAF_TYPES: dict[str, dict[str, tuple[type, ...]]] = {
    "packages": {
        "version": _STR,
        "installer": _STR,
        "editable": _BOOL,
        "direct_url": (str, dict),
    },
    "git": {"head": _STR, "branch": _STR, "dirty": _BOOL, "diff_sha256": _STR},
    "files": {"sha256": _STR, "size": _INT, "blob": _STR},
    "data": {"size": _INT, "records": _INT, "fingerprint": _STR},
    "caches": {
        "path": _STR,
        "source": _STR,
        "exists": _BOOL,
        "files": _INT,
        "bytes": _INT,
        "digest": _STR,
        "subdirs": (dict,),
        "kept": (dict,),
    },
    "probes": {"status": _STR, "code_sha256": _STR},
}
_TOP_LEAF_TYPES: dict[str, dict[str, tuple[type, ...]]] = {
    "python": {"version": _STR, "implementation": _STR, "executable": _STR, "prefix": _STR},
    "torch": {"version": _STR, "git_version": _STR},
    "gpu": {"devices": (list,)},
}


def _check_leaves(source: str, where: str, entry: Any, fields: dict[str, tuple[type, ...]]) -> None:
    if not isinstance(entry, dict):
        return
    for field, types in fields.items():
        value = entry.get(field)
        if value is None:
            continue
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            want = " or ".join(yaml_type(t) for t in types)
            kind = yaml_kind(value)
            raise ManifestError(f"{source}: field '{where}.{field}' must be {want}, got {kind}")


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


# Bumped when loading gets stricter: a parse cached by an older, laxer loader (duplicate
# keys silently merged) must not stand in for the file.
_CACHE_VERSION = "v2"


def _cache_path(raw: bytes) -> Path:
    return parse_cache_dir() / f"{hashlib.sha256(raw).hexdigest()}.{_CACHE_VERSION}.json"


def _cache_store(raw: bytes, data: Any) -> None:
    """Best effort: a cache that cannot be written only costs speed next time."""
    if len(raw) < PARSE_CACHE_MIN_BYTES:
        return
    with contextlib.suppress(OSError, TypeError, ValueError):
        atomic_write_text(_cache_path(raw), json.dumps(data))


def _json_marker(raw: bytes) -> Path:
    return parse_cache_dir() / f"{hashlib.sha256(raw).hexdigest()}.{_CACHE_VERSION}.json-checked"


def _json_checked(raw: bytes) -> bool:
    return len(raw) >= PARSE_CACHE_MIN_BYTES and _json_marker(raw).exists()


def _json_mark_checked(raw: bytes) -> None:
    if len(raw) < PARSE_CACHE_MIN_BYTES:
        return
    with contextlib.suppress(OSError):
        atomic_write_bytes(_json_marker(raw), b"")


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
        raw = read_bounded(p, max_bytes())
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError(f"{p}: not a text file") from None
    except YamlRefused as exc:
        raise ManifestError(f"{p}: {exc}") from None
    data: Any = _cache_lookup(raw)
    try:
        if data is None and text.lstrip().startswith("{"):
            # JSON is YAML, and a 20,000-entry manifest parses ~80x faster as JSON than
            # through libyaml; anything that is not strict JSON falls through to YAML.
            # The duplicate-key check triples JSON's cost: a large file that passed it once
            # is remembered (an empty marker keyed by its sha256) and then read plainly.
            if _json_checked(raw):
                with contextlib.suppress(ValueError):
                    data = json.loads(text)
            if data is None:
                data = parse_json(text)
                if data is not None:
                    _json_mark_checked(raw)
        if data is None:
            data = parse_yaml(text)
            _cache_store(raw, data)
    except YamlRefused as exc:
        raise ManifestError(f"{p}: {exc}") from None
    return Manifest.from_dict(data, str(p), path=p)


def save(manifest: Manifest, path: Path) -> Path:
    """Write ``manifest`` atomically as YAML to ``path`` (and prime the parse cache)."""
    raw = manifest.to_yaml().encode("utf-8")
    atomic_write_bytes(path, raw)
    _cache_store(raw, manifest.as_dict())
    return path
