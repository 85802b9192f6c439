"""One warm compile cache per compiled code: trials whose compiled code is the same share it,
so only the first of them pays for compiling.

When no compile cache is itself a unit of the difference, every trial's torch.compile
caches (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``) point into
``<session>/compile-caches/NNN/``, chosen by what a cache's content depends on:

- the state's packages (torch, triton: every package unit's value in this state);
- the environment that steers compilation (``TORCH*``, ``TORCHINDUCTOR_*``, ``TRITON_*``,
  ``PYTORCH_*``, ``INDUCTOR_*``, ``CUDA_*`` but ``CUDA_VISIBLE_DEVICES``; not the cache
  dirs themselves);
- the command as typed;
- the source: the content of the Python files under the script's directory (the cwd for
  ``-m``/``-c``) and of the state's ``files:`` outside it. Once a run under the probe has
  said which functions Dynamo traced (``traced_code``: the compiled frames and what was
  inlined into them, by file and qualified name), the cache is keyed by their source alone:
  each traced function's own definition (decorators included; a lambda or a nested
  function by its outermost definition) and its file's module-level statements (the
  constants and imports it reads; not the docstring). A later state that changed only code
  torch.compile never saw (a learning rate in the training loop, a docstring, a module that
  is not compiled) shares it; one that changed traced code or its globals gets its own.
  Sharing is never wrong for torch's own caches (their entries are keyed by content); the
  key decides which trials count as the same compiled code.

Never shared: a state whose caches are units of the difference gets exactly what it is
meant to have (a cold dir, the recorded warm content), so with any cache unit in the diff
nothing here applies; nor on a remote target (its caches live there). Each trial's
``trial.json`` says which cache it used (``compile_cache``): its dir, the trial that made
it, whether this trial shared it, and the files it was matched on.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envbisect.realize.actuate import Realized
from envbisect.sections.caches import CACHE_ENV

ROOT = "compile-caches"
_ENV_PREFIXES = ("TORCH", "TRITON_", "PYTORCH_", "INDUCTOR_", "CUDA_")
_ENV_IGNORED = frozenset(("CUDA_VISIBLE_DEVICES", *CACHE_ENV.values()))
_MAX_FILES = 5000
_SKIP_DIRS = frozenset(("__pycache__", "node_modules", "site-packages", "dist-packages"))


@dataclass
class Entry:
    """One shared cache: its dir, what it was keyed on, the trial that made it."""

    number: int
    dir: Path
    base: str  # packages, compile env, command
    sources: dict[str, str | None]  # path under the source root -> sha256 (None: absent)
    traced: bool  # sources narrowed to the files Dynamo traced
    made_by: int | None
    users: list[int] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "base": self.base,
            "sources": self.sources,
            "traced": self.traced,
            "made_by": self.made_by,
            "users": self.users,
        }


@dataclass(frozen=True)
class CacheUse:
    """Which shared cache one trial ran with (``compile_cache`` in ``trial.json``)."""

    entry: Entry
    shared: bool  # made by an earlier trial
    root: Path  # the state's source root

    def env(self) -> dict[str, str]:
        return {var: str(self.entry.dir / name) for name, var in CACHE_ENV.items()}

    def as_dict(self) -> dict[str, Any]:
        e = self.entry
        return {
            "dir": str(e.dir),
            "made_by_trial": e.made_by,
            "shared": self.shared,
            "keyed_on": sorted(e.sources) if e.traced else "every Python file under the script",
            "source_root": str(self.root),
        }


class CompileCaches:
    """The session's shared compile caches (thread-safe: workers choose at once)."""

    def __init__(self, root: Path, enabled: bool, why_not: str | None = None) -> None:
        self.root = root
        self.enabled = enabled
        self.why_not = why_not
        self.entries: list[Entry] = []
        self._lock = threading.Lock()
        if enabled:
            self._load()

    @classmethod
    def for_run(cls, session_root: Path, units: Iterable[Any], remote: bool) -> CompileCaches:
        """Enabled unless a cache is a unit of the difference or the target is remote."""
        root = session_root / ROOT
        if any(getattr(u, "section", None) == "caches" for u in units):
            return cls(root, False, "the compile caches are part of the difference")
        if remote:
            return cls(root, False, "a remote target keeps its own caches")
        return cls(root, True)

    def choose(
        self,
        realized: Realized,
        argv: Sequence[str],
        packages: Mapping[str, Any],
        files: Sequence[str],
        trial: int | None,
    ) -> CacheUse | None:
        """The cache this state runs with: an earlier one whose key it matches, else a new
        one. ``packages``: the state's package values; ``files``: the state's paths of its
        ``files:`` entries."""
        if not self.enabled:
            return None
        src = source_root(realized, argv)
        skip = _session_root(self.root)
        outside = sorted(f for f in files if not _under(Path(f), src))
        base = _digest(
            {
                "packages": {k: repr(v) for k, v in sorted(packages.items())},
                "env": compile_env(realized.env),
                "argv": list(argv),
                "outside": {f: _file_sha(Path(f)) for f in outside},
            }
        )
        with self._lock:
            for e in self.entries:
                if e.base == base and all(
                    source_sha(src, key) == sha for key, sha in e.sources.items()
                ):
                    if trial is not None and trial not in e.users:
                        e.users.append(trial)
                        self._save(e)
                    return CacheUse(e, e.made_by != trial, src)
            n = len(self.entries) + 1
            sources = {
                rel: _file_sha(src / rel) for rel in python_files(src, skip=(skip, self.root))
            }
            e = Entry(n, self.root / f"{n:03d}", base, sources, False, trial, [])
            if trial is not None:
                e.users.append(trial)
            for name in CACHE_ENV:
                (e.dir / name).mkdir(parents=True, exist_ok=True)
            self.entries.append(e)
            self._save(e)
            return CacheUse(e, False, src)

    def learn(self, use: CacheUse, facts: Iterable[Mapping[str, Any] | None]) -> None:
        """Narrow a new cache's key to the files Dynamo traced (from its runs' probe facts),
        while the state that made it is still realized."""
        traced: set[tuple[str, str]] = set()
        seen = False
        for f in facts:
            # none traced (nothing compiled, or a torch that does not say): keyed on all
            if f and isinstance(f.get("traced_code"), list) and f["traced_code"]:
                seen = True
                traced.update((str(c[0]), str(c[1])) for c in f["traced_code"] if len(c) == 2)
        e = use.entry
        if not seen or use.shared:
            return
        with self._lock:
            if e.traced:
                return
            keys: set[str] = set()
            for path, qualname in traced:
                p = Path(path)
                if _under(p, use.root):
                    rel = p.resolve().relative_to(use.root.resolve()).as_posix()
                    name = defpath(qualname)
                    # a function's module globals (constants, imports) are traced with it
                    keys.update((f"{rel}::{name}", f"{rel}::{GLOBALS}") if name else (rel,))
            e.sources = {key: source_sha(use.root, key) for key in sorted(keys)}
            e.traced = True
            self._save(e)

    def _save(self, e: Entry) -> None:
        e.dir.mkdir(parents=True, exist_ok=True)
        tmp = e.dir / "entry.json.tmp"
        tmp.write_text(json.dumps(e.as_json(), indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, e.dir / "entry.json")

    def _load(self) -> None:
        """Caches an earlier part of this session made (``--resume``)."""
        if not self.root.is_dir():
            return
        for path in sorted(self.root.glob("*/entry.json")):
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
                e = Entry(
                    int(raw["number"]),
                    path.parent,
                    str(raw["base"]),
                    dict(raw["sources"]),
                    bool(raw["traced"]),
                    raw.get("made_by"),
                    list(raw.get("users") or []),
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue
            self.entries.append(e)


def with_cache(realized: Realized, use: CacheUse | None) -> Realized:
    """``realized`` running with ``use``'s cache dirs."""
    if use is None:
        return realized
    return replace(realized, env={**realized.env, **use.env()})


def compile_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that steer what torch.compile makes."""
    return {
        k: v
        for k, v in sorted(env.items())
        if k.startswith(_ENV_PREFIXES) and k not in _ENV_IGNORED
    }


def source_root(realized: Realized, argv: Sequence[str]) -> Path:
    """The directory of the state's script (the first ``*.py`` word of its command that
    exists), else the command's cwd."""
    cwd = Path(realized.cwd) if realized.cwd is not None else Path.cwd()
    for word in realized.command_argv(list(argv))[1:]:
        if word.endswith(".py"):
            path = Path(word) if os.path.isabs(word) else cwd / word
            if path.is_file():
                return path.resolve().parent
    return cwd.resolve()


def python_files(root: Path, skip: Sequence[Path] = ()) -> list[str]:
    """The ``*.py`` files under ``root`` (relative, sorted), leaving out hidden dirs, venvs,
    caches and ``skip``; at most ``_MAX_FILES``."""
    skipped = {p.resolve() for p in skip}
    out: list[str] = []
    for here, dirs, files in os.walk(root):
        base = Path(here)
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in _SKIP_DIRS
            and not (base / d / "pyvenv.cfg").exists()
            and (base / d).resolve() not in skipped
        )
        for name in sorted(files):
            if name.endswith(".py"):
                out.append((base / name).relative_to(root).as_posix())
                if len(out) >= _MAX_FILES:
                    return out
    return out


