"""Two manifests -> Changes -> Units that bisection moves as one.

A **Change** is one fact that differs: ``section``, ``key``, ``old``, ``new`` and a
:class:`ChangeKind`. ``old``/``new`` hold the *compared* value in readable form (the full
entries stay in ``DiffResult.good`` / ``DiffResult.bad``):

- ``packages``: the version string; versions are compared with ``packaging.version``, and a
  change of the local label (``2.10.0+cu128`` -> ``2.11.0+cu130``) is an upgrade whose
  ``note`` says ``CUDA variant cu128 → cu130``;
- ``files``: the sha256; ``git``: ``head (branch)`` plus ``+uncommitted <hash>`` when dirty;
  ``data``: records and size; ``caches``: ``N files, SIZE`` / ``empty`` / ``missing``;
- ``env``: the value, or ``{"redacted": hex}``: redacted values compare by their hash only
  (a plain value on one side is hashed and compared to the other side's prefix). A plain
  value that a snapshot would redact today (an older or hand-written manifest) is shown
  redacted too, by the same rules (``envbisect.agent.redact``), and treated as redacted;
- ``probes``: the status (``original`` / ``patched`` / ``missing``);
- ``system`` / ``python`` / ``torch`` / ``gpu``: the scalar value (GPU devices as a summary).

A **Unit** is what bisection toggles. The *torch stack* (torch, triton, pytorch-triton,
torchvision, torchaudio, every ``nvidia-*`` and ``cuda-*`` wheel, and the ``torch`` section's
CUDA/cuDNN/NCCL facts) is one unit, because these wheels pin each other; torchvision and
torchaudio are in it since each pins one exact torch. Every other package, env var, file, git
repo, data entry, cache and probe is its own unit.

Bisectable or not (``reason`` says why, in plain words):

- ``system``, ``gpu``, ``python`` facts: never; a kernel, driver, GPU model or interpreter is
  not re-created by swapping software in a sandbox. They are reported.
- ``files``: when the file was added, or when either manifest stored its content (``blob``).
- ``git``: unless the good side had uncommitted changes (known by hash only).
- ``env``: unless the good value is redacted (it cannot be set again).
- ``data``: marked bisectable with a ``reason`` note: it is realizable only where
  envbisect.yaml's ``data_map`` says where the old dataset lives, which ``run`` checks; diff
  does not read the config.
- ``probes``: never on their own. A probe shows the *effect* of code (a monkeypatch, an edited
  module); the cause is a file, package or repo unit, which bisection moves instead, and the
  probe is re-observed in each trial. When the probe's module file is itself a changed file,
  the reason names that unit.

A fact present on one side and missing on the other *because collecting it failed there*
(an entry in that side's ``meta.errors``, e.g. a hung ``nvidia-smi``) is no change: its note
says so and its unit is never bisectable.

Volatile facts (``meta``: created time, elapsed, host; mtimes; the package ``installer``;
cache digests when files, sizes and subdirectories are unchanged, i.e. only mtimes moved) are
left out unless ``include_volatile=True``; ``DiffResult.hidden`` counts them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from packaging.version import InvalidVersion, Version

from envbisect.agent.redact import is_redacted, redact_env
from envbisect.errors import ManifestError, UsageError
from envbisect.manifest import Manifest


class ChangeKind(str, Enum):
    """How one fact differs from the good side to the bad side."""

    ADDED = "added"
    REMOVED = "removed"
    UPGRADED = "upgraded"
    DOWNGRADED = "downgraded"
    CHANGED = "changed"


@dataclass(frozen=True)
class Change:
    """One fact that differs between the good and the bad manifest."""

    section: str
    key: str
    old: Any
    new: Any
    kind: ChangeKind
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "key": self.key,
            "old": self.old,
            "new": self.new,
            "kind": self.kind.value,
            "note": self.note,
        }


@dataclass(frozen=True)
class Unit:
    """Changes that bisection applies or reverts together."""

    id: str
    section: str
    title: str
    changes: tuple[Change, ...]
    bisectable: bool
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "section": self.section,
            "title": self.title,
            "bisectable": self.bisectable,
            "reason": self.reason,
            "changes": [c.as_dict() for c in self.changes],
        }


# The --format json/yaml document of ``diff``; bump the number when a field changes meaning.
DIFF_SCHEMA = "envbisect/diff@1"

# Unit sections, most regression-relevant first; unknown sections follow, then meta.
SECTION_ORDER: tuple[str, ...] = (
    "torch-stack",
    "packages",
    "files",
    "git",
    "env",
    "data",
    "caches",
    "probes",
    "python",
    "system",
    "gpu",
)

# Names users may pass to --section besides unit sections (a change section).
CHANGE_SECTIONS: tuple[str, ...] = ("torch", "meta")


@dataclass(frozen=True)
class DiffResult:
    """Everything ``diff`` found. ``volatile`` holds the volatile changes left out of
    ``changes`` (empty with ``include_volatile=True``, where they are units of their own)."""

    good: Manifest
    bad: Manifest
    changes: tuple[Change, ...]
    units: tuple[Unit, ...]
    volatile: tuple[Change, ...] = ()
    sections_filter: tuple[str, ...] = field(default=())

    @property
    def hidden(self) -> int:
        """How many volatile changes were left out."""
        return len(self.volatile)

    @property
    def identical(self) -> bool:
        return not self.changes

    @property
    def bisectable(self) -> tuple[Unit, ...]:
        return tuple(u for u in self.units if u.bisectable)

    def unit(self, unit_id: str) -> Unit:
        for u in self.units:
            if u.id == unit_id:
                return u
        raise KeyError(unit_id)

    def summary(self, *, cli: bool = True) -> str:
        """E.g. ``14 changes in 6 sections → 9 bisectable units, 1 not bisectable``;
        ``cli=False`` leaves out the hint at a flag (for markdown pasted elsewhere)."""
        hint = "; --all shows them" if cli else ""
        hidden = f" ({self.hidden} volatile hidden{hint})" if self.hidden else ""
        if self.identical:
            return f"identical: no changes{hidden}"
        sections = len({c.section for c in self.changes})
        n_bis = len(self.bisectable)
        n_not = len(self.units) - n_bis
        return (
            f"{_plural(len(self.changes), 'change')} in {_plural(sections, 'section')} → "
            f"{_plural(n_bis, 'bisectable unit')}, {n_not} not bisectable{hidden}"
        )

    def select(self, sections: Iterable[str]) -> DiffResult:
        """Only the units of ``sections`` (unit sections, or change sections like ``torch``).

        Raises UsageError for a name that is no section of either manifest nor a known one.
        """
        wanted = tuple(dict.fromkeys(sections))
        if not wanted:
            return self
        known = set(SECTION_ORDER) | set(CHANGE_SECTIONS)
        known |= set(self.good.sections) | set(self.bad.sections)
        unknown = [s for s in wanted if s not in known]
        if unknown:
            raise UsageError(
                f"--section {unknown[0]!r} is not a section; choose from: "
                + ", ".join(sorted(known))
            )
        units = tuple(
            u
            for u in self.units
            if u.section in wanted or any(c.section in wanted for c in u.changes)
        )
        changes = tuple(c for u in units for c in u.changes)
        kept = {c.section for c in changes} | set(wanted)
        volatile = tuple(c for c in self.volatile if c.section in kept)
        return replace(
            self, changes=changes, units=units, volatile=volatile, sections_filter=wanted
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": DIFF_SCHEMA,
            "good": _side(self.good),
            "bad": _side(self.bad),
            "identical": self.identical,
            "summary": self.summary(),
            "hidden_volatile": self.hidden,
            "units": [u.as_dict() for u in self.units],
        }


def _side(m: Manifest) -> dict[str, Any]:
    meta = m.section("meta")
    return {
        "path": str(m.path) if m.path else None,
        "label": m.label,
        "created": meta.get("created"),
        "host": meta.get("host"),
    }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# --------------------------------------------------------------------------- versions

_VARIANT_PREFIXES = ("cu", "rocm", "cpu", "xpu", "hip")


def compare_versions(old: Any, new: Any) -> tuple[ChangeKind, str | None]:
    """Kind of a version change; the note names a changed local label (build variant)."""
    try:
        vo, vn = Version(str(old)), Version(str(new))
    except InvalidVersion:
        return ChangeKind.CHANGED, None
    note = _variant_note(vo.local, vn.local)
    po, pn = Version(vo.public), Version(vn.public)
    if pn > po:
        return ChangeKind.UPGRADED, note
    if pn < po:
        return ChangeKind.DOWNGRADED, note
    return ChangeKind.CHANGED, note


def _variant_note(old: str | None, new: str | None) -> str | None:
    if old == new:
        return None
    if old and new and old.startswith("cu") and new.startswith("cu"):
        return f"CUDA variant {old} → {new}"
    labels = [x for x in (old, new) if x]
    if any(x.startswith(_VARIANT_PREFIXES) for x in labels):
        return f"build variant {old or '(none)'} → {new or '(none)'}"
    return f"local label {old or '(none)'} → {new or '(none)'}"


# --------------------------------------------------------------------------- helpers

VOLATILE_KEYS = frozenset(
    {"created", "elapsed_s", "host", "hostname", "uptime_s", "boot_time", "mtime", "mtime_ns"}
    | {"ctime", "atime", "ctime_ns", "atime_ns"}
)
_VERSIONED_KEYS = frozenset(
    {"version", "cuda", "hip", "cudnn", "nccl", "triton", "driver", "cuda_driver"}
)
_TORCH_STACK_NAMES = frozenset(
    {"torch", "triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"}
    | {"torchvision", "torchaudio"}
)

# (Change, volatile) pairs; volatile ones are dropped unless asked for.
_Found = tuple[Change, bool]


def is_torch_stack(package: str) -> bool:
    """Whether a (normalised) package name moves with torch."""
    return (
        package in _TORCH_STACK_NAMES
        or package.startswith("nvidia-")
        or package.startswith("cuda-")
    )


def _entry(source: str, section: str, key: str, value: Any) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    raise ManifestError(
        f"{source}: field '{section}.{key}' must be a mapping, got {type(value).__name__}"
    )


def _human_bytes(n: Any) -> str:
    if not isinstance(n, int | float):
        return "? bytes"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"  # pragma: no cover - the loop always returns


def _error_of(entry: Mapping[str, Any] | None) -> str | None:
    if entry and entry.get("error"):
        return f"error: {entry['error']}"
    return None


def _scalar_change(section: str, key: str, old: Any, new: Any) -> Change:
    if old is None:
        return Change(section, key, None, new, ChangeKind.ADDED)
    if new is None:
        return Change(section, key, old, None, ChangeKind.REMOVED)
    if key in _VERSIONED_KEYS and isinstance(old, str | int) and isinstance(new, str | int):
        kind, note = compare_versions(old, new)
        return Change(section, key, old, new, kind, note)
    return Change(section, key, old, new, ChangeKind.CHANGED)


def _add_remove(section: str, key: str, old: Any, new: Any) -> ChangeKind:
    if old is None:
        return ChangeKind.ADDED
    if new is None:
        return ChangeKind.REMOVED
    return ChangeKind.CHANGED


def _keys(g: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    # Good's order first, then what only bad has: stable and close to the files' order.
    return list(g) + [k for k in b if k not in g]


def _differing(g: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[tuple[str, Any, Any]]:
    """``(key, old, new)`` for every key whose raw values differ, in ``_keys`` order."""
    for key in _keys(g, b):
        old, new = g.get(key), b.get(key)
        if old == new:
            continue
        yield key, old, new


# (source, key, raw value) -> the entry as a mapping, or None where the side lacks it.
_ReadEntry = Callable[[str, str, Any], dict[str, Any] | None]
# (key, old entry, new entry, added/removed/changed, old compared value, new compared value)
_EntryPair = tuple[str, dict[str, Any] | None, dict[str, Any] | None, ChangeKind, Any, Any]


def _entry_pairs(
    section: str,
    src: tuple[str, str],
    g: Mapping[str, Any],
    b: Mapping[str, Any],
    compared: Callable[[dict[str, Any]], Any],
    read: _ReadEntry | None = None,
) -> Iterator[_EntryPair]:
    """The entries of a mapping-valued section that differ, read on both sides.

    ``read`` turns a raw value into an entry (default: ``_entry``, which raises ManifestError
    for a non-mapping); ``compared`` gives the value a Change shows for a present entry.
    """
    for key, old_raw, new_raw in _differing(g, b):
        if read is None:
            old = _entry(src[0], section, key, old_raw)
            new = _entry(src[1], section, key, new_raw)
        else:
            old = read(src[0], key, old_raw)
            new = read(src[1], key, new_raw)
        kind = _add_remove(section, key, old, new)
        ov = None if old is None else compared(old)
        nv = None if new is None else compared(new)
        yield key, old, new, kind, ov, nv


# --------------------------------------------------------------------------- sections


def _diff_scalars(section: str, g: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[_Found]:
    for key, old, new in _differing(g, b):
        yield _scalar_change(section, key, old, new), section == "meta" or key in VOLATILE_KEYS


def _diff_packages(
    src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
) -> Iterator[_Found]:
    pairs = _entry_pairs("packages", src, g, b, _version_of, read=_package_entry)
    for name, old, new, kind, ov, nv in pairs:
        if old is None or new is None:
            yield Change("packages", name, ov, nv, kind), False
            continue
        if ov != nv:
            kind, note = compare_versions(ov, nv)
            yield Change("packages", name, ov, nv, kind, note), False
            continue
        fields = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        real = [f for f in fields if f != "installer" and f not in VOLATILE_KEYS]
        if real:
            notes = []
            for f in real:
                if f == "editable":
                    notes.append("editable install" if new.get(f) else "no longer editable")
                else:
                    notes.append(f"{f} {old.get(f)!r} → {new.get(f)!r}")
            yield Change("packages", name, ov, nv, ChangeKind.CHANGED, "; ".join(notes)), False
        else:
            note = f"only {', '.join(fields)} differs"
            yield Change("packages", name, ov, nv, ChangeKind.CHANGED, note), True


def _version_of(entry: Mapping[str, Any]) -> Any:
    return entry.get("version")


def _package_entry(source: str, name: str, value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):  # tolerate a bare version string
        return {"version": value}
    return _entry(source, "packages", name, value)


def _strip_volatile(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    return {k: v for k, v in entry.items() if k not in VOLATILE_KEYS}


def _sha256_of(entry: Mapping[str, Any]) -> Any:
    return _error_of(entry) or entry.get("sha256")


def _diff_files(
    src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
) -> Iterator[_Found]:
    for path, old, new, kind, ov, nv in _entry_pairs("files", src, g, b, _sha256_of):
        if old is not None and new is not None:
            same_content = ov == nv and old.get("size") == new.get("size")
            if same_content:
                # Only an mtime or the stored blob differs: the file itself did not change.
                yield Change("files", path, ov, nv, kind, "only metadata differs"), True
                continue
        note = None
        if old is not None and new is not None and old.get("size") != new.get("size"):
            note = f"size {old.get('size')} → {new.get('size')} bytes"
        yield Change("files", path, ov, nv, kind, note), False


def _git_desc(entry: Mapping[str, Any]) -> str:
    err = _error_of(entry)
    if err:
        return err
    head = str(entry.get("head") or "?")[:12]
    branch = entry.get("branch")
    text = f"{head} ({branch})" if branch else head
    if entry.get("dirty"):
        text += f" +uncommitted {str(entry.get('diff_sha256') or '?')[:8]}"
    return text


def _diff_git(src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[_Found]:
    for repo, old, new, kind, ov, nv in _entry_pairs("git", src, g, b, _git_desc):
        notes = []
        if old is not None and new is not None:
            if old.get("untracked") != new.get("untracked"):
                notes.append(
                    f"untracked {_count(old.get('untracked'))} → {_count(new.get('untracked'))}"
                )
            if ov == nv and not notes:
                yield Change("git", repo, ov, nv, kind, "only metadata differs"), True
                continue
        yield Change("git", repo, ov, nv, kind, "; ".join(notes) or None), False


def _count(value: Any) -> Any:
    return len(value) if isinstance(value, list | tuple | dict) else value


def _data_desc(entry: Mapping[str, Any]) -> str:
    err = _error_of(entry)
    if err:
        return err
    records = entry.get("records")
    size = _human_bytes(entry.get("size"))
    if isinstance(records, int):
        return f"{records:,} records, {size}"
    return size


def _diff_data(
    src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
) -> Iterator[_Found]:
    for path, old, new, kind, ov, nv in _entry_pairs("data", src, g, b, _data_desc):
        if old is not None and new is not None and _strip_volatile(old) == _strip_volatile(new):
            yield Change("data", path, ov, nv, kind, "only metadata differs"), True
            continue
        note = None
        if ov == nv and old is not None and new is not None:
            note = "same size and records, different content (fingerprint)"
        yield Change("data", path, ov, nv, kind, note), False


def _cache_desc(entry: Mapping[str, Any]) -> str:
    err = _error_of(entry)
    if err:
        return err
    if entry.get("exists") is False:
        return "missing"
    files = entry.get("files")
    if files == 0:
        return "empty"
    if isinstance(files, int):
        return f"{files:,} files, {_human_bytes(entry.get('bytes'))}"
    return _human_bytes(entry.get("bytes"))


def _subdir_counts(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(added, removed, changed in size/count, changed by digest only) subdirectories."""
    added = sum(1 for k in new if k not in old)
    removed = sum(1 for k in old if k not in new)
    changed = digest_only = 0
    for k, ov in old.items():
        nv = new.get(k)
        if nv is None or nv == ov:
            continue
        both = isinstance(ov, dict) and isinstance(nv, dict)
        if both and (ov.get("files"), ov.get("bytes")) == (nv.get("files"), nv.get("bytes")):
            digest_only += 1
            continue
        changed += 1
    return added, removed, changed, digest_only


