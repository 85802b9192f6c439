"""Realize an in-between state: the good state with some units' changes applied.

A state gives every change the bad manifest's value when its unit is applied, else the good
one's; each section makes that value real *for one trial*, never changing the machine:

packages
    A uv venv per distinct package set, under ``<session>/venvs/<hash>/`` and reused when a
    state comes back. It is an *overlay* on the target environment: ``uv venv`` on the target's
    base interpreter, then ``uv pip install --no-deps`` of exactly the packages whose wanted
    version differs from what the target environment has (local labels such as ``+cu130``
    kept; the config's package sources passed to uv as ``envbisect.model.sources.uv_args`` says),
    then a ``.pth`` adds ``base-site/``: a *link farm* of symlinks to every entry of the
    target's site-packages except the files (per ``RECORD``) of the packages that were
    replaced or must be absent. That is how a package present only in the bad state is
    removed: it is simply not linked, so neither ``import`` nor ``importlib.metadata`` sees
    it, and nothing is ever written into the target environment. A uv failure makes the state
    unresolved ("build: ...") with uv's own message in the trial's ``build-venv.stderr``.
git
    ``git worktree add --detach <session>/worktrees/<repo>-<sha>`` at the state's commit;
    argv paths into the repo name it (``argvmap``). Uncommitted changes are reproduced only
    for files listed under ``files:`` (said in the notes).
files
    Content from ``<blobs>/<sha256>``: the folder the snapshot recorded (``meta.blobs_dir``),
    else ``blobs/`` beside the manifest or one level up, else the run's ``manifests_dir``.
    Inside a repo that has a worktree this trial, written there; otherwise swapped in place
    after journaling the original (see ``session.FileJournal``), and restored after every
    trial.
env
    The per-trial environment: each env unit's variable set to the state's value, or unset.
    A redacted value (a secret: the manifest holds only its hash) cannot be set. The variable
    is then passed through from the environment envbisect runs in, unchanged in every trial;
    the unit is bisectable only when that value is the redacted one of the bad state (its
    hash matches) and the good state is unset or a plain value, otherwise it is not bisected
    and the reason says so.
caches
    A cache that is part of the diff: cold = a fresh empty ``TORCHINDUCTOR_CACHE_DIR``/
    ``TRITON_CACHE_DIR`` under the trial dir; warm = a copy of the recorded dir (the user's
    own cache is never written to); either is removed when the trial ends. A cache that did
    not change is used in place, never copied (``run.compilecache`` shares one per compiled
    code). A warm state whose recorded dir is gone cannot be realized: said plainly.
data
    The *old* version of a dataset where ``data_map`` names it: argv paths rewritten to it,
    ``ENVBISECT_DATA_<n>`` (n: its place among the manifest's sorted data paths) holds it.
    Without a mapping the unit is not bisectable.

``torch`` and ``probes`` changes follow from packages and files (no actuator of their own);
everything else (system, gpu, python, ...) is reported, never bisected.

How: each section's realizer (``sections.<name>``, looked up by section name) turns the
state's values into one plan (worktrees, file swaps, cache dirs, the overlay venv, the
environment, argv path rewrites), the same for every target; an executor (``execute``)
carries it out with the agent's operation code: in this process for a local target, shipped
with ``Transport.run_agent`` (one operation per call) under a remote session directory for
a remote one (``envbisect.realize.remote`` says what lives there).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envbisect import sections
from envbisect.agent import actuate_remote
from envbisect.agent.actuate_common import FAILED, READY
from envbisect.model.errors import ActuationError, TransportError
from envbisect.model.failure import Failure
from envbisect.model.files import FileEntry
from envbisect.model.gitcli import Exec
from envbisect.model.history import FileVersion, store
from envbisect.model.manifest import Manifest
from envbisect.model.plan import Context, FactQuery, Facts, Placement, Plan, Sandbox
from envbisect.model.session import Session
from envbisect.model.sources import Sources
from envbisect.model.target import TargetEnv
from envbisect.realize import variants
from envbisect.realize.blobs import blob_dirs, find_blob
from envbisect.realize.execute import Executor, LocalExecutor, RemoteExecutor, RemoteState
from envbisect.realize.notes import env_holds, run_notes
from envbisect.realize.plan import local_sandbox, make_plan, realizers, remote_sandbox
from envbisect.realize.remote import AGENT, FAR_PATH, git_exec, session_dir
from envbisect.realize.variants import Variants, commit_ranges, realized_changes
from envbisect.sections.caches import CACHE_ENV
from envbisect.sections.git import GitEntry
from envbisect.sections.packages import PackagesRealizer
from envbisect.transport import Transport

REALIZERS = realizers()  # section → its realizer, in plan order (from the section modules)
ACTIONABLE = tuple(REALIZERS)  # packages, git, files, env, caches, data
DERIVED = tuple(s.name for s in sections.known() if s.derived)  # torch, probes

# FAILED/READY (the venv markers) and CACHE_ENV live with the code that uses them; kept here.
__all__ = [
    "ACTIONABLE",
    "CACHE_ENV",
    "DERIVED",
    "FAILED",
    "READY",
    "Actuator",
    "Realized",
    "TargetEnv",
]


@dataclass(frozen=True)
class Realized(Placement):
    """One realized state, ready to run a command in."""

    venv: Path | None = None
    notes: tuple[str, ...] = ()
    failure: Failure | None = None  # "build: ..." when the state cannot be realized
    caches: tuple[str, ...] = ()  # this trial's cache dirs, removed when it ends
    fill: tuple[str, ...] = ()  # caches to make warm by one run of the state (CacheDir.fill)
    cold: tuple[str, ...] = ()  # cold cache dirs: empty at the start of every run


@dataclass
class Actuator:
    """Realizes states of one diff for one target. Create once per run.

    ``units`` are diff Units (objects with ``id``, ``section``, ``changes``, ``bisectable``,
    ``reason``); changes are looked up in the manifests by ``(section, key)``.
    """

    good: Manifest
    bad: Manifest
    units: Sequence[Any]
    session: Session
    python: str
    transport: Transport = field(default_factory=Transport)
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    sources: Sources | None = None  # None: the three fields above (older callers)
    data_map: Mapping[str, str] = field(default_factory=dict)
    blob_dirs: tuple[Path, ...] = ()  # more places to look for stored file contents
    base_env: Mapping[str, str] | None = None
    cwd: Path | None = None
    uv: str | None = None
    _target: TargetEnv | None = None
    _commits: dict[str, list[str]] = field(default_factory=dict)
    _blocked: frozenset[str] | None = None  # the units no realizer can realize here
    _facts: Facts | None = None  # the target's answers to the realizers' questions
    # What the remote executors keep between operations (every copy starts afresh).
    _remote: RemoteState = field(default_factory=RemoteState, init=False, repr=False)
    # Workers of one host build states one at a time (venvs and worktrees are shared).
    _build_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Several actuators of one session (workers with targets of their own) log their agent
    # calls side by side: each under its own name.
    log_tag: str = ""
    on_note: Callable[[str], None] | None = None  # told at once when a restore keeps an edit
    kept: list[str] = field(default_factory=list)  # files restore left as the user edited them
    _claimed: bool = False
    # Stored contents found so far: (id of the manifest, blob name) → checked blob file.
    _blobs: dict[tuple[int, str], Path | None] = field(default_factory=dict, repr=False)
    # The states the run registers beyond the units' endpoints (shared with the copies).
    _states: Variants = field(default_factory=Variants, repr=False)

    def for_worker(self, transport: Transport, python: str | None, name: str) -> Actuator:
        """A copy for worker ``name``'s own target: same states, nothing learnt of the target."""
        return replace(
            self,
            transport=transport,
            python=python or self.python,
            _target=None,
            _commits={},
            _blocked=None,
            _facts=None,
            _build_lock=threading.Lock(),
            log_tag=name,
        )

    @property
    def remote(self) -> bool:
        """True when the target is reached through a layer chain."""
        return bool(self.transport.layers)

    @property
    def git_via(self) -> Exec | None:
        """How the user's repos are read: here (None), or through the chain on the target."""
        logs = self.session.root / "remote" / "git"
        return git_exec(self.transport, logs) if self.remote else None

    def _executor(self) -> Executor:
        if not self.remote:
            return LocalExecutor(self.transport, self.session, uv=self.uv_path)
        return RemoteExecutor(
            self.agent,
            self._remote,
            log_dir=self.session.root / "remote",
            where=self.transport.describe(),
            root=self.remote_root,
            uv=lambda: self.target().uv,
            probed=self._target is not None,
        )

    def _context(self) -> Context:
        """What the realizers see of this run and of the target."""
        return Context(
            good=self.good,
            bad=self.bad,
            python=self.python,
            facts=self._inspect,
            target=self.target,
            blob=self.blob,
            blob_places=lambda m: ", ".join(str(d) for d in blob_dirs(m, self.blob_dirs)),
            env_holds=self._env_holds,
            uv_missing=lambda: self.remote and self.target().uv is None,
            here="on the target" if self.remote else "here",
            data_map=self.data_map,
            sources=self.package_sources(),
        )

    def package_sources(self) -> Sources:
        """Where this run's packages come from (``sources``, else the older three fields)."""
        if self.sources is not None:
            return self.sources
        return Sources(
            indexes=tuple(self.extra_index_urls),
            default_index=self.index_url,
            find_links=tuple(self.find_links),
        )

    # -- what can be realized ----------------------------------------------------------

    def blockers(self) -> dict[str, str]:
        """unit id → why this actuator cannot realize it (beyond the diff's own verdict)."""
        out: dict[str, str] = {}
        ctx = self._context()
        for unit in self.units:
            if not unit.bisectable:
                continue
            reason = self._unit_blocker(ctx, unit)
            if reason:
                out[unit.id] = reason
        return out

    def _unit_blocker(self, ctx: Context, unit: Any) -> str | None:
        actionable = [c for c in realized_changes(unit) if c.section in REALIZERS]
        other = sorted({c.section for c in unit.changes} - set(ACTIONABLE) - set(DERIVED))
        if other:
            return f"no actuator for {', '.join(other)} changes (reported, not bisected)"
        if not actionable:
            return "only derived facts changed; nothing to realize"
        for change in actionable:
            key = str(change.key)
            old = self.good.section(change.section).get(key)
            new = self.bad.section(change.section).get(key)
            why = REALIZERS[change.section].blocker(ctx, key, old, new)
            if why:
                return why
        return None

    def _inspect(self) -> Facts:
        """Every fact the realizers need from the target, in one call of the agent."""
        if self._facts is not None:
            return self._facts
        ctx = self._context()
        query = FactQuery()
        for unit in self.units:
            for change in unit.changes:
                realizer = REALIZERS.get(change.section)
                if realizer is None:
                    continue
                key = str(change.key)
                old = self.good.section(change.section).get(key)
                new = self.bad.section(change.section).get(key)
                realizer.facts(ctx, key, old, new, query)
        params = query.params()
        self._facts = Facts.from_answer(params, self._executor().inspect(params))
        return self._facts

    def agent(
        self, op: str, params: Mapping[str, Any], log_dir: Path, name: str, timeout_s: float = 300
    ) -> dict[str, Any]:
        """One operation of the agent, as a process through the chain (the empty chain:
        a local ``python -``)."""
        return self.transport.run_agent(
            self.python,
            AGENT,
            {"op": op, **params},
            timeout_s=timeout_s,
            log_dir=log_dir,
            name=f"{name}-{self.log_tag}" if self.log_tag else name,
        )

    def remote_root(self) -> str:
        """The remote session dir (recorded in the local session log on first use)."""
        return session_dir(self.session, self.transport, self.python, self.target().home)

    def notes(self) -> list[str]:
        """Caveats about the run as a whole (printed once at the start)."""
        return run_notes(self.good, self.bad, self.units, self._blocked_ids())

    def ordered(self) -> dict[str, list[str]]:
        """git unit id → commits after good's head up to bad's head (oldest first)."""
        out = commit_ranges(self.good, self.bad, self.units, lambda: self._inspect().revlists)
        self._commits.update(out)
        for unit_id, versions in self.file_versions().items():
            out[unit_id] = [v.item for v in versions]
        return out

    def _unit_commits(self, unit_id: str) -> list[str]:
        return self._commits.get(unit_id) or self.ordered().get(unit_id, [])

    def file_versions(self) -> dict[str, tuple[FileVersion, ...]]:
        """file unit id → its versions after the good commit (``history.file_history``), for
        a file inside a recorded repo whose commit changed (the repo read where it is)."""
        if self._states.versions:
            return self._states.versions
        found = variants.file_versions(
            self.good, self.bad, self.units, self.variant_blobs, self.git_via
        )
        for unit_id, versions in found.items():
            self._states.versions[unit_id] = versions
            self._states.files[unit_id] = [v.value() for v in versions]
        return self._states.versions

    @property
    def variant_blobs(self) -> Path:
        """Where contents the run makes (a file at a commit, with some hunks) are stored."""
        return self.session.root / "blobs"

    def add_variant(self, unit_id: str, content: bytes) -> int:
        """Register ``content`` as a state of file unit ``unit_id``: the position that
        stands for it (the same position for the same content)."""
        sha = store(self.variant_blobs, content)
        return self._states.add_file(unit_id, {"sha256": sha, "size": len(content), "blob": sha})

    def content(self, unit_id: str, pos: int | None) -> bytes | None:
        """The content of file unit ``unit_id`` at position ``pos`` (None: the bad state's;
        -1: the good state's), from the blob store."""
        key = str(next(u for u in self.units if u.id == unit_id).changes[0].key)
        manifest = self.good if pos == -1 else self.bad
        value = manifest.section("files").get(key)
        if pos is not None and pos >= 0:
            value = self._variant(unit_id, pos, None)
        path = self.blob(manifest, value) if value is not None else None
        return path.read_bytes() if path is not None else None

    # -- realizing ---------------------------------------------------------------------

    def _env_holds(self, key: str, value: Mapping[str, Any]) -> bool:
        """True when the environment trials start from holds the redacted ``value``.

        Remote: the far environment cannot be read here; the bad state is taken to be the
        target as it is (as for every unit that is not bisected)."""
        if self.remote:
            return True
        return env_holds(self.base_env if self.base_env is not None else os.environ, key, value)

    def state_values(
        self, applied: frozenset[str], positions: Mapping[str, int]
    ) -> dict[tuple[str, str], tuple[Manifest, Any]]:
        """(section, key) → (source manifest, value) of every actionable change in a state:
        what ``realize`` makes real, and what ``bisect.faithful`` checks it against."""
        values: dict[tuple[str, str], tuple[Manifest, Any]] = {}
        for unit in self.units:
            on = unit.id in applied
            for change in realized_changes(unit):
                if change.section not in REALIZERS:
                    continue
                key = str(change.key)
                source = self.bad if on else self.good
                if unit.bisectable is False or unit.id in self._blocked_ids():
                    if change.section == "env":
                        continue  # never bisected: the variable stays as the environment has it
                    source = self.bad  # never bisected: stays as the target is
                value = source.section(change.section).get(key)
                if on and unit.id in positions and unit.id in self._states.packages:
                    pos = positions[unit.id]
                    source, value = self._states.package(unit.id, pos, key, self.good, self.bad)
                elif on and change.section == "git" and unit.id in positions:
                    value = self._at_position(unit.id, positions[unit.id], value)
                elif on and change.section == "files" and unit.id in positions:
                    value = self._variant(unit.id, positions[unit.id], value)
                values[(change.section, key)] = (source, value)
        for unit_id, pos in positions.items():
            variant = self._commit_variant(unit_id, pos) if unit_id in applied else None
            for key, file_value in variant[1].items() if variant else ():
                values[("files", key)] = (self.bad, file_value)
        return values

    def _at_position(self, unit_id: str, pos: int, value: Any) -> Any:
        """A git value moved to the ``pos``-th commit of its unit's range (a position past
        its commits: a state ``add_commit_variant`` registered, at its base commit)."""
        commits = self._unit_commits(unit_id)
        variant = self._commit_variant(unit_id, pos)
        if variant is not None and variant[0] < 0:
            key = str(next(u for u in self.units if u.id == unit_id).changes[0].key)
            return {**(value or {}), "head": GitEntry.of(self.good.section("git").get(key)).head}
        if variant is not None:
            pos = variant[0]
        if commits and 0 <= pos < len(commits):
            return {**(value or {}), "head": commits[pos]}
        return value

    def add_commit_variant(self, unit_id: str, base: int, contents: Mapping[str, bytes]) -> int:
        """Register a state of git unit ``unit_id``: its worktree at commit position ``base``
        (-1: the good commit) with ``contents`` (file key → bytes) written into it; the
        position that stands for it (past the unit's commits; the same for the same state)."""
        commits = self._unit_commits(unit_id)
        files = {}
        for key, content in sorted(contents.items()):
            sha = store(self.variant_blobs, content)
            files[key] = {"sha256": sha, "size": len(content), "blob": sha}
        return self._states.add_commit(unit_id, base, files, len(commits))

    def add_package_variant(self, unit_id: str, values: Mapping[str, Any]) -> int:
        """Register a state of package unit ``unit_id`` (a plain package or the torch
        stack): the packages in ``values`` (key → a ``packages:`` value, None: absent) as
        given, the unit's other changes as in the good state; the position that stands for
        it (the same for the same values)."""
        return self._states.add_package(unit_id, values)

    def venv_of(self, applied: frozenset[str], positions: Mapping[str, int]) -> Path | None:
        """Where the overlay venv of a state is (on a remote target: its path there; None:
        the state needs none); built once the state has been realized."""
        env = dict(self.base_env if self.base_env is not None else os.environ)
        sandbox = self._sandbox(self.session.root / "trials" / "preview", env)
        values = self.state_values(applied, positions)
        wanted = {key: v for (section, key), (_src, v) in values.items() if section == "packages"}
        spec, _failure = PackagesRealizer.venv(self._context(), sandbox, wanted)
        return Path(spec.path) if spec is not None else None

    def _commit_variant(self, unit_id: str, pos: int) -> tuple[int, dict[str, Any]] | None:
        return self._states.commit(unit_id, pos, lambda: len(self._unit_commits(unit_id)))

    def _variant(self, unit_id: str, pos: int, value: Any) -> Any:
        """A file value moved to the ``pos``-th content of its unit (a version, a hunk set)."""
        if unit_id not in self._states.files:
            self.file_versions()
        return self._states.file(unit_id, pos, value)

    def _blocked_ids(self) -> frozenset[str]:
        if self._blocked is None:
            self._blocked = frozenset(self.blockers())
        return self._blocked

    @contextlib.contextmanager
    def realize(
        self,
        applied: frozenset[str],
        positions: Mapping[str, int],
        trial_dir: Path,
    ) -> Iterator[Realized]:
        """Build the state; undo every in-place change, and remove its cache dirs, when the
        block exits."""
        caches: tuple[str, ...] = ()
        try:
            with self._build_lock:
                realized = self._build(applied, positions, trial_dir)
            caches = realized.caches
            yield realized
        finally:
            self.restore()
            self._drop_caches(caches)

    def _drop_caches(self, paths: tuple[str, ...]) -> None:
        """Remove a finished trial's cache dirs (here, or on the remote target)."""
        if not paths:
            return
        if not self.remote:
            actuate_remote.drop_dirs(paths)
            return
        with contextlib.suppress(TransportError):  # reset removes them later
            self.agent("drop", {"paths": list(paths)}, self.session.root / "remote", "drop")

    def restore(self) -> None:
        """Put back every file swapped in place on the target (this machine or the far one).

        A file the user changed meanwhile is kept as it is (the original written beside
        it): each such file is one line in ``kept``, also handed to ``on_note`` at once.
        """
        for line in self._executor().restore():
            self.kept.append(line)
            if self.on_note is not None:
                self.on_note(line)

    def claim_files(self) -> None:
        """Lock, machine-wide, every loose file a trial may swap in place (once per run), so
        a second run on the same file is refused before either touches it. Local only: a
        remote target's agent claims each file as it swaps it (``journal.claim`` without
        ``hold``), since no process of ours lives there between trials."""
        if self._claimed or self.remote:
            return
        blocked = self._blocked_ids()
        for unit in self.units:
            if unit.bisectable is False or unit.id in blocked:
                continue
            for change in unit.changes:
                if change.section == "files":
                    self.session.journal.claim(Path(str(change.key)))
        self._claimed = True

    def _sandbox(self, trial_dir: Path, env: Mapping[str, str]) -> Sandbox:
        """Where this trial's state goes: under the session dir here, or the remote one."""
        origin = Path(self.cwd or Path.cwd()).absolute()
        if self.remote:
            root = self.remote_root()
            return remote_sandbox(root, trial_dir.name, origin, self.target().path or FAR_PATH)
        return local_sandbox(self.session.root, trial_dir, origin, self.cwd, self.python, env)

    def preview(self, applied: frozenset[str], trial_dir: Path) -> Plan:
        """The plan of a state, made but not carried out (``run --print-command``)."""
        env = dict(self.base_env if self.base_env is not None else os.environ)
        sandbox = self._sandbox(trial_dir, env)
        return make_plan(self._context(), sandbox, self.state_values(applied, {}), env)

    def _build(
        self, applied: frozenset[str], positions: Mapping[str, int], trial_dir: Path
    ) -> Realized:
        self.claim_files()
        env = dict(self.base_env if self.base_env is not None else os.environ)
        executor = self._executor()
        try:
            plan = make_plan(
                self._context(),
                self._sandbox(trial_dir, env),
                self.state_values(applied, positions),
                env,
            )
            if plan.failure:
                return Realized(python=plan.python, env=plan.env, failure=plan.failure)
            if plan.venv is not None:
                _path, failure = executor.venv(plan.venv.params(), trial_dir)
                if failure:
                    return Realized(python=self.python, env=plan.env, failure=Failure.of(failure))
            failure, notes = executor.apply(plan, trial_dir)
        except TransportError as exc:
            return Realized(python=self.python, env=env, failure=Failure.build(str(exc)))
        if failure:
            caches = tuple(c.dest for c in plan.caches)
            return Realized(
                python=plan.python, env=plan.env, failure=Failure.of(failure), caches=caches
            )
        return Realized(
            python=plan.python,
            env=plan.env,
            pinned_env=plan.pinned_env,
            cwd=plan.cwd,
            path_map=plan.path_map,
            origin=plan.origin,
            venv=Path(plan.venv.path) if plan.venv is not None else None,
            notes=tuple(notes),
            # A filled warm cache stays for the state's later calls (reset removes it).
            caches=tuple(c.dest for c in plan.caches if not c.fill),
            fill=tuple(c.name for c in plan.caches if c.fill),
            cold=tuple(c.dest for c in plan.caches if c.cold),
        )

    # -- the target ----------------------------------------------------------------------

    def target(self) -> TargetEnv:
        """What the target python has installed: the agent's ``probe``, run by that python
        (through the chain; the empty chain when local), once."""
        if self._target is None:
            log_dir = self.session.root / "remote" if self.remote else self.session.root
            try:
                data = self.agent("probe", {}, log_dir, "probe-env")
            except TransportError as exc:
                raise ActuationError(f"cannot list the packages of {self.python}: {exc}") from None
            self._target = TargetEnv.from_agent(self.python, data)
        return self._target

    def uv_path(self) -> str:
        """The uv that builds local venvs (``uv=``, else on PATH, else next to python)."""
        if self.uv:
            return self.uv
        found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
        if not found:
            raise ActuationError("uv not found on PATH (needed to build package states)")
        self.uv = found
        return found

    def blob(self, manifest: Manifest, value: Mapping[str, Any] | FileEntry) -> Path | None:
        """The stored content of a files entry: under the blob dir the snapshot recorded
        (``meta.blobs_dir``), beside the manifest, one level up (``manifests/blobs`` next to
        a manifest in a subfolder) or in this run's ``manifests_dir``; checked by sha256."""
        return find_blob(
            manifest,
            value,
            lambda: [*blob_dirs(manifest, self.blob_dirs), self.variant_blobs],
            self._blobs,
        )

    _blob = blob  # the old name, until ``run.runner`` calls ``blob``

    def close(self) -> None:
        """Restore files and remove the worktrees (venvs stay for a later --resume), here
        and, for a remote target, there."""
        self.restore()
        self.session.remove_worktrees()
        self._executor().cleanup()
