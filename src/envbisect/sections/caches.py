"""``caches``: compile caches by name (``inductor``, ``triton``), ``{path, source, exists,
files, bytes, digest, subdirs}``. A change is a cache that was emptied, filled, moved or
whose subdirectories changed; a digest that moved with only mtimes is volatile. Realized as
a fresh (cold) or copied (warm) cache dir per trial, pointed to by the cache's environment
variable (its realizer, below).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envbisect.agent.cache_keep import read_tree
from envbisect.model.changes import EntryPair, Found, Unit, human_bytes
from envbisect.model.files import FileEntry
from envbisect.model.manifest import Manifest
from envbisect.model.plan import CacheDir, Context, FactQuery, Plan, Sandbox, Values
from envbisect.sections import DiffContext, KeyedSection, register

CACHE_ENV = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}


@dataclass(frozen=True)
class CacheEntry:
    """A ``caches:`` entry: the directory and what it held."""

    path: Any = None
    exists: Any = None
    files: Any = None
    bytes: Any = None
    subdirs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Any) -> CacheEntry | None:
        """The entry of ``value`` (None when the state recorded no such cache)."""
        return cls.read(value) if isinstance(value, Mapping) else None

    @classmethod
    def read(cls, raw: Mapping[str, Any]) -> CacheEntry:
        """The entry of a recorded cache."""
        return cls(
            raw.get("path"),
            raw.get("exists"),
            raw.get("files"),
            raw.get("bytes"),
            raw.get("subdirs") or {},
        )

    @property
    def warm(self) -> bool:
        """True when the cache held files (the file count when known, else its bytes)."""
        if self.exists is False:
            return False
        return bool(self.files) if self.files is not None else bool(self.bytes)

    def describe(self) -> str:
        """``N files, SIZE`` / ``empty`` / ``missing``."""
        if self.exists is False:
            return "missing"
        if self.files == 0:
            return "empty"
        if isinstance(self.files, int):
            return f"{self.files:,} files, {human_bytes(self.bytes)}"
        return human_bytes(self.bytes)

    def facts(self) -> tuple[Any, Any, Any]:
        return (self.exists, self.files, self.bytes)


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


def _notes(old: CacheEntry, new: CacheEntry, shown: tuple[Any, Any]) -> tuple[list[str], int]:
    """What changed beyond the digest, and how many subdirectories changed by digest only."""
    notes = []
    if old.path != new.path:
        notes.append(f"path {old.path} → {new.path}")
    added, removed, changed, digest_only = _subdir_counts(old.subdirs, new.subdirs)
    if added or removed or changed:
        notes.append(f"subdirs +{added} -{removed} ~{changed}")
    if shown[1] == "empty" and shown[0] not in ("empty", "missing"):
        notes.insert(0, "emptied (cold cache)")
    return notes, digest_only


def kept_tree(ctx: Context, manifest: Manifest, value: Any) -> Path | None:
    """The tree blob of a cache's kept content, when it and every file it lists are stored
    on this machine (``agent.cache_keep``); else None."""
    kept = value.get("kept") if isinstance(value, Mapping) else None
    sha = kept.get("tree") if isinstance(kept, Mapping) else None
    if not isinstance(sha, str) or not sha:
        return None
    path = ctx.blob(manifest, FileEntry(sha256=sha, blob=sha))
    return path if path is not None and _complete(str(path)) else None


@functools.lru_cache(maxsize=64)
def _complete(tree: str) -> bool:
    """Every file a tree blob lists is stored beside it (checked once per tree)."""
    try:
        with open(tree, "rb") as fh:
            listed = read_tree(fh.read())
    except (OSError, ValueError):
        return False
    here = Path(tree).parent
    return all((here / sha).is_file() for _rel, sha, _mode in listed)


def is_warm(value: Any) -> bool:
    """True when ``value`` (a raw ``caches:`` entry) is a warm cache."""
    entry = CacheEntry.of(value)
    return entry is not None and entry.warm


# ---- realizing-------------------------------------------------------------------------


class CachesRealizer:
    """A compile cache that is part of the diff points into the trial's sandbox: a copy of
    the dir the snapshot recorded (warm) or a fresh empty one (cold), removed when the trial
    ends (``Actuator.realize``). A cache that did not change is the same in every state:
    trials use it where the snapshot found it (its variable pointed there), as the user's
    own runs do, and nothing is copied (a copy of a multi-GB default inductor cache per
    trial filled disks); a user's command run locally gets the shared cache of its compiled
    code instead (``run.compilecache``)."""

    section = "caches"

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None:
        for value in (old, new):
            entry = CacheEntry.of(value)
            if entry is not None and entry.path:
                query.dirs.add(entry.path)

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None:
        # A warm cache whose files are gone is no blocker: it is made again (see ``plan``).
        if key not in CACHE_ENV:
            return f"caches {key}: no environment variable points it elsewhere"
        return None

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan:
        dirs: list[CacheDir] = []
        env: dict[str, str] = {}
        for name, var in CACHE_ENV.items():
            if name not in values:
                # Not a change: the cache where the snapshot found it, used in place.
                recorded = CacheEntry.of(ctx.bad.section("caches").get(name))
                if recorded is not None and isinstance(recorded.path, str) and recorded.path:
                    env[var] = recorded.path
                continue
            value = values[name][1]
            entry = CacheEntry.of(value)
            warm = (entry.path or "") if entry is not None and is_warm(value) else None
            dest = f"{sandbox.trial}/caches/{name}"
            tree = kept_tree(ctx, values[name][0], value) if warm is not None else None
            if tree is not None:
                # The snapshot kept its content: made again exactly, whatever the dir holds now.
                dirs.append(CacheDir(name, dest, None, tree=str(tree)))
            else:
                # The recorded warm dir no longer holds files: warm is made by a run.
                fill = warm is not None and not ctx.facts().dirs.get(warm)
                dirs.append(CacheDir(name, dest, None if fill else warm, fill=fill))
            env[var] = dirs[-1].dest
        return replace(plan, caches=plan.caches + tuple(dirs)).with_env(env)


@register
class Caches(KeyedSection):
    name = "caches"
    word = "cache"
    bisectable = True
    realizer = CachesRealizer()

    def describe(self, raw: dict[str, Any]) -> str:
        return CacheEntry.read(raw).describe()

    def regroup(self, units: list[Unit], ctx: DiffContext) -> list[Unit]:
        """A cache whose variable moved (TORCHINDUCTOR_CACHE_DIR /a → /b) is one unit: the
        variable's change joins the cache's, whose realizer points it into the trial."""
        by_var = {var: name for name, var in CACHE_ENV.items()}
        caches = {u.changes[0].key: i for i, u in enumerate(units) if u.section == self.name}
        out = list(units)
        for unit in units:
            name = by_var.get(unit.changes[0].key) if unit.section == "env" else None
            if name is None or name not in caches or len(unit.changes) != 1:
                continue
            i = caches[name]
            out[i] = replace(out[i], changes=out[i].changes + unit.changes)
            out.remove(unit)
        return out

    def judge_both(self, pair: EntryPair, old: dict[str, Any], new: dict[str, Any]) -> Found:
        was, now = CacheEntry.read(old), CacheEntry.read(new)
        notes, digest_only = _notes(was, now, (pair.shown_old, pair.shown_new))
        if notes or was.facts() != now.facts() or pair.shown_old != pair.shown_new:
            return Found(pair.change(self.name, "; ".join(notes) or None))
        # Same files, sizes and subdirectories: only mtimes moved the digest.
        note = "digest only (mtimes)"
        if digest_only:
            note += f", {digest_only} subdirs"
        return Found(pair.change(self.name, note), volatile=True)
