"""What a run may touch: the paths of the user's own envbisect.yaml, never a manifest's keys.

A manifest only says *values*. Which files may be swapped, which repos get worktrees, which
caches may be copied and which datasets may be mapped is bounded by the config (``files:``
globs and ``repos:`` for files, ``repos:`` for git, ``data:`` for data, ``caches:`` plus this
user's default TorchInductor/Triton cache dirs for caches), widened only by the ``scope``
recorded in a manifest this user made on this machine (see ``envbisect.model.trust``): the
snapshot's own ``--file/--repo/--data`` arguments. Anything else is refused with its key
before the first trial.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from envbisect.model.errors import ScopeError
from envbisect.model.escape import printable
from envbisect.model.manifest import Manifest
from envbisect.model.paths import file_kind


@dataclass(frozen=True)
class Scope:
    """The absolute paths (and ``files`` globs) a run may touch, per section."""

    files: tuple[str, ...] = ()  # globs; ``**`` spans directories, ``*`` does not
    repos: tuple[str, ...] = ()
    data: tuple[str, ...] = ()
    caches: tuple[str, ...] = ()

    @classmethod
    def of_config(cls, config: Any, *, default_caches: bool = True) -> Scope:
        """The paths ``config`` (an envbisect Config, or None) names."""
        caches: list[str] = []
        if default_caches:
            from envbisect.agent.collector import default_caches as defaults

            caches += [os.path.abspath(os.path.expanduser(p)) for p, _why in defaults().values()]
        if config is None:
            return cls(caches=tuple(caches))
        return cls(
            files=tuple(str(p) for p in config.files),
            repos=tuple(str(p) for p in config.repos),
            data=tuple(str(p) for p in config.data) + tuple(str(p) for p in config.data_map),
            caches=tuple(caches) + tuple(str(p) for p in config.caches.values()),
        )

    @classmethod
    def recorded(cls, manifest: Manifest) -> Scope:
        """The scope a snapshot recorded in ``meta.scope`` (its own arguments)."""
        raw = manifest.section("meta").get("scope")
        if not isinstance(raw, Mapping):
            return cls()

        def strings(name: str) -> tuple[str, ...]:
            value = raw.get(name)
            if isinstance(value, Mapping):
                value = list(value.values())
            if not isinstance(value, list):
                return ()
            return tuple(str(v) for v in value if isinstance(v, str) and v)

        return cls(strings("files"), strings("repos"), strings("data"), strings("caches"))

    def union(self, other: Scope) -> Scope:
        return replace(
            self,
            files=self.files + other.files,
            repos=self.repos + other.repos,
            data=self.data + other.data,
            caches=self.caches + other.caches,
        )

    def as_dict(self) -> dict[str, list[str]]:
        return {
            "files": list(self.files),
            "repos": list(self.repos),
            "data": list(self.data),
            "caches": list(self.caches),
        }

    def allows(self, section: str, path: str) -> bool:
        """True when ``path`` (a manifest key or cache path) is inside this scope."""
        if not is_plain_absolute(path):
            return False
        if section == "files":
            return any(glob_match(g, path) for g in self.files) or _under_any(path, self.repos)
        if section == "git":
            return path in {os.path.normpath(r) for r in self.repos}
        if section == "data":
            return _under_any(path, self.data)
        if section == "caches":
            return _under_any(path, self.caches)
        return True


def is_plain_absolute(path: str) -> bool:
    """An absolute path with no ``.``/``..`` component, no empty component, no NUL."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return False
    return os.path.normpath(path) == path and not path.startswith("//")


def _under_any(path: str, roots: Iterable[str]) -> bool:
    for root in roots:
        root = os.path.normpath(str(root))
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return True
    return False


def glob_match(pattern: str, path: str) -> bool:
    """``glob.glob(pattern, recursive=True)`` semantics on a path: ``*`` stays within one
    component, ``**`` spans any number of them."""
    return _match(os.path.normpath(pattern).split("/"), path.split("/"))


def _match(pat: list[str], parts: list[str]) -> bool:
    if not pat:
        return not parts
    if pat[0] == "**":
        return any(_match(pat[1:], parts[i:]) for i in range(len(parts) + 1))
    if not parts or not fnmatch.fnmatchcase(parts[0], pat[0]):
        return False
    return _match(pat[1:], parts[1:])


@dataclass(frozen=True)
class Touch:
    """One thing a run would touch: the section, the manifest key, the path."""

    section: str
    key: str
    path: str


def touched(good: Manifest, bad: Manifest, changes: Iterable[Any]) -> list[Touch]:
    """Everything a run over ``changes`` (diff Changes) may write, copy or map: the keys
    of files, git and data changes, and every warm cache either manifest points at (the
    caches realizer copies them even when no cache changed)."""
    out: dict[tuple[str, str, str], Touch] = {}
    for change in changes:
        if change.section in ("files", "git", "data"):
            t = Touch(change.section, change.key, change.key)
            out[(t.section, t.key, t.path)] = t
    for manifest in (good, bad):
        for name, value in manifest.section("caches").items():
            if isinstance(value, Mapping) and value.get("path") is not None:
                t = Touch("caches", str(name), str(value.get("path")))
                out[(t.section, t.key, t.path)] = t
    return list(out.values())


def outside(scope: Scope, touches: Iterable[Touch]) -> list[Touch]:
    """The touches ``scope`` does not allow."""
    return [t for t in touches if not scope.allows(t.section, t.path)]


def not_regular(touches: Iterable[Touch]) -> list[tuple[Touch, str]]:
    """Local files keys that exist but are not regular files (a symlink, a device, a
    directory, a FIFO): only regular files are swapped."""
    out = []
    for t in touches:
        if t.section != "files":
            continue
        try:
            st = os.lstat(t.path)
        except OSError:
            continue  # absent: created by a swap, removed on restore
        if not stat.S_ISREG(st.st_mode):
            out.append((t, file_kind(st.st_mode)))
    return out


def check(
    scope: Scope,
    good: Manifest,
    bad: Manifest,
    changes: Iterable[Any],
    *,
    local: bool = True,
    config_path: Any = None,
) -> None:
    """ScopeError naming the first key a run over ``changes`` must not touch."""
    touches = touched(good, bad, changes)
    refused = outside(scope, touches)
    where = str(config_path) if config_path else "envbisect.yaml"
    if refused:
        t = refused[0]
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        field = {"files": "files:", "git": "repos:", "data": "data:", "caches": "caches:"}
        shown = printable(t.key if t.key == t.path else f"{t.key} at {t.path}")
        raise ScopeError(
            f"{t.section} {shown!s}: outside the paths {where} names under "
            f"{field[t.section]}{more}; a manifest cannot widen what a run touches "
            "(add the path to envbisect.yaml if you mean it)"
        )
    if local:
        bad_kind = not_regular(touches)
        if bad_kind:
            t, kind = bad_kind[0]
            raise ScopeError(f"files {printable(t.key)}: is {kind}; only regular files are swapped")
