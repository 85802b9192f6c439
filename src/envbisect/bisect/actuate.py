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
    Content from ``blobs/<sha256>`` next to the manifest. Inside a repo that has a worktree
    this trial, written there; otherwise swapped in place after journaling the original
    (see ``session.FileJournal``), and restored after every trial.
env
    The per-trial environment: each env unit's variable set to the state's value, or unset.
    Redacted values cannot be realized: such a unit is not bisectable.
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

Remote targets (``--via``/``--target``): env units act per trial (through ``env -u NAME
NAME=value cmd`` inside the chain); packages, git, files, caches and data would have to be
built on the target and are marked not bisectable there (not built yet).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbisect.bisect.session import Session
from envbisect.errors import ActuationError
from envbisect.manifest import Manifest
from envbisect.transport import Transport

ACTIONABLE = ("packages", "git", "files", "env", "caches", "data")
DERIVED = ("torch", "probes")

CACHE_ENV = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}
READY = ".envbisect-ready"
FAILED = ".envbisect-failed"

# Run inside the target python: what is installed, where, and which files each owns.
_PROBE = r"""
import json, os, sys
from importlib import metadata
sites = []
for p in sys.path:
    if p and os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p):
        rp = os.path.realpath(p)
        if rp not in sites:
            sites.append(rp)
dists = []
seen = set()
for d in metadata.distributions():
    name = (d.metadata["Name"] or "").strip()
    if not name:
        continue
    key = name.lower().replace("_", "-").replace(".", "-")
    loc = os.path.realpath(str(d.locate_file("")))
    if key in seen:
        continue
    seen.add(key)
    files = d.files
    dists.append({"name": key, "version": d.version, "location": loc,
                  "files": None if files is None else [str(f) for f in files]})
print(json.dumps({"sites": sites, "base": getattr(sys, "_base_executable", sys.executable),
                  "executable": sys.executable, "prefix": sys.prefix,
                  "version": "%d.%d" % sys.version_info[:2], "dists": dists}))
"""


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

    @classmethod
    def probe(cls, python: str, transport: Transport, log_dir: Path) -> TargetEnv:
        res = transport.run(
            [python, "-c", _PROBE], log_dir=log_dir, name="probe-env", timeout_s=120
        )
        try:
            data = json.loads(res.stdout().decode("utf-8").strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise ActuationError(
                f"cannot list the packages of {python}: exit {res.returncode}; "
                f"see {res.stderr_path}"
            ) from None
        return cls(
            python=python,
            base=data["base"],
            version=data["version"],
            sites=tuple(data["sites"]),
            dists={d["name"]: d for d in data["dists"]},
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
    base_env: Mapping[str, str] | None = None
    cwd: Path | None = None
    uv: str | None = None
    _target: TargetEnv | None = None
    _commits: dict[str, list[str]] = field(default_factory=dict)
    _worktrees: dict[tuple[str, str], Path] = field(default_factory=dict)
    _blocked: frozenset[str] | None = None

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
        actionable = [c for c in unit.changes if c.section in ACTIONABLE]
        other = sorted({c.section for c in unit.changes} - set(ACTIONABLE) - set(DERIVED))
        if other:
            return f"no actuator for {', '.join(other)} changes (reported, not bisected)"
        if not actionable:
            return "only derived facts changed; nothing to realize"
        remote = bool(self.transport.layers)
        for change in actionable:
            section, key = change.section, str(change.key)
            if remote and section in ("packages", "git", "files", "data", "caches"):
                return f"{section} changes cannot be realized on a remote target yet"
            old = self.good.section(section).get(key)
            new = self.bad.section(section).get(key)
            if section == "env":
                for side, value in (("good", old), ("bad", new)):
                    if isinstance(value, dict):
                        return (
                            f"env {key}: the {side} value is redacted in the manifest, "
                            "so it cannot be set"
                        )
            elif section == "files":
                for manifest, value in ((self.good, old), (self.bad, new)):
                    if value is None or self._current_sha(Path(key)) == value.get("sha256"):
                        continue
                    if self._blob(manifest, value) is None:
                        return (
                            f"files {key}: no stored content for sha256 "
                            f"{str(value.get('sha256'))[:12]} next to "
                            f"{manifest.path or 'the manifest'}"
                            " (snapshot with keep_blobs: true)"
                        )
            elif section == "git":
                for value in (old, new):
                    head = (value or {}).get("head")
                    if not head or not _has_commit(Path(key), head):
                        return f"git {key}: commit {str(head)[:12]} is not in that repo"
            elif section == "caches":
                if str(key) not in CACHE_ENV:
                    return f"caches {key}: no environment variable points it elsewhere"
                for side, value in (("good", old), ("bad", new)):
                    if (
                        isinstance(value, dict)
                        and _is_warm(value)
                        and not _usable_dir(Path(value.get("path") or ""))
                    ):
                        return (
                            f"caches {key}: the {side} state had a warm cache at "
                            f"{value.get('path')} which no longer holds files"
                        )
            elif section == "data":
                mapped = self.data_map.get(key)
                if not mapped or not Path(mapped).exists():
                    return (
                        f"data {key}: the other version is not available; "
                        "name where it lives under data_map: in envbisect.yaml"
                    )
            elif section == "packages":
                for value in (old, new):
                    if isinstance(value, dict) and value.get("editable"):
                        return f"packages {key}: an editable install cannot be rebuilt"
        return None

    def notes(self) -> list[str]:
        """Caveats about the run as a whole (printed once at the start)."""
        out: list[str] = []
        for unit in self.units:
            for change in unit.changes:
                if change.section != "git":
                    continue
                for side, m in (("good", self.good), ("bad", self.bad)):
                    value = m.section("git").get(change.key) or {}
                    if value.get("dirty"):
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
            if len(gits) != 1 or len(unit.changes) != 1 or self.transport.layers:
                continue
            repo = Path(str(gits[0].key))
            old = (self.good.section("git").get(str(gits[0].key)) or {}).get("head")
            new = (self.bad.section("git").get(str(gits[0].key)) or {}).get("head")
            if not old or not new:
                continue
            proc = subprocess.run(
                [
                    "git",
                    "-C",
                    str(repo),
                    "rev-list",
                    "--reverse",
                    "--ancestry-path",
                    f"{old}..{new}",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            commits = proc.stdout.split() if proc.returncode == 0 else []
            if len(commits) > 1:
                out[unit.id] = commits
                self._commits[unit.id] = commits
        return out

    # -- realizing ---------------------------------------------------------------------

    def _values(
        self, applied: frozenset[str], positions: Mapping[str, int]
    ) -> dict[tuple[str, str], Any]:
        """(section, key) → the state's value for every actionable change."""
        values: dict[tuple[str, str], Any] = {}
        for unit in self.units:
            on = unit.id in applied
            for change in unit.changes:
                if change.section not in ACTIONABLE:
                    continue
                key = str(change.key)
                source = self.bad if on else self.good
                if unit.bisectable is False or unit.id in self._blocked_ids():
                    source = self.bad  # never bisected: stays as the target is
                value = source.section(change.section).get(key)
                if on and change.section == "git" and unit.id in positions:
                    commits = self._commits.get(unit.id) or self.ordered().get(unit.id, [])
                    pos = positions[unit.id]
                    if commits and 0 <= pos < len(commits):
                        value = {**(value or {}), "head": commits[pos]}
                values[(change.section, key)] = (source, value)
        return values

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
            yield self._build(applied, positions, trial_dir)
        finally:
            self.session.journal.restore()

    def _build(
        self, applied: frozenset[str], positions: Mapping[str, int], trial_dir: Path
    ) -> Realized:
        values = self._values(applied, positions)
        env = dict(self.base_env if self.base_env is not None else os.environ)
        notes: list[str] = []
        path_map: list[tuple[str, str]] = []
        cwd = self.cwd
        python = self.python
        venv: Path | None = None

        # packages
        wanted = {k: v for (s, k), (_src, v) in values.items() if s == "packages"}
        if wanted:
            venv, failure = self._venv(wanted, trial_dir)
            if failure:
                return Realized(python=python, env=env, failure=failure)
            if venv is not None:
                python = str(venv / "bin" / "python")
                # The link farm points into the target environment: never write bytecode
                # through it (existing .pyc files are still read).
                env["PYTHONDONTWRITEBYTECODE"] = "1"
        remote = bool(self.transport.layers)
        if not remote and (venv is not None or os.path.isabs(self.python)):
            bindir = str(Path(python).parent)
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
            else:
                env[key] = str(value)

        # caches: every known compile cache points into the trial sandbox
        cache_values = {k: v for (s, k), (_src, v) in values.items() if s == "caches"}
        for name, var in CACHE_ENV.items() if not remote else ():
            if name in cache_values:
                value = cache_values[name]
            else:
                value = self.bad.section("caches").get(name)
            dest = trial_dir / "caches" / name
            if dest.exists():
                shutil.rmtree(dest)
            src = Path((value or {}).get("path") or "") if _is_warm(value) else None
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
            self._target = TargetEnv.probe(self.python, self.transport, self.session.root)
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
        excluded: dict[str, set[str]] = {}
        for name in hides:
            dist = target.dists[name]
            paths = excluded.setdefault(os.path.realpath(dist["location"]), set())
            for f in dist["files"] or ():
                norm = os.path.normpath(f)
                if not norm.startswith(".."):
                    paths.add(norm)
        for site_dir in target.sites:
            _link_tree(Path(site_dir), farm, "", excluded.get(site_dir, set()))
        (site / "_envbisect_base.pth").write_text(
            f"import site; site.addsitedir({str(farm)!r})\n", encoding="utf-8"
        )
        (venv / READY).write_text(json.dumps(spec, sort_keys=True) + "\n", encoding="utf-8")
        return venv, None

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
        tag = hashlib.sha256(str(repo).encode()).hexdigest()[:8]
        path = self.session.root / "worktrees" / f"{repo.name}-{tag}-{head[:12]}"
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

    @staticmethod
    def _blob(manifest: Manifest, value: Mapping[str, Any]) -> Path | None:
        sha = value.get("blob") or value.get("sha256")
        if not sha or manifest.path is None:
            return None
        for base in (manifest.path.parent, manifest.path.parent.parent):
            blob = base / "blobs" / str(sha)
            if blob.is_file():
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
        """Restore files and remove the worktrees (venvs stay for a later --resume)."""
        self.session.journal.restore()
        self.session.remove_worktrees()
        self._worktrees.clear()


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


def _link_tree(src: Path, dst: Path, rel: str, excluded: set[str]) -> None:
    """Symlink every entry of ``src`` into ``dst`` except ``excluded`` relative paths.

    A directory that holds excluded files is recreated (not linked) and filled entry by
    entry; its ``__pycache__`` is left out (stale bytecode of a removed module must not make
    the directory an importable namespace package), and it is dropped when nothing is left.
    """
    if not src.is_dir():
        return
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        r = entry.name if not rel else f"{rel}/{entry.name}"
        if r in excluded or (rel and entry.name == "__pycache__"):
            continue
        out = dst / entry.name
        if out.exists() or out.is_symlink():
            continue  # an earlier site directory wins, as on sys.path
        if entry.is_dir(follow_symlinks=True) and any(p.startswith(r + "/") for p in excluded):
            _link_tree(Path(entry.path), out, r, excluded)
            if out.is_dir() and not any(out.iterdir()):
                out.rmdir()
            continue
        os.symlink(entry.path, out)


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