def _diff_caches(
    src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
) -> Iterator[_Found]:
    for name, old, new, kind, ov, nv in _entry_pairs("caches", src, g, b, _cache_desc):
        if old is None or new is None:
            yield Change("caches", name, ov, nv, kind), False
            continue
        notes = []
        if old.get("path") != new.get("path"):
            notes.append(f"path {old.get('path')} → {new.get('path')}")
        os_, ns_ = old.get("subdirs") or {}, new.get("subdirs") or {}
        added, removed, changed, digest_only = _subdir_counts(os_, ns_)
        if added or removed or changed:
            notes.append(f"subdirs +{added} -{removed} ~{changed}")
        if nv == "empty" and ov not in ("empty", "missing"):
            notes.insert(0, "emptied (cold cache)")
        facts = ("exists", "files", "bytes")
        if not notes and all(old.get(f) == new.get(f) for f in facts) and ov == nv:
            # Same files, sizes and subdirectories: only mtimes moved the digest.
            note = "digest only (mtimes)"
            if digest_only:
                note += f", {digest_only} subdirs"
            yield Change("caches", name, ov, nv, kind, note), True
            continue
        yield Change("caches", name, ov, nv, kind, "; ".join(notes) or None), False


def _is_redacted(value: Any) -> bool:
    return is_redacted(value)