GLOBALS = "<globals>"  # a file's module-level statements but its defs and docstring


def defpath(qualname: str) -> str:
    """The outermost named definitions of a code object's qualified name: ``Block.forward``
    stays, ``causal_mask.<locals>.<lambda>`` is ``causal_mask``; ``<module>`` is empty."""
    parts = []
    for part in qualname.split("."):
        if part.startswith("<"):
            break
        parts.append(part)
    return ".".join(parts)


def source_sha(root: Path, key: str) -> str | None:
    """The sha256 of what a key names under ``root``: ``path::Outer.inner`` the source of
    that definition (its decorators too), ``path::<globals>`` the file's module-level
    statements but its definitions and docstring, ``path`` the whole file; None when
    absent."""
    rel, _, name = key.partition("::")
    if not name:
        return _file_sha(root / rel)
    import ast

    try:
        text = (root / rel).read_text(encoding="utf-8")
        body: list[ast.stmt] = ast.parse(text).body
    except (OSError, ValueError, SyntaxError):
        return None
    if name == GLOBALS:
        kept = [
            ast.dump(n)
            for i, n in enumerate(body)
            if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not (i == 0 and isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        ]
        return hashlib.sha256("\n".join(kept).encode()).hexdigest()
    node: ast.stmt | None = None
    for part in name.split("."):
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        found = [n for n in body if isinstance(n, kinds) and n.name == part]
        if not found:
            return None
        node = found[-1]  # a name defined twice is its last definition, as at run time
        body = getattr(node, "body", [])
    if node is None:
        return None
    decorators = getattr(node, "decorator_list", [])
    first = min([node.lineno, *(d.lineno for d in decorators)])
    lines = text.splitlines()[first - 1 : node.end_lineno]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _session_root(cache_root: Path) -> Path:
    return cache_root.parent


def _under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def _file_sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
