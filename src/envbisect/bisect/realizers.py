"""One realizer per section: what a state's value of that section needs, and the plan for it.

Every realizer has the same three methods, looked up in :data:`REALIZERS` by section name:

``facts(ctx, key, old, new, query)``
    adds to ``query`` what the target must answer (one ``inspect`` call for the whole run);
``blocker(ctx, key, old, new) -> str | None``
    why the change cannot be realized on this target (beyond the diff's own verdict);
``plan(ctx, sandbox, values, plan) -> Plan``
    the plan with this section's part added: operations (worktrees, swaps, cache dirs, the
    overlay venv), the trial's environment, argv path rewrites. No I/O of its own: facts come
    from ``ctx`` (answered once, cached by the actuator).

The plan is the same for a local and a remote target; only its executor differs (see
``bisect.execute``). The classes are self-contained so that each can move to its section's
module later.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from packaging.utils import canonicalize_name

from envbisect.agent.redact import is_redacted
from envbisect.bisect.entries import CacheEntry, FileEntry, GitEntry, PackageEntry, is_warm
from envbisect.failure import Failure
from envbisect.manifest import Manifest

if TYPE_CHECKING:
    from envbisect.bisect.actuate import TargetEnv

CACHE_ENV = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}

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
    index: tuple[str | None, tuple[str, ...], tuple[str, ...]] = (None, (), ())


@dataclass(frozen=True)
class Sandbox:
    """Where one trial's state goes on the target."""

    root: str  # the session directory there (venvs/, worktrees/)
    trial: str  # this trial's directory there (caches/)
    origin: Path  # the command's cwd here, mapped into a worktree when inside a repo
    cwd: Path | None  # the cwd when no worktree maps it (None: the target's default)
    path: str  # the PATH a python's bin directory is put in front of
    in_venv: bool  # the target python's prefix is a venv (pyvenv.cfg)


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
        index_url, extra, links = self.spec["index"]
        return {
            "venv": self.path,
            "base": self.base,
            "install": list(self.install),
            "index_url": index_url,
            "extra_index_urls": list(extra),
            "find_links": list(links),
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
    """A compile cache for the trial: a copy of ``src`` (warm) or a fresh empty dir."""

    name: str
    dest: str
    src: str | None


@dataclass(frozen=True)
class Plan:
    """Everything a state needs, the same for local and remote targets."""

    python: str
    env: Mapping[str, str]
    cwd: Path | None = None
    path_map: tuple[tuple[str, str], ...] = ()
    venv: VenvSpec | None = None
    worktrees: tuple[tuple[str, str, str], ...] = ()  # (repo, head, path on the target)
    swaps: tuple[Swap, ...] = ()
    caches: tuple[CacheDir, ...] = ()
    failure: str | None = None

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
            "caches": [{"name": c.name, "dest": c.dest, "src": c.src} for c in self.caches],
        }


class Realizer(Protocol):
    """The three methods every section's realizer has (see the module docstring)."""

    section: str

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None: ...

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None: ...

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan: ...


# ---- packages --------------------------------------------------------------------------------


class PackagesRealizer:
    """An overlay uv venv per distinct package set (see ``bisect.actuate``), and the
    interpreter's environment (PATH, VIRTUAL_ENV) for every state."""

    section = "packages"

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None:
        return None  # the probe (installed dists, uv) says everything

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None:
        for value in (old, new):
            entry = PackageEntry.of(value)
            if entry is not None and entry.editable:
                return f"packages {key}: an editable install cannot be rebuilt"
        if ctx.uv_missing():
            return (
                f"packages {key}: uv is not available on the target (not on its "
                f"PATH, not next to {ctx.python}, not as '{ctx.python} -m uv'); "
                "install uv there to bisect packages"
            )
        return None

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan:
        venv: VenvSpec | None = None
        if values:
            venv, failure = self.venv(ctx, sandbox, {k: v for k, (_s, v) in values.items()})
            if failure:
                return plan.failed(failure)
        python = f"{venv.path}/bin/python" if venv is not None else ctx.python
        plan = replace(plan, python=python, venv=venv)
        if venv is not None:
            # The link farm points into the target environment: never write bytecode
            # through it (existing .pyc files are still read).
            plan = plan.with_env({"PYTHONDONTWRITEBYTECODE": "1"})
        if venv is None and not os.path.isabs(ctx.python):
            return plan
        plan = plan.with_env({"PATH": f"{os.path.dirname(python)}:{sandbox.path}"})
        if venv is not None or sandbox.in_venv:
            prefix = os.path.dirname(os.path.dirname(python))
            plan = plan.with_env({"VIRTUAL_ENV": prefix}, unset=("PYTHONHOME",))
        return plan

    @staticmethod
    def venv(
        ctx: Context, sandbox: Sandbox, wanted: Mapping[str, Any]
    ) -> tuple[VenvSpec | None, str | None]:
        """The overlay venv for ``wanted`` (None: the target itself fits), or a failure."""
        target = ctx.target()
        installs: dict[str, str] = {}
        hides: set[str] = set()
        for raw_name, value in sorted(wanted.items()):
            name = canonicalize_name(raw_name)
            have = target.dists.get(name)
            entry = PackageEntry.of(value)
            if entry is None:
                if have is not None:
                    hides.add(name)
                continue
            if have is not None and str(have["version"]) == str(entry.version):
                continue
            installs[name] = entry.requirement(name)
            if have is not None:
                hides.add(name)
        if not installs and not hides:
            return None, None
        for hidden in sorted(hides):
            if target.dists[hidden].get("files") is None:
                return None, Failure.build(
                    f"cannot replace or remove {hidden} in {target.python}: "
                    "its installed files are not listed (no RECORD)"
                )
        index_url, extra, links = ctx.index
        spec = {
            "python": target.python,
            "install": installs,
            "hide": sorted(hides),
            "index": [index_url, list(extra), list(links)],
        }
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
        return VenvSpec(
            path=f"{sandbox.root}/venvs/{digest}",
            base=target.base,
            install=tuple(installs.values()),
            sites=tuple(target.sites),
            excluded=_excluded(target, hides),
            spec=spec,
        ), None


