"""The plan of one state, as data: what the section modules' realizers add their part to.

Every bisectable section's module (``envbisect.sections.<name>``) holds a realizer with the
same three methods (:class:`Realizer`):

``facts(ctx, key, old, new, query)``
    adds to ``query`` what the target must answer (one ``inspect`` call for the whole run);
``blocker(ctx, key, old, new) -> str | None``
    why the change cannot be realized on this target (beyond the diff's own verdict);
``plan(ctx, sandbox, values, plan) -> Plan``
    the plan with this section's part added: operations (worktrees, swaps, cache dirs, the
    overlay venv), the trial's environment, argv path rewrites. No I/O of its own: facts come
    from ``ctx`` (answered once, cached by the actuator).

The plan is the same for a local and a remote target; only its executor differs (see
``envbisect.realize.execute``); ``envbisect.realize.plan`` builds it from the realizers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from envbisect.model.argvmap import PathMapper
from envbisect.model.failure import Failure
from envbisect.model.files import FileEntry
from envbisect.model.manifest import Manifest
from envbisect.model.sources import Sources, install_groups
from envbisect.model.target import TargetEnv

Values = Mapping[str, tuple[Manifest, Any]]  # key → (source manifest, the state's value)


# ---- what the target is asked, and what the plan holds ---------------------------------------


@dataclass
class FactQuery:
    """What the realizers need the target to answer (the ``inspect`` operation's params)."""

    sha256: set[str] = field(default_factory=set)
    commits: set[tuple[str, str]] = field(default_factory=set)
    revlists: set[tuple[str, str, str]] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)
    exists: set[str] = field(default_factory=set)

    def params(self) -> dict[str, Any]:
        return {
            "sha256": sorted(self.sha256),
            "commits": [list(c) for c in sorted(self.commits)],
            "revlists": [list(r) for r in sorted(self.revlists)],
            "dirs": sorted(self.dirs),
            "exists": sorted(self.exists),
        }


@dataclass(frozen=True)
class Facts:
    """The target's answers to a :class:`FactQuery`."""

    sha256: Mapping[str, str | None]
    commits: Mapping[tuple[str, ...], bool]
    revlists: Mapping[tuple[str, ...], list[str] | None]
    dirs: Mapping[str, bool]
    exists: Mapping[str, bool]
    unsafe: Mapping[str, str] = field(default_factory=dict)  # repo → git's safe.directory line

    @classmethod
    def from_answer(cls, params: Mapping[str, Any], out: Mapping[str, Any]) -> Facts:
        """Pair each question of ``params`` with the agent's answer in ``out``."""

        def pairs(name: str) -> list[tuple[Any, Any]]:
            return list(zip(params[name], out[name], strict=True))

        return cls(
            sha256=dict(out["sha256"]),
            commits={tuple(c): bool(ok) for c, ok in pairs("commits")},
            revlists={tuple(r): v for r, v in pairs("revlists")},
            dirs={d: bool(ok) for d, ok in pairs("dirs")},
            exists={p: bool(ok) for p, ok in pairs("exists")},
            unsafe=dict(out.get("unsafe") or {}),
        )


@dataclass(frozen=True)
class Context:
    """The run's manifests and the target's facts, as realizers see them."""

    good: Manifest
    bad: Manifest
    python: str
    facts: Callable[[], Facts]  # the target's inspect answers (one call, cached)
    target: Callable[[], TargetEnv]  # the target's probe (one call, cached)
    blob: Callable[[Manifest, FileEntry], Path | None]  # stored content, checked
    blob_places: Callable[[Manifest], str]  # where blobs were looked for (for messages)
    env_holds: Callable[[str, Mapping[str, Any]], bool]  # env holds this redacted value
    uv_missing: Callable[[], bool]  # no uv to build venvs with on the target
    here: str = "here"  # how messages name the target machine ("on the target")
    data_map: Mapping[str, str] = field(default_factory=dict)
    sources: Sources = field(default_factory=Sources)  # where packages come from


@dataclass(frozen=True)
class Sandbox:
    """Where one trial's state goes on the target."""

    root: str  # the session directory there (venvs/, worktrees/)
    trial: str  # this trial's directory there (caches/)
    origin: Path  # the command's cwd here, mapped into a worktree when inside a repo
    cwd: Path | None  # the cwd when no worktree maps it (None: the target's default)
    path: str  # the PATH a python's bin directory is put in front of
    in_venv: bool  # the target python's prefix is a venv (pyvenv.cfg)
    local: bool = True  # the target is this machine: ``origin`` is a path there


