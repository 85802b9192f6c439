"""Realize an in-between state: the good state with some units' changes applied.

A state assigns every change of the diff a value: the bad manifest's value when its unit is
applied, else the good manifest's. Each section has an actuator that makes that value real
*for one trial* without changing the user's machine:

packages
    A uv venv per distinct package set, under ``<session>/venvs/<hash>/`` and reused when a
    state comes back. It is an *overlay* on the target environment: ``uv venv`` on the target's
    base interpreter, then ``uv pip install --no-deps`` of exactly the packages whose wanted
    version differs from what the target environment has (local labels such as ``+cu130``
    kept; ``index_url``/``extra_index_urls``/``find_links`` from the config passed to uv),
    then a ``.pth`` adds ``base-site/``: a *link farm* of symlinks to every entry of the
    target's site-packages except the files (per ``RECORD``) of the packages that were
    replaced or must be absent. That is how a package present only in the bad state is
    removed: it is simply not linked, so neither ``import`` nor ``importlib.metadata`` sees
    it, and nothing is ever written into the target environment. A uv failure makes the state
    unresolved ("build: ...") with uv's own message in the trial's ``build-venv.stderr``.
git
    ``git worktree add --detach <session>/worktrees/<repo>-<sha>`` at the state's commit; the
    command runs there (its cwd mapped into the worktree) and absolute argv paths inside the
    repo are rewritten. Uncommitted changes of the recorded state are *not* reproduced unless
    their files are listed under ``files:`` (said in the notes).
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
    cold = a fresh empty ``TORCHINDUCTOR_CACHE_DIR``/``TRITON_CACHE_DIR`` under the trial
    dir; warm = a copy of the recorded dir (the user's own cache is never written to).
    Caches that are not part of any unit are still copied into the sandbox for the same
    reason. A warm state whose recorded dir is gone cannot be realized: said plainly.
data
    When the state wants the *old* version of a dataset and ``data_map`` in the config names
    where it lives, every argv element that mentions the path is rewritten to the mapped
    path, and ``ENVBISECT_DATA_<n>`` (n = position of the path among the manifest's sorted
    data paths) holds the path to use, for scripts that read their data path from the
    environment. Without a mapping the unit is not bisectable.

Changes of the ``torch`` and ``probes`` sections are facts that follow from packages and
files; they need no actuator of their own. Everything else (system, gpu, python, ...) is
reported, never bisected.

Remote targets (``--via``/``--target``): the same actuators act on the target, through
``envbisect.agent.actuate_remote`` shipped with ``Transport.run_agent`` (one operation per
call, nothing installed there). Everything lives under a remote session directory
``<remote $HOME, else /tmp>/.envbisect/session-<id>`` (recorded in the local session log as a
``remote`` event, so ``envbisect reset`` cleans it up too, see :func:`reset_remote`): the
overlay venv is built there with the target's uv (on its PATH, next to its python, or
``python -m uv``; without uv, package units are not bisectable and the reason says so), git
worktrees are added in the remote repo, loose files are swapped after journaling on the
target (blobs travel base64 in the parameters) and restored after every trial and on exit,
cold caches are fresh remote dirs, and ``data_map`` paths are checked on the target. The
per-trial environment reaches the far process through an innermost ``env`` layer (see
``runner.run_once``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbisect.agent.actuate_remote import link_tree
from envbisect.agent.redact import is_redacted
from envbisect.bisect.session import Session
from envbisect.errors import ActuationError, TransportError
from envbisect.manifest import Manifest
from envbisect.transport import Layer, Transport

ACTIONABLE = ("packages", "git", "files", "env", "caches", "data")
DERIVED = ("torch", "probes")

CACHE_ENV = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}
READY = ".envbisect-ready"
FAILED = ".envbisect-failed"
AGENT = "envbisect.agent.actuate_remote"


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


def _realized_changes(unit: Any) -> list[Any]:
    """The changes an actuator makes real for ``unit``: a git unit's committed files come
    with its worktree (see ``diff.COMMITTED_NOTE``) and are not written on their own."""
    if unit.section == "git":
        return [c for c in unit.changes if c.section == "git"]
    return list(unit.changes)


def normalize(name: str) -> str:
    """PEP 503 name."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Realized:
    """One realized state, ready to run a command in."""

    python: str
    env: Mapping[str, str]
    cwd: Path | None = None
    path_map: tuple[tuple[str, str], ...] = ()
    venv: Path | None = None
    notes: tuple[str, ...] = ()
    failure: str | None = None  # "build: ..." when the state cannot be realized

    def map_argv(self, argv: Sequence[str]) -> list[str]:
        """argv with paths of repos/datasets rewritten to the state's worktree/data."""
        out = []
        for arg in argv:
            for old, new in self.path_map:
                if arg == old or arg.startswith(old.rstrip("/") + "/"):
                    arg = new + arg[len(old) :]
                    break
            out.append(arg)
        return out