def _excluded(target: TargetEnv, hides: set[str]) -> dict[str, tuple[str, ...]]:
    """Site directory → the files (per RECORD) of the hidden packages installed there."""
    excluded: dict[str, set[str]] = {}
    for name in hides:
        dist = target.dists[name]
        paths = excluded.setdefault(os.path.realpath(dist["location"]), set())
        for f in dist["files"] or ():
            norm = os.path.normpath(f)
            if not norm.startswith(".."):
                paths.add(norm)
    return {k: tuple(sorted(v)) for k, v in excluded.items()}


# ---- git -------------------------------------------------------------------------------------


class GitRealizer:
    """A detached worktree at the state's commit; the command's cwd and argv move into it."""

    section = "git"

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None:
        heads = [GitEntry.of(v).head for v in (old, new)]
        query.commits.update((key, h) for h in heads if h)
        if heads[0] and heads[1]:
            query.revlists.add((key, heads[0], heads[1]))

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None:
        for value in (old, new):
            head = GitEntry.of(value).head
            if not head or not ctx.facts().commits.get((key, head)):
                return f"git {key}: commit {str(head)[:12]} is not in that repo"
        return None

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan:
        worktrees: list[tuple[str, str, str]] = []
        for key, (_src, value) in sorted(values.items()):
            head = GitEntry.of(value).head
            if not head:
                return plan.failed(f"git {key}: the state has no commit")
            worktrees.append((key, head, f"{sandbox.root}/worktrees/{worktree_name(key, head)}"))
        if not worktrees:
            return plan
        plan = replace(
            plan,
            worktrees=plan.worktrees + tuple(worktrees),
            path_map=plan.path_map + tuple((repo, path) for repo, _h, path in worktrees),
        )
        mapped = None
        for repo, _head, path in worktrees:
            with contextlib.suppress(ValueError):
                mapped = Path(path) / sandbox.origin.relative_to(repo)
        if mapped is None and len(worktrees) == 1:
            mapped = Path(worktrees[0][2])
        if mapped is None:
            return plan
        return replace(plan, cwd=mapped).with_env({"PWD": str(mapped)})


def worktree_name(repo: str, head: str) -> str:
    """The directory name of ``repo``'s worktree at ``head`` (unique per repo path)."""
    tag = hashlib.sha256(str(repo).encode()).hexdigest()[:8]
    return f"{Path(repo).name}-{tag}-{head[:12]}"


# ---- files -----------------------------------------------------------------------------------


class FilesRealizer:
    """Content from the blob store, written into the state's worktree when the file is in a
    repo that has one, else swapped in place after journaling the original."""

    section = "files"

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None:
        query.sha256.add(key)

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None:
        for manifest, value in ((ctx.good, old), (ctx.bad, new)):
            entry = FileEntry.of(value)
            if entry is None or ctx.facts().sha256.get(key) == entry.sha256:
                continue
            if ctx.blob(manifest, entry) is None:
                return (
                    f"files {key}: no stored content for sha256 "
                    f"{str(entry.sha256)[:12]} of "
                    f"{manifest.path or 'the manifest'} (looked in "
                    f"{ctx.blob_places(manifest) or 'no blob folder'}; snapshot with "
                    "keep_blobs: true)"
                )
        return None

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan:
        swaps: list[Swap] = []
        for key, (source, value) in sorted(values.items()):
            target = key
            for repo, _head, path in plan.worktrees:
                with contextlib.suppress(ValueError):
                    target = str(Path(path) / Path(key).relative_to(repo))
                    break
            entry = FileEntry.of(value)
            want = entry.sha256 if entry is not None else None
            blob = ctx.blob(source, entry) if entry is not None and want is not None else None
            swaps.append(Swap(path=target, sha256=want, key=key, blob=blob))
        return replace(plan, swaps=plan.swaps + tuple(swaps))