@dataclass(frozen=True)
class VenvSpec:
    """An overlay venv: where, on which base, what to install, what to leave out."""

    path: str
    base: str
    install: tuple[str, ...]
    sites: tuple[str, ...]
    excluded: Mapping[str, tuple[str, ...]]
    spec: Mapping[str, Any]  # what identifies it (hashed into its name, kept in READY)

    def params(self) -> dict[str, Any]:
        """The ``venv`` operation's parameters (uv and ``where`` added by the executor)."""
        sources = Sources.from_dict(self.spec["sources"])
        return {
            "venv": self.path,
            "base": self.base,
            "install": list(self.install),
            "installs": [
                [args, reqs] for args, reqs in install_groups(self.spec["install"], sources)
            ],
            "sites": list(self.sites),
            "excluded": {k: list(v) for k, v in self.excluded.items()},
            "spec": dict(self.spec),
        }


@dataclass(frozen=True)
class Swap:
    """A file put in the wanted state in place (journaled); ``sha256`` None: absent."""

    path: str
    sha256: str | None
    key: str  # the path as recorded (messages name it)
    blob: Path | None = None  # the stored content on this machine


@dataclass(frozen=True)
class CacheDir:
    """A compile cache for the trial: a copy of ``src`` (warm) or a fresh empty dir; with
    ``fill``, a warm cache whose content is gone, made again by running the state once into
    the empty dir before it is measured (the dir is then kept for the trial's later runs);
    with ``tree``, the content the snapshot kept (the tree blob's path on this machine; its
    files' blobs beside it), made again exactly."""

    name: str
    dest: str
    src: str | None
    fill: bool = False
    tree: str | None = None

    @property
    def cold(self) -> bool:
        """An empty dir for every run (nothing copied, kept or filled)."""
        return self.src is None and not self.fill and self.tree is None


@dataclass(frozen=True)
class Placement:
    """Where a state's command runs: the interpreter, its environment, the cwd, and the
    rewrites of argv paths into the state's worktrees and datasets."""

    python: str
    env: Mapping[str, str]
    cwd: Path | None = None
    path_map: tuple[tuple[str, str], ...] = ()
    origin: str | None = None  # where the user ran envbisect (local targets only)
    # The variables of env units, set or unset as the state says: on a remote target they
    # are said explicitly, not as a difference from this machine's environment.
    pinned_env: tuple[str, ...] = ()

    @property
    def mapper(self) -> PathMapper:
        """How paths of the user's command become the state's (``envbisect.model.argvmap``)."""
        cwd = str(self.cwd) if self.cwd is not None else None
        return PathMapper(self.path_map, self.origin, cwd)

    def map_argv(self, argv: Sequence[str]) -> list[str]:
        """Absolute paths of repos/datasets rewritten to the state's worktree/data (what
        the state check expects where; the user's command goes through ``command_argv``)."""
        mapper = PathMapper(self.path_map)
        return [mapper.word(arg) for arg in argv]

    def command_argv(self, argv: Sequence[str]) -> list[str]:
        """The user's command in this state: every path mapped (``--opt=path``, shell
        ``-c`` scripts), a bare ``python`` replaced by the state's interpreter."""
        return self.mapper.argv(argv, self.python)


@dataclass(frozen=True)
class Plan(Placement):
    """Everything a state needs, the same for local and remote targets."""

    venv: VenvSpec | None = None
    worktrees: tuple[tuple[str, str, str], ...] = ()  # (repo, head, path on the target)
    swaps: tuple[Swap, ...] = ()
    caches: tuple[CacheDir, ...] = ()
    failure: Failure | None = None
    # (path in a worktree, what it links to, the worktree): a dataset the program finds by
    # itself, at its place in the state's worktree, pointing at the state's version
    links: tuple[tuple[str, str, str], ...] = ()

    def with_env(self, set_: Mapping[str, str], unset: tuple[str, ...] = ()) -> Plan:
        env = {k: v for k, v in self.env.items() if k not in unset}
        env.update(set_)
        return replace(self, env=env)

    def failed(self, why: str) -> Plan:
        return replace(self, failure=Failure.build(why))

    def ops(self) -> dict[str, Any]:
        """The ``realize`` operation's parameters (file contents added by the executor)."""
        return {
            "worktrees": [list(w) for w in self.worktrees],
            "swaps": [{"path": s.path, "sha256": s.sha256, "key": s.key} for s in self.swaps],
            "links": [list(link) for link in self.links],
            "caches": [
                {"name": c.name, "dest": c.dest, "src": c.src, "fill": c.fill, "tree": c.tree}
                for c in self.caches
            ],
        }


class Realizer(Protocol):
    """The three methods every section's realizer has (see the module docstring)."""

    section: str  # its place in a plan: sections.PLAN_ORDER

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None: ...

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None: ...

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan: ...