@dataclass(frozen=True)
class TargetEnv:
    """What the target python has installed (from the probe)."""

    python: str
    base: str
    version: str
    sites: tuple[str, ...]
    dists: Mapping[str, Mapping[str, Any]]
    home: str | None = None  # remote targets: where the remote session dir goes
    path: str | None = None  # remote targets: PATH of the far process
    uv: tuple[str, ...] | None = None  # remote targets: how to run uv there (None: no uv)

    @classmethod
    def from_agent(cls, python: str, data: Mapping[str, Any]) -> TargetEnv:
        """From the ``probe`` operation of the agent (local or through the chain)."""
        return cls(
            python=python,
            base=str(data["base"]),
            version=str(data["version"]),
            sites=tuple(data["sites"]),
            dists={d["name"]: d for d in data["dists"]},
            home=str(data.get("home") or "/tmp"),
            path=str(data.get("path") or ""),
            uv=tuple(data["uv"]) if data.get("uv") else None,
        )


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
    data_map: Mapping[str, str] = field(default_factory=dict)
    blob_dirs: tuple[Path, ...] = ()  # more places to look for stored file contents
    base_env: Mapping[str, str] | None = None
    cwd: Path | None = None
    uv: str | None = None
    _target: TargetEnv | None = None
    _commits: dict[str, list[str]] = field(default_factory=dict)
    _worktrees: dict[tuple[str, str], Path] = field(default_factory=dict)
    _blocked: frozenset[str] | None = None
    _facts: dict[str, Any] | None = None  # remote: answers of the agent's inspect
    _remote_dirty: bool = False  # remote: files may be swapped there right now
    _remote_venvs: set[str] = field(default_factory=set)  # remote: venvs known ready
    # Workers of one host realize states from several threads: one build at a time (venvs
    # and worktrees are shared between states); the trials themselves run side by side.
    _build_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Several actuators of one session (workers with targets of their own) log their agent
    # calls side by side: each under its own name.
    log_tag: str = ""
    on_note: Callable[[str], None] | None = None  # told at once when a restore keeps an edit
    kept: list[str] = field(default_factory=list)  # files restore left as the user edited them
    _claimed: bool = False

    @property
    def remote(self) -> bool:
        """True when the target is reached through a layer chain."""
        return bool(self.transport.layers)

    # -- what can be realized ----------------------------------------------------------

    def blockers(self) -> dict[str, str]:
        """unit id → why this actuator cannot realize it (beyond the diff's own verdict)."""
        out: dict[str, str] = {}
        for unit in self.units:
            if not unit.bisectable:
                continue
            reason = self._unit_blocker(unit)
            if reason:
                out[unit.id] = reason
        return out

    def _unit_blocker(self, unit: Any) -> str | None:
        actionable = [c for c in _realized_changes(unit) if c.section in ACTIONABLE]
        other = sorted({c.section for c in unit.changes} - set(ACTIONABLE) - set(DERIVED))
        if other:
            return f"no actuator for {', '.join(other)} changes (reported, not bisected)"
        if not actionable:
            return "only derived facts changed; nothing to realize"
        for change in actionable:
            section, key = change.section, str(change.key)
            old = self.good.section(section).get(key)
            new = self.bad.section(section).get(key)
            if section == "env":
                why = self._env_blocker(key, old, new)
                if why:
                    return why
            elif section == "files":
                for manifest, value in ((self.good, old), (self.bad, new)):
                    if value is None or self._sha_of(key) == value.get("sha256"):
                        continue
                    if self._blob(manifest, value) is None:
                        where = ", ".join(str(d) for d in blob_dirs(manifest, self.blob_dirs))
                        return (
                            f"files {key}: no stored content for sha256 "
                            f"{str(value.get('sha256'))[:12]} of "
                            f"{manifest.path or 'the manifest'} (looked in "
                            f"{where or 'no blob folder'}; snapshot with keep_blobs: true)"
                        )
            elif section == "git":
                for value in (old, new):
                    head = (value or {}).get("head")
                    if not head or not self._commit_exists(key, head):
                        return f"git {key}: commit {str(head)[:12]} is not in that repo"
            elif section == "caches":
                if str(key) not in CACHE_ENV:
                    return f"caches {key}: no environment variable points it elsewhere"
                for side, value in (("good", old), ("bad", new)):
                    if (
                        isinstance(value, dict)
                        and _is_warm(value)
                        and not self._dir_usable(str(value.get("path") or ""))
                    ):
                        return (
                            f"caches {key}: the {side} state had a warm cache at "
                            f"{value.get('path')} which no longer holds files"
                        )
            elif section == "data":
                mapped = self.data_map.get(key)
                if not mapped or not self._exists(mapped):
                    return (
                        f"data {key}: the other version is not available; "
                        "name where it lives under data_map: in envbisect.yaml"
                    )
            elif section == "packages":
                for value in (old, new):
                    if isinstance(value, dict) and value.get("editable"):
                        return f"packages {key}: an editable install cannot be rebuilt"
                if self.remote and self.target().uv is None:
                    return (
                        f"packages {key}: uv is not available on the target (not on its "
                        f"PATH, not next to {self.python}, not as '{self.python} -m uv'); "
                        "install uv there to bisect packages"
                    )
        return None

    # -- facts, locally or on the remote target -------------------------------------------

    def _inspect(self) -> dict[str, Any]:
        """Every fact blockers()/ordered() need from the target, in one agent call."""
        if self._facts is not None:
            return self._facts
        shas: set[str] = set()
        commits: set[tuple[str, str]] = set()
        revlists: set[tuple[str, str, str]] = set()
        dirs: set[str] = set()
        exists: set[str] = set(str(v) for v in self.data_map.values())
        for unit in self.units:
            for change in unit.changes:
                key = str(change.key)
                old = self.good.section(change.section).get(key)
                new = self.bad.section(change.section).get(key)
                if change.section == "files":
                    shas.add(key)
                elif change.section == "git":
                    heads = [(v or {}).get("head") for v in (old, new)]
                    commits.update((key, h) for h in heads if h)
                    if all(heads):
                        revlists.add((key, str(heads[0]), str(heads[1])))
                elif change.section == "caches":
                    for value in (old, new):
                        if isinstance(value, dict) and value.get("path"):
                            dirs.add(str(value["path"]))
        params: dict[str, Any] = {
            "sha256": sorted(shas),
            "commits": [list(c) for c in sorted(commits)],
            "revlists": [list(r) for r in sorted(revlists)],
            "dirs": sorted(dirs),
            "exists": sorted(exists),
        }
        out = self._agent("inspect", params, self.session.root / "remote", "inspect")
        pairs = {k: list(zip(params[k], out[k], strict=True)) for k in params if k != "sha256"}
        facts: dict[str, Any] = {
            "sha256": dict(out["sha256"]),
            "commits": {tuple(c): ok for c, ok in pairs["commits"]},
            "revlists": {tuple(r): v for r, v in pairs["revlists"]},
            "dirs": dict(pairs["dirs"]),
            "exists": dict(pairs["exists"]),
        }
        self._facts = facts
        return facts

    def _sha_of(self, path: str) -> str | None:
        if not self.remote:
            return self._current_sha(Path(path))
        return self._inspect()["sha256"].get(path)

    def _commit_exists(self, repo: str, sha: str) -> bool:
        if not self.remote:
            return _has_commit(Path(repo), sha)
        return bool(self._inspect()["commits"].get((repo, sha)))

    def _dir_usable(self, path: str) -> bool:
        if not self.remote:
            return _usable_dir(Path(path))
        return bool(self._inspect()["dirs"].get(path))

    def _exists(self, path: str) -> bool:
        if not self.remote:
            return Path(path).exists()
        return bool(self._inspect()["exists"].get(path))

    def _rev_list(self, repo: str, old: str, new: str) -> list[str]:
        if self.remote:
            return list(self._inspect()["revlists"].get((repo, old, new)) or [])
        proc = subprocess.run(
            ["git", "-C", repo, "rev-list", "--reverse", "--ancestry-path", f"{old}..{new}"],
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.stdout.split() if proc.returncode == 0 else []

    def _agent(
        self, op: str, params: Mapping[str, Any], log_dir: Path, name: str, timeout_s: float = 300
    ) -> dict[str, Any]:
        """One operation of the remote agent, through the chain."""
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
        target = self.target()
        tag = hashlib.sha256(
            f"{self.session.root}\0{self.transport.describe()}".encode()
        ).hexdigest()[:12]
        root = f"{(target.home or '/tmp').rstrip('/')}/.envbisect/session-{tag}"
        if not any(
            e.get("type") == "remote" and e.get("root") == root for e in self.session.events()
        ):
            self.session.append(
                {
                    "type": "remote",
                    "root": root,
                    "python": self.python,
                    "layers": [layer.as_dict() for layer in self.transport.layers],
                }
            )
        return root

    def notes(self) -> list[str]:
        """Caveats about the run as a whole (printed once at the start)."""
        out: list[str] = [
            f"env {key} is a secret (redacted in the manifest): every trial passes it "
            "through from your environment unchanged"
            for key in self._passed_through()
        ]
        for unit in self.units:
            for change in unit.changes:
                if change.section != "git":
                    continue
                repo = str(change.key).rstrip("/") + "/"
                for side, m in (("good", self.good), ("bad", self.bad)):
                    value = m.section("git").get(change.key) or {}
                    if not value.get("dirty"):
                        continue
                    tracked = sorted(f for f in m.section("files") if str(f).startswith(repo))
                    if tracked:
                        out.append(
                            f"git {change.key} had uncommitted changes in the {side} state; "
                            f"only the {len(tracked)} file(s) under files: in that repo are "
                            "reproduced from the manifest, any other uncommitted edit is not"
                        )
                    else:
                        out.append(
                            f"git {change.key} had uncommitted changes in the {side} state; "
                            "they are not reproduced unless their files are listed under files:"
                        )
        return out

    def ordered(self) -> dict[str, list[str]]:
        """git unit id → commits after good's head up to bad's head (oldest first)."""
        out: dict[str, list[str]] = {}
        for unit in self.units:
            gits = [c for c in unit.changes if c.section == "git"]
            if len(gits) != 1 or len(_realized_changes(unit)) != 1:
                continue
            old = (self.good.section("git").get(str(gits[0].key)) or {}).get("head")
            new = (self.bad.section("git").get(str(gits[0].key)) or {}).get("head")
            if not old or not new:
                continue
            commits = self._rev_list(str(gits[0].key), str(old), str(new))
            if len(commits) > 1:
                out[unit.id] = commits
                self._commits[unit.id] = commits
        return out

    # -- realizing ---------------------------------------------------------------------

    def _env_blocker(self, key: str, old: Any, new: Any) -> str | None:
        for side, value in (("good", old), ("bad", new)):
            if not is_redacted(value) or (side == "bad" and self._env_holds(key, value)):
                continue
            here = "on the target" if self.remote else "here"
            why = (
                "so it cannot be set"
                if side == "good"
                else f"and {key} {here} is not that value, so it cannot be set"
            )
            return (
                f"env {key}: the {side} value is a secret, redacted in the manifest, {why}; "
                f"every trial passes {key} through from your environment unchanged"
            )
        return None

    def _env_holds(self, key: str, value: Mapping[str, Any]) -> bool:
        """True when the environment trials start from holds the redacted ``value``.

        Remote: the far environment cannot be read here; the bad state is taken to be the
        target as it is (as for every unit that is not bisected)."""
        if self.remote:
            return True
        env = self.base_env if self.base_env is not None else os.environ
        current = env.get(key)
        prefix = str(value.get("redacted") or "")
        if current is None or not prefix:
            return False
        digest = hashlib.sha256(current.encode("utf-8", "surrogateescape")).hexdigest()
        return digest.startswith(prefix)

    def _passed_through(self) -> list[str]:
        """Env vars with a redacted side that no trial sets (their unit is not realized)."""
        blocked = self._blocked_ids()
        out = []
        for unit in self.units:
            if unit.bisectable is not False and unit.id not in blocked:
                continue
            for change in unit.changes:
                if change.section == "env" and (
                    is_redacted(self.good.section("env").get(str(change.key)))
                    or is_redacted(self.bad.section("env").get(str(change.key)))
                ):
                    out.append(str(change.key))
        return sorted(out)

    def _values(
        self, applied: frozenset[str], positions: Mapping[str, int]
    ) -> dict[tuple[str, str], Any]:
        """(section, key) → the state's value for every actionable change."""
        values: dict[tuple[str, str], Any] = {}
        for unit in self.units:
            on = unit.id in applied
            for change in _realized_changes(unit):
                if change.section not in ACTIONABLE:
                    continue
                key = str(change.key)
                source = self.bad if on else self.good
                if unit.bisectable is False or unit.id in self._blocked_ids():
                    if change.section == "env":
                        continue  # never bisected: the variable stays as the environment has it
                    source = self.bad  # never bisected: stays as the target is
                value = source.section(change.section).get(key)
                if on and change.section == "git" and unit.id in positions:
                    commits = self._commits.get(unit.id) or self.ordered().get(unit.id, [])
                    pos = positions[unit.id]
                    if commits and 0 <= pos < len(commits):
                        value = {**(value or {}), "head": commits[pos]}
                values[(change.section, key)] = (source, value)
        return values

    def state_values(
        self, applied: frozenset[str], positions: Mapping[str, int]
    ) -> dict[tuple[str, str], tuple[Manifest, Any]]:
        """(section, key) → (source manifest, value) of every actionable change in a state:
        what ``realize`` makes real, and what ``bisect.faithful`` checks it against."""
        return self._values(applied, positions)

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
        """Build the state; undo every in-place change when the block exits."""
        try:
            with self._build_lock:
                realized = self._build(applied, positions, trial_dir)
            yield realized
        finally:
            self.restore()

    def restore(self) -> None:
        """Put back every file swapped in place, here and (when remote) on the target.

        A file the user changed meanwhile is kept as it is (the original written beside
        it): each such file is one line in ``kept``, also handed to ``on_note`` at once.
        """
        journal = self.session.journal
        seen = len(journal.kept)
        journal.restore()
        lines = [k.describe() for k in journal.kept[seen:]]
        if self.remote and self._remote_dirty:
            out = self._agent(
                "restore", {"root": self.remote_root()}, self.session.root / "remote", "restore"
            )
            self._remote_dirty = False
            where = self.transport.describe()
            lines += [f"{line} (via {where})" for line in out.get("kept") or ()]
        for line in lines:
            self.kept.append(line)
            if self.on_note is not None:
                self.on_note(line)

    def claim_files(self) -> None:
        """Lock, machine-wide, every loose file a trial may swap in place (once per run), so
        a second run on the same file is refused before either touches it."""
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

    def _build(
        self, applied: frozenset[str], positions: Mapping[str, int], trial_dir: Path
    ) -> Realized:
        self.claim_files()
        values = self._values(applied, positions)
        env = dict(self.base_env if self.base_env is not None else os.environ)
        notes: list[str] = []
        path_map: list[tuple[str, str]] = []
        remote = self.remote
        # Remote: a cwd of this machine means nothing there; only a worktree sets one.
        cwd = self.cwd if not remote else None
        python = self.python
        venv: Path | None = None
        root = self.remote_root() if remote else None
        ops: dict[str, list[Any]] = {"worktrees": [], "swaps": [], "caches": []}

        # packages
        wanted = {k: v for (s, k), (_src, v) in values.items() if s == "packages"}
        if wanted:
            try:
                venv, failure = self._venv(wanted, trial_dir)
            except TransportError as exc:
                return Realized(python=python, env=env, failure=f"build: {exc}")
            if failure:
                return Realized(python=python, env=env, failure=failure)
            if venv is not None:
                python = str(venv / "bin" / "python")
                # The link farm points into the target environment: never write bytecode
                # through it (existing .pyc files are still read).
                env["PYTHONDONTWRITEBYTECODE"] = "1"
        if venv is not None or os.path.isabs(self.python):
            bindir = str(Path(python).parent)
            if remote:
                far_path = self.target().path or "/usr/local/bin:/usr/bin:/bin"
                env["PATH"] = bindir + ":" + far_path
                if venv is not None:
                    env["VIRTUAL_ENV"] = str(venv)
                    env.pop("PYTHONHOME", None)
            else:
                env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
                prefix = Path(python).parent.parent
                if (prefix / "pyvenv.cfg").exists():
                    env["VIRTUAL_ENV"] = str(prefix)
                    env.pop("PYTHONHOME", None)

        # git
        worktrees: dict[str, Path] = {}
        for (section, key), (_src, value) in sorted(values.items()):
            if section != "git":
                continue
            head = (value or {}).get("head")
            if remote:
                if not head:
                    return Realized(python=python, env=env, failure=f"build: git {key}: no commit")
                assert root is not None
                path = Path(f"{root}/worktrees/{_worktree_name(Path(key), str(head))}")
                ops["worktrees"].append([key, str(head), str(path)])
                worktrees[key] = path
                continue
            try:
                worktrees[key] = self._worktree(Path(key), head)
            except ActuationError as exc:
                return Realized(python=python, env=env, failure=f"build: {exc}")
        for repo, wt in worktrees.items():
            path_map.append((repo, str(wt)))
        if worktrees:
            base = Path(self.cwd or Path.cwd()).absolute()
            mapped = None
            for repo, wt in worktrees.items():
                with contextlib.suppress(ValueError):
                    mapped = wt / base.relative_to(repo)
            if mapped is None and len(worktrees) == 1:
                mapped = next(iter(worktrees.values()))
            if mapped is not None:
                cwd = mapped
                env["PWD"] = str(mapped)

        # files
        for (section, key), (source, value) in sorted(values.items()):
            if section != "files":
                continue
            target = Path(key)
            for repo, wt in worktrees.items():
                with contextlib.suppress(ValueError):
                    target = wt / Path(key).relative_to(repo)
                    break
            want = None if value is None else value.get("sha256")
            if remote:
                # Always sent: the agent first puts back any swap a killed run left there
                # and compares again, so what the target had at the start of the run (the
                # inspect facts) says nothing about what it has now. Content travels when
                # known; without it the agent fails unless the file already is as wanted.
                item: dict[str, Any] = {"path": str(target), "sha256": want}
                if want is not None:
                    blob = self._blob(source, value)
                    if blob is None and not (target == Path(key) and self._sha_of(key) == want):
                        return Realized(
                            python=python, env=env, failure=f"build: no content for {key}"
                        )
                    if blob is not None:
                        item["content"] = base64.b64encode(blob.read_bytes()).decode("ascii")
                ops["swaps"].append(item)
                continue
            if self._current_sha(target) == want and want is not None:
                continue
            if want is None:
                if target.exists():
                    self.session.journal.swap(target, None)
                continue
            blob = self._blob(source, value)
            if blob is None:
                return Realized(python=python, env=env, failure=f"build: no content for {key}")
            self.session.journal.swap(target, blob.read_bytes())

        # env
        for (section, key), (_src, value) in values.items():
            if section != "env":
                continue
            if value is None:
                env.pop(key, None)
            elif isinstance(value, str):
                env[key] = value
            # else: redacted, and (see _env_blocker) the environment already holds it.

        # caches: every known compile cache points into the trial sandbox
        cache_values = {k: v for (s, k), (_src, v) in values.items() if s == "caches"}
        for name, var in CACHE_ENV.items():
            if name in cache_values:
                value = cache_values[name]
            else:
                value = self.bad.section("caches").get(name)
            warm = str((value or {}).get("path") or "") if _is_warm(value) else None
            if remote:
                dest_s = f"{root}/trials/{trial_dir.name}/caches/{name}"
                ops["caches"].append({"name": name, "dest": dest_s, "src": warm})
                env[var] = dest_s
                continue
            dest = trial_dir / "caches" / name
            if dest.exists():
                shutil.rmtree(dest)
            src = Path(warm) if warm is not None else None
            if src is not None and _usable_dir(src):
                shutil.copytree(src, dest, symlinks=True)
            else:
                dest.mkdir(parents=True)
                if src is not None:
                    notes.append(f"caches {name}: {src} is gone; running cold")
            env[var] = str(dest)

        # data
        data_keys = sorted(str(k) for k in (self.bad.section("data") or {}))
        for (section, key), (source, _value) in values.items():
            if section != "data":
                continue
            use = key
            if source is self.good and key in self.data_map:
                use = self.data_map[key]
                path_map.append((key, use))
            if key in data_keys:
                env[f"ENVBISECT_DATA_{data_keys.index(key)}"] = use

        if remote:
            assert root is not None
            self._remote_dirty = self._remote_dirty or bool(ops["swaps"])
            try:
                out = self._agent(
                    "realize", {"root": root, "pid": os.getpid(), **ops}, trial_dir, "realize"
                )
            except TransportError as exc:
                return Realized(python=python, env=env, failure=f"build: {exc}")
            notes.extend(out.get("notes") or ())
            if out.get("failure"):
                return Realized(python=python, env=env, failure=str(out["failure"]))
        # Longest prefixes first, so a dataset inside a repo wins over the repo.
        path_map.sort(key=lambda p: -len(p[0]))
        return Realized(
            python=python,
            env=env,
            cwd=cwd,
            path_map=tuple(path_map),
            venv=venv,
            notes=tuple(notes),
        )

    # -- packages ----------------------------------------------------------------------

    def target(self) -> TargetEnv:
        if self._target is None:
            # One probe for both cases: the agent's, shipped on stdin through the chain
            # (the empty chain when local).
            log_dir = self.session.root / "remote" if self.remote else self.session.root
            try:
                data = self._agent("probe", {}, log_dir, "probe-env")
            except TransportError as exc:
                raise ActuationError(f"cannot list the packages of {self.python}: {exc}") from None
            self._target = TargetEnv.from_agent(self.python, data)
        return self._target

    def _venv(self, wanted: Mapping[str, Any], trial_dir: Path) -> tuple[Path | None, str | None]:
        """The overlay venv for ``wanted`` (None: the target itself fits), or a failure."""
        target = self.target()
        installs: dict[str, str] = {}
        hides: set[str] = set()
        for raw_name, value in sorted(wanted.items()):
            name = normalize(raw_name)
            have = target.dists.get(name)
            if value is None:
                if have is not None:
                    hides.add(name)
                continue
            version = str(value.get("version")) if isinstance(value, dict) else str(value)
            if have is not None and str(have["version"]) == version:
                continue
            installs[name] = _requirement(name, value)
            if have is not None:
                hides.add(name)
        if not installs and not hides:
            return None, None
        for name in hides:
            if target.dists[name].get("files") is None:
                return None, (
                    f"build: cannot replace or remove {name} in {target.python}: "
                    "its installed files are not listed (no RECORD)"
                )
        spec = {
            "python": target.python,
            "install": installs,
            "hide": sorted(hides),
            "index": [self.index_url, list(self.extra_index_urls), list(self.find_links)],
        }
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
        excluded: dict[str, set[str]] = {}
        for name in hides:
            dist = target.dists[name]
            paths = excluded.setdefault(os.path.realpath(dist["location"]), set())
            for f in dist["files"] or ():
                norm = os.path.normpath(f)
                if not norm.startswith(".."):
                    paths.add(norm)
        if self.remote:
            return self._remote_venv(target, spec, digest, installs, excluded, trial_dir)
        venv = self.session.root / "venvs" / digest
        if (venv / READY).exists():
            return venv, None
        if (venv / FAILED).exists():
            return None, (venv / FAILED).read_text(encoding="utf-8").strip()
        if venv.exists():
            shutil.rmtree(venv)
        venv.parent.mkdir(parents=True, exist_ok=True)
        uv = self._uv()
        res = self.transport.run(
            [uv, "venv", "--quiet", "--python", target.base, str(venv)],
            log_dir=trial_dir,
            name="build-venv",
            timeout_s=300,
        )
        if res.returncode != 0:
            return None, f"build: uv venv failed: {_last_line(res.stderr_path)}"
        if installs:
            argv = [uv, "pip", "install", "--no-deps", "--compile-bytecode"]
            argv += ["--python", str(venv / "bin" / "python")]
            if self.index_url:
                argv += ["--index-url", self.index_url]
            for url in self.extra_index_urls:
                argv += ["--extra-index-url", url]
            for link in self.find_links:
                argv += ["--find-links", link]
            argv += list(installs.values())
            res = self.transport.run(argv, log_dir=trial_dir, name="build-install", timeout_s=1800)
            if res.returncode != 0:
                why = (
                    f"build: uv pip install {' '.join(installs.values())} failed: "
                    f"{_last_line(res.stderr_path)} (full log: {res.stderr_path})"
                )
                (venv / FAILED).write_text(why + "\n", encoding="utf-8")
                return None, why
        site = _venv_site(venv)
        farm = venv / "base-site"
        for site_dir in target.sites:
            link_tree(site_dir, str(farm), "", excluded.get(site_dir, set()))
        (site / "_envbisect_base.pth").write_text(
            f"import site; site.addsitedir({str(farm)!r})\n", encoding="utf-8"
        )
        (venv / READY).write_text(json.dumps(spec, sort_keys=True) + "\n", encoding="utf-8")
        return venv, None

    def _remote_venv(
        self,
        target: TargetEnv,
        spec: Mapping[str, Any],
        digest: str,
        installs: Mapping[str, str],
        excluded: Mapping[str, set[str]],
        trial_dir: Path,
    ) -> tuple[Path | None, str | None]:
        """The overlay venv built on the target by the agent (uv's output in the trial log)."""
        if target.uv is None:
            return None, "build: uv is not available on the target"
        venv = f"{self.remote_root()}/venvs/{digest}"
        if venv in self._remote_venvs:
            return Path(venv), None  # built (or found ready) there earlier in this run
        out = self._agent(
            "venv",
            {
                "venv": venv,
                "uv": list(target.uv),
                "base": target.base,
                "install": list(installs.values()),
                "index_url": self.index_url,
                "extra_index_urls": list(self.extra_index_urls),
                "find_links": list(self.find_links),
                "sites": list(target.sites),
                "excluded": {k: sorted(v) for k, v in excluded.items()},
                "spec": dict(spec),
            },
            trial_dir,
            "build-venv",
            timeout_s=1800,
        )
        if out.get("failure"):
            why = str(out["failure"])
            return None, f"{why} (full log: {trial_dir / 'build-venv.stderr'})"
        self._remote_venvs.add(venv)
        return Path(str(out["venv"])), None

    def _uv(self) -> str:
        if self.uv:
            return self.uv
        found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
        if not found:
            raise ActuationError("uv not found on PATH (needed to build package states)")
        self.uv = found
        return found

    # -- git ---------------------------------------------------------------------------

    def _worktree(self, repo: Path, head: str | None) -> Path:
        if not head:
            raise ActuationError(f"git {repo}: the state has no commit")
        cached = self._worktrees.get((str(repo), head))
        if cached is not None and cached.exists():
            return cached
        path = self.session.root / "worktrees" / _worktree_name(repo, head)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            self.session.record_worktree(repo, path)
            proc = subprocess.run(
                ["git", "-C", str(repo), "worktree", "add", "--detach", str(path), head],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise ActuationError(
                    f"git {repo}: cannot check out {head[:12]}: {proc.stderr.strip()}"
                )
        self._worktrees[(str(repo), head)] = path
        return path

    # -- files -------------------------------------------------------------------------

    def _blob(self, manifest: Manifest, value: Mapping[str, Any]) -> Path | None:
        """The stored content of a files entry: under the blob dir the snapshot recorded
        (``meta.blobs_dir``), beside the manifest, one level up (``manifests/blobs`` next to
        a manifest in a subfolder) or in this run's ``manifests_dir``; checked by sha256."""
        sha = value.get("blob") or value.get("sha256")
        if not sha:
            return None
        for base in blob_dirs(manifest, self.blob_dirs):
            blob = base / str(sha)
            if blob.is_file() and self._current_sha(blob) == str(value.get("sha256") or sha):
                return blob
        return None

    @staticmethod
    def _current_sha(path: Path) -> str | None:
        try:
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            return h.hexdigest()
        except OSError:
            return None

    def close(self) -> None:
        """Restore files and remove the worktrees (venvs stay for a later --resume), here
        and, for a remote target, there."""
        self.restore()
        self.session.remove_worktrees()
        self._worktrees.clear()
        if self.remote and self._target is not None:
            self._agent(
                "cleanup", {"root": self.remote_root()}, self.session.root / "remote", "cleanup"
            )
            self._remote_dirty = False


def reset_remote(session: Session) -> list[str]:
    """``envbisect reset`` for the remote parts of ``session``: restore the target's journal,
    remove its worktrees, venvs and cache dirs. Returns one line per thing done."""
    lines: list[str] = []
    seen: set[str] = set()
    for ev in session.events():
        if ev.get("type") != "remote" or ev.get("root") in seen:
            continue
        root = str(ev["root"])
        seen.add(root)
        transport = Transport(tuple(Layer(tuple(d["argv"]), d["kind"]) for d in ev["layers"]))
        out = transport.run_agent(
            str(ev["python"]),
            AGENT,
            {"op": "cleanup", "root": root, "all": True},
            timeout_s=300,
            log_dir=session.root / "remote",
            name="reset",
        )
        where = transport.describe()
        lines += [f"restored {p} (via {where})" for p in out.get("restored") or ()]
        lines += [f"{line} (via {where})" for line in out.get("kept") or ()]
        lines += [f"removed worktree {p} (via {where})" for p in out.get("worktrees") or ()]
        lines += [f"removed {p} (via {where})" for p in out.get("removed") or ()]
    return lines


def _requirement(name: str, value: Any) -> str:
    if not isinstance(value, dict):
        return f"{name}=={value}"
    direct = value.get("direct_url")
    if isinstance(direct, dict) and direct.get("url"):
        vcs = direct.get("vcs_info") or {}
        if vcs.get("vcs") and vcs.get("commit_id"):
            return f"{name} @ {vcs['vcs']}+{direct['url']}@{vcs['commit_id']}"
        return f"{name} @ {direct['url']}"
    if isinstance(direct, str) and direct:
        return f"{name} @ {direct}"
    return f"{name}=={value.get('version')}"


def _venv_site(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    if not found:
        raise ActuationError(f"{venv}: no site-packages in the new venv")
    return found[0]


def _worktree_name(repo: Path, head: str) -> str:
    tag = hashlib.sha256(str(repo).encode()).hexdigest()[:8]
    return f"{repo.name}-{tag}-{head[:12]}"


def _is_warm(value: Any) -> bool:
    if not isinstance(value, dict) or value.get("exists") is False:
        return False
    files = value.get("files")
    return bool(files) if files is not None else bool(value.get("bytes"))


def _usable_dir(path: Path) -> bool:
    try:
        return path.is_dir() and any(path.iterdir())
    except OSError:
        return False


def _has_commit(repo: Path, sha: str) -> bool:
    proc = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "-e", f"{sha}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return "(no log)"
    lines = [ln.strip() for ln in lines if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"