# ---- env -------------------------------------------------------------------------------------


class EnvRealizer:
    """Each env unit's variable set to the state's value, or unset; a redacted value is
    passed through from the environment envbisect runs in."""

    section = "env"

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None:
        return None

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None:
        for side, value in (("good", old), ("bad", new)):
            if not is_redacted(value) or (side == "bad" and ctx.env_holds(key, value)):
                continue
            why = (
                "so it cannot be set"
                if side == "good"
                else f"and {key} {ctx.here} is not that value, so it cannot be set"
            )
            return (
                f"env {key}: the {side} value is a secret, redacted in the manifest, {why}; "
                f"every trial passes {key} through from your environment unchanged"
            )
        return None

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan:
        unset = tuple(key for key, (_s, value) in values.items() if value is None)
        set_ = {key: value for key, (_s, value) in values.items() if isinstance(value, str)}
        # Anything else is redacted, and (see blocker) the environment already holds it.
        return plan.with_env(set_, unset)


# ---- caches ----------------------------------------------------------------------------------


class CachesRealizer:
    """Every known compile cache points into the trial's sandbox: a copy of the recorded dir
    (warm) or a fresh empty one (cold); the user's own cache is never written to."""

    section = "caches"

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None:
        for value in (old, new):
            entry = CacheEntry.of(value)
            if entry is not None and entry.path:
                query.dirs.add(entry.path)

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None:
        if key not in CACHE_ENV:
            return f"caches {key}: no environment variable points it elsewhere"
        for side, value in (("good", old), ("bad", new)):
            entry = CacheEntry.of(value)
            if entry is not None and entry.warm and not ctx.facts().dirs.get(entry.path or ""):
                return (
                    f"caches {key}: the {side} state had a warm cache at "
                    f"{entry.path} which no longer holds files"
                )
        return None

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan:
        dirs: list[CacheDir] = []
        env: dict[str, str] = {}
        for name, var in CACHE_ENV.items():
            value = values[name][1] if name in values else ctx.bad.section("caches").get(name)
            entry = CacheEntry.of(value)
            warm = (entry.path or "") if entry is not None and is_warm(value) else None
            dirs.append(CacheDir(name, f"{sandbox.trial}/caches/{name}", warm))
            env[var] = dirs[-1].dest
        return replace(plan, caches=plan.caches + tuple(dirs)).with_env(env)


# ---- data ------------------------------------------------------------------------------------


class DataRealizer:
    """The old version of a dataset, where ``data_map`` says it lives: argv rewritten to it
    and ``ENVBISECT_DATA_<n>`` naming the path to use."""

    section = "data"

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None:
        query.exists.update(str(v) for v in ctx.data_map.values())

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None:
        mapped = ctx.data_map.get(key)
        if not mapped or not ctx.facts().exists.get(mapped):
            return (
                f"data {key}: the other version is not available; "
                "name where it lives under data_map: in envbisect.yaml"
            )
        return None

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan:
        data_keys = sorted(str(k) for k in (ctx.bad.section("data") or {}))
        path_map: list[tuple[str, str]] = []
        env: dict[str, str] = {}
        for key, (source, _value) in values.items():
            use = key
            if source is ctx.good and key in ctx.data_map:
                use = ctx.data_map[key]
                path_map.append((key, use))
            if key in data_keys:
                env[f"ENVBISECT_DATA_{data_keys.index(key)}"] = use
        return replace(plan, path_map=plan.path_map + tuple(path_map)).with_env(env)


# In plan order: files land in the worktrees git planned; env units override what the
# packages part set; caches and data last, as before.
REALIZERS: dict[str, Realizer] = {
    r.section: r
    for r in (
        PackagesRealizer(),
        GitRealizer(),
        FilesRealizer(),
        EnvRealizer(),
        CachesRealizer(),
        DataRealizer(),
    )
}


def make_plan(
    ctx: Context,
    sandbox: Sandbox,
    values: Mapping[tuple[str, str], tuple[Manifest, Any]],
    env: Mapping[str, str],
) -> Plan:
    """The plan of one state: every realizer's part, in :data:`REALIZERS` order, on top of
    the environment ``env`` trials start from."""
    plan = Plan(python=ctx.python, env=dict(env), cwd=sandbox.cwd)
    for section, realizer in REALIZERS.items():
        mine = {key: v for (s, key), v in values.items() if s == section}
        plan = realizer.plan(ctx, sandbox, mine, plan)
        if plan.failure:
            return plan
    # Longest prefixes first, so a dataset inside a repo wins over the repo.
    return replace(plan, path_map=tuple(sorted(plan.path_map, key=lambda p: -len(p[0]))))