def _env_shown(name: str, value: Any) -> Any:
    return redact_env(name, value) if isinstance(value, str) else value


def _env_equal(old: Any, new: Any) -> bool:
    if old == new:
        return True
    for red, plain in ((old, new), (new, old)):
        if _is_redacted(red) and isinstance(plain, str):
            prefix = str(red["redacted"])
            return hashlib.sha256(plain.encode()).hexdigest()[: len(prefix)] == prefix
    return False


def _diff_env(g: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[_Found]:
    for name in _keys(g, b):
        old, new = g.get(name), b.get(name)
        if name in g and name in b and _env_equal(old, new):
            continue
        kind = ChangeKind.ADDED if name not in g else ChangeKind.REMOVED if name not in b else None
        old, new = _env_shown(name, old), _env_shown(name, new)
        note = "redacted: compared by hash" if _is_redacted(old) or _is_redacted(new) else None
        yield Change("env", name, old, new, kind or ChangeKind.CHANGED, note), False


def _status_of(entry: Mapping[str, Any]) -> Any:
    return _error_of(entry) or entry.get("status")


def _diff_probes(
    src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
) -> Iterator[_Found]:
    for name, old, new, kind, ov, nv in _entry_pairs("probes", src, g, b, _status_of):
        note = None
        if old is not None and new is not None:
            if _strip_volatile(old) == _strip_volatile(new):
                yield Change("probes", name, ov, nv, kind, "only metadata differs"), True
                continue
            if old.get("code_sha256") != new.get("code_sha256"):
                note = "code changed"
            if old.get("module_file") != new.get("module_file"):
                note = (note + "; " if note else "") + "defined in another file"
        yield Change("probes", name, ov, nv, kind, note), False


def _devices_desc(devices: Any) -> Any:
    if not isinstance(devices, list):
        return devices
    names: dict[str, int] = {}
    for d in devices:
        if isinstance(d, dict):
            label = str(d.get("name", "?"))
            if d.get("memory_mib"):
                label += f" ({d['memory_mib']} MiB)"
        else:
            label = str(d)
        names[label] = names.get(label, 0) + 1
    return ", ".join(f"{n} × {label}" for label, n in names.items()) or "none"


def _diff_gpu(g: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[_Found]:
    for key, old, new in _differing(g, b):
        if key == "devices":
            ov, nv = _devices_desc(old), _devices_desc(new)
            kind = _add_remove("gpu", key, old, new)
            note = None if ov != nv else "device details differ"
            yield Change("gpu", key, ov, nv, kind, note), False
        else:
            yield _scalar_change("gpu", key, old, new), key in VOLATILE_KEYS


def _diff_generic(section: str, g: Any, b: Any) -> Iterator[_Found]:
    if isinstance(g, dict) and isinstance(b, dict):
        for key, old, new in _differing(g, b):
            yield _scalar_change(section, str(key), old, new), False
    elif g != b:
        yield _scalar_change(section, section, g, b), False


# --------------------------------------------------------------------------- units

_SYSTEM_REASONS = {
    "kernel": "the kernel belongs to the machine; swapping software in a sandbox cannot change it",
    "os": "the operating system release belongs to the machine image; envbisect cannot swap it",
    "libc": "the C library comes with the OS image; envbisect cannot swap it",
    "arch": "another CPU architecture is another machine",
    "cpu_model": "another CPU is hardware, not software",
    "cpu_count": "a different CPU count is hardware (or a container limit), not software",
    "mem_total_bytes": "a different amount of memory is hardware, not software",
}
_GPU_REASONS = {
    "driver": "the NVIDIA driver lives in the host kernel; envbisect cannot swap it per trial",
    "cuda_driver": "the driver's CUDA version comes with the driver; envbisect cannot swap it",
    "devices": "another GPU model or count is hardware; swapping software cannot re-create it",
}
_PYTHON_REASONS = {
    "version": "another Python version needs another interpreter; envbisect builds trial venvs "
    "with one interpreter and does not re-create the other (rebuild the venv by hand)",
    "implementation": "another Python implementation needs another interpreter",
}


def _unit_for(change: Change) -> Unit:
    s, k = change.section, change.key
    one = (change,)
    if s == "packages":
        return Unit(f"packages:{k}", "packages", f"package {k}", one, True)
    if s == "env":
        if change.kind is not ChangeKind.ADDED and _is_redacted(change.old):
            reason = "the good value is redacted in the manifest, so it cannot be set again"
            return Unit(f"env:{k}", "env", f"env {k}", one, False, reason)
        return Unit(f"env:{k}", "env", f"env {k}", one, True)
    if s == "files":
        return Unit(f"files:{k}", "files", f"file {k}", one, True)  # blob check in _units
    if s == "git":
        return Unit(f"git:{k}", "git", f"git repo {k}", one, True)  # dirty check in _units
    if s == "data":
        reason = (
            "bisectable only where envbisect.yaml's data_map says where the old dataset lives; "
            "run decides"
        )
        return Unit(f"data:{k}", "data", f"data {k}", one, True, reason)
    if s == "caches":
        return Unit(f"caches:{k}", "caches", f"cache {k}", one, True)
    if s == "probes":
        return Unit(f"probes:{k}", "probes", f"probe {k}", one, False, _PROBE_REASON)
    if s == "system":
        reason = _SYSTEM_REASONS.get(k, "a fact of the machine; envbisect can only report it")
        return Unit(f"system:{k}", "system", f"system {k}", one, False, reason)
    if s == "gpu":
        reason = _GPU_REASONS.get(k, "a fact of the GPU; envbisect can only report it")
        return Unit(f"gpu:{k}", "gpu", f"gpu {k}", one, False, reason)
    if s == "python":
        reason = _PYTHON_REASONS.get(
            k, "the interpreter itself differs; what differs inside it is listed under packages"
        )
        return Unit(f"python:{k}", "python", f"python {k}", one, False, reason)
    if s == "meta":
        return Unit(f"meta:{k}", "meta", f"meta {k}", one, False, _VOLATILE_REASON)
    reason = f"envbisect has no way to re-create facts of section '{s}'"
    return Unit(f"{s}:{k}", s, f"{s} {k}", one, False, reason)


_PROBE_REASON = (
    "a probe shows the effect of code changed elsewhere (a file, a package, a repo); "
    "bisection moves that cause and re-checks the probe in each trial"
)


def _refine(unit: Unit, good: Manifest, bad: Manifest, changed_files: set[str]) -> Unit:
    """Bisectability that needs the full entries, not just the change."""
    change = unit.changes[0]
    if unit.section == "files" and change.kind is not ChangeKind.ADDED:
        g = good.section("files").get(change.key) or {}
        b = bad.section("files").get(change.key) or {}
        if not (isinstance(g, dict) and g.get("blob")) and not (
            isinstance(b, dict) and b.get("blob")
        ):
            reason = (
                "neither manifest stored the file's content (snapshot with keep_blobs: true "
                "in envbisect.yaml)"
            )
            return replace(unit, bisectable=False, reason=reason)
    if unit.section == "git" and change.kind is not ChangeKind.ADDED:
        g = good.section("git").get(change.key) or {}
        if isinstance(g, dict) and g.get("dirty"):
            reason = (
                "the good side had uncommitted changes, which a manifest records by hash only; "
                "commit them to make this repo bisectable"
            )
            return replace(unit, bisectable=False, reason=reason)
    if unit.section == "probes":
        entry = bad.section("probes").get(change.key) or good.section("probes").get(change.key)
        module_file = entry.get("module_file") if isinstance(entry, dict) else None
        if isinstance(module_file, str) and module_file in changed_files:
            reason = (
                f"follows files:{module_file}: bisection moves that file, "
                "and the probe is re-checked in each trial"
            )
            return replace(unit, reason=reason)
    return unit


def _torch_title(changes: tuple[Change, ...]) -> str:
    for c in changes:
        if c.section == "packages" and c.key == "torch":
            return f"torch stack (torch {c.old or '-'} → {c.new or '-'})"
    for c in changes:
        if c.section == "torch" and c.key == "version":
            return f"torch stack (torch {c.old or '-'} → {c.new or '-'})"
    return "torch stack"


_STACK_HEADLINE = ("torch", "triton", "pytorch-triton", "torchvision", "torchaudio")


def _stack_rank(change: Change) -> tuple[int, str]:
    """Headline wheels first, then torch's build facts, then the CUDA wheels by name."""
    if change.section == "packages" and change.key in _STACK_HEADLINE:
        return (0, f"{_STACK_HEADLINE.index(change.key):02d}")
    if change.section == "torch":
        return (1, "")  # stable sort keeps the manifest's fact order
    return (2, change.key)


def _section_rank(section: str) -> int:
    if section in SECTION_ORDER:
        return SECTION_ORDER.index(section)
    if section == "meta":
        return len(SECTION_ORDER) + 1
    return len(SECTION_ORDER)


_VOLATILE_REASON = "volatile: differs between snapshots without changing what runs (--all)"


def _build_units(
    changes: list[Change],
    good: Manifest,
    bad: Manifest,
    volatile: set[int],
    uncollected: dict[int, str],
    data_map: Mapping[str, str] | None = None,
) -> list[Unit]:
    stack = tuple(
        c
        for c in changes
        if c.section == "torch" or (c.section == "packages" and is_torch_stack(c.key))
    )
    changed_files = {c.key for c in changes if c.section == "files"}
    units: list[Unit] = []
    if stack:
        stack = tuple(sorted(stack, key=_stack_rank))
        units.append(Unit("torch-stack", "torch-stack", _torch_title(stack), stack, True))
    stack_ids = {id(c) for c in stack}
    for change in changes:
        if id(change) in stack_ids:
            continue
        unit = _refine(_unit_for(change), good, bad, changed_files)
        if id(change) in volatile:
            unit = replace(unit, bisectable=False, reason=_VOLATILE_REASON)
        elif id(change) in uncollected:
            unit = replace(unit, bisectable=False, reason=uncollected[id(change)])
        units.append(unit)
    units = _fold_committed_files(units, good, bad)
    if data_map:
        units = [_data_mapped(u, data_map) for u in units]
    # Stable sort: section rank, then the order the changes were found in.
    units.sort(key=lambda u: _section_rank(u.section))
    return units


COMMITTED_NOTE = "committed in this repo: moves with its commits"


def repo_of(path: str, repos: Iterable[str]) -> str | None:
    """The recorded repo that holds ``path`` (the innermost one), or None."""
    inside = [r for r in repos if path.startswith(r.rstrip("/") + "/")]
    return max(inside, key=len) if inside else None


def _fold_committed_files(units: list[Unit], good: Manifest, bad: Manifest) -> list[Unit]:
    """A file tracked by a recorded repo whose commit changed is part of that repo's unit:
    with both sides clean its content is the commits' content, and counting it again as a
    ``files:`` unit would bisect the same change twice. With either side dirty or holding
    untracked files the file's change may be uncommitted, so it stays a unit of its own."""
    gits = {u.changes[0].key: u for u in units if u.section == "git" and len(u.changes) == 1}
    # Clean means nothing uncommitted *and* nothing untracked: a manifest does not say
    # whether a listed file is tracked, and an untracked one (a local config, a knob
    # file) is not in a worktree at any commit, so it must stay a unit that writes it.
    clean = {
        repo
        for repo in gits
        if all(
            not (side.section("git").get(repo) or {}).get("dirty")
            and not (side.section("git").get(repo) or {}).get("untracked")
            for side in (good, bad)
        )
    }
    if not clean:
        return units
    folded: dict[str, list[Change]] = {}
    kept: list[Unit] = []
    for unit in units:
        repo = repo_of(str(unit.changes[0].key), clean) if unit.section == "files" else None
        # Without stored content it is still realized: the worktree has it.
        if repo is not None and (
            unit.bisectable or (unit.reason or "").startswith("neither manifest stored")
        ):
            folded.setdefault(repo, []).extend(
                replace(c, note=COMMITTED_NOTE) for c in unit.changes
            )
            continue
        kept.append(unit)
    return [
        replace(u, changes=u.changes + tuple(folded[u.changes[0].key]))
        if u.section == "git" and u.changes[0].key in folded
        else u
        for u in kept
    ]


def _data_mapped(unit: Unit, data_map: Mapping[str, str]) -> Unit:
    """A data unit whose old version data_map names: say where, not "only where ..."."""
    if unit.section != "data" or unit.changes[0].key not in data_map:
        return unit
    where = data_map[unit.changes[0].key]
    return replace(unit, reason=f"the other version is at {where} (data_map); run checks it")


# --------------------------------------------------------------------------- entry point


def diff_manifests(
    good: Manifest,
    bad: Manifest,
    *,
    include_volatile: bool = False,
    data_map: Mapping[str, str] | None = None,
) -> DiffResult:
    """Compare two manifests; group what differs into units bisection can move.

    ``data_map`` (envbisect.yaml's): where old datasets live, for the data units' notes.

    Raises ManifestError (naming file and field) for an entry of the wrong type.
    """
    src = (_source(good), _source(bad))
    names = list(good.sections) + [n for n in bad.sections if n not in good.sections]
    found: list[_Found] = []
    for name in names:
        g, b = good.sections.get(name), bad.sections.get(name)
        if g == b:
            continue
        gs = g if isinstance(g, dict) else {}
        bs = b if isinstance(b, dict) else {}
        if name == "packages":
            found.extend(_diff_packages(src, gs, bs))
        elif name == "files":
            found.extend(_diff_files(src, gs, bs))
        elif name == "git":
            found.extend(_diff_git(src, gs, bs))
        elif name == "data":
            found.extend(_diff_data(src, gs, bs))
        elif name == "caches":
            found.extend(_diff_caches(src, gs, bs))
        elif name == "env":
            found.extend(_diff_env(gs, bs))
        elif name == "probes":
            found.extend(_diff_probes(src, gs, bs))
        elif name == "gpu":
            found.extend(_diff_gpu(gs, bs))
        elif name in ("meta", "system", "python", "torch"):
            found.extend(_diff_scalars(name, gs, bs))
        else:
            found.extend(_diff_generic(name, g, b))
    found, uncollected = _mark_uncollected(found, good, bad)
    kept = [c for c, volatile in found if include_volatile or not volatile]
    left_out = tuple(c for c, volatile in found if volatile and not include_volatile)
    units = _build_units(
        kept, good, bad, {id(c) for c, volatile in found if volatile}, uncollected, data_map
    )
    ordered = tuple(c for u in units for c in u.changes)
    return DiffResult(
        good=good,
        bad=bad,
        changes=ordered,
        units=tuple(units),
        volatile=left_out,
    )


def _collect_errors(m: Manifest) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    errors = m.section("meta").get("errors") or []
    for err in errors if isinstance(errors, list) else []:
        if isinstance(err, dict) and err.get("section"):
            out.setdefault(str(err["section"]), []).append(str(err.get("error", "")))
    return out


def _error_for(errors: dict[str, list[str]], section: str, key: str) -> str | None:
    """The collection error behind a missing fact: one naming the key, else a section-wide one."""
    messages = errors.get(section) or []
    for message in messages:
        if message.startswith(f"{key}:"):
            return message
    if messages and section in ("gpu", "torch", "system", "python", "packages"):
        return messages[0]  # these sections fail as a whole (nvidia-smi, torch/version.py...)
    return None


def _mark_uncollected(
    found: list[_Found], good: Manifest, bad: Manifest
) -> tuple[list[_Found], dict[int, str]]:
    """An entry missing on one side because collecting it failed there is no change.

    Its note and its unit's reason say so (from ``meta.errors``); it is never bisectable.
    """
    errors = {"good": _collect_errors(good), "bad": _collect_errors(bad)}
    if not errors["good"] and not errors["bad"]:
        return found, {}
    out: list[_Found] = []
    reasons: dict[int, str] = {}
    for change, volatile in found:
        side = {ChangeKind.REMOVED: "bad", ChangeKind.ADDED: "good"}.get(change.kind)
        message = _error_for(errors[side], change.section, change.key) if side else None
        if message is not None:
            note = f"not collected in the {side} snapshot: {message}"
            change = replace(change, note=note)
            reasons[id(change)] = (
                f"the {side} snapshot could not collect it ({message}); "
                "snapshot again once it can be read"
            )
        out.append((change, volatile))
    return out, reasons


def _source(m: Manifest) -> str:
    return str(m.path) if m.path else f"manifest {m.label!r}"
