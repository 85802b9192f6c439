"""A manifest of the state a machine most probably had at an earlier time (``--as-of``).

The user who never took a snapshot of the good state still has a time ("it was fast before
the 20th"). This module takes today's snapshot, asks the target what it still holds about
that time (``envbisect.agent.asof``: reflogs, commits, dist-info install times, kept
wheels, mtimes) and rewrites each fact to its most probable past value. Every rewritten or
kept fact gets a ``Fact``: its confidence and the evidence behind it, written to the
manifest's ``reconstructed:`` block. Nothing here prints.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

from envbisect.model.config import Config
from envbisect.model.errors import ReconstructError, TransportError
from envbisect.model.manifest import Manifest, ManifestError
from envbisect.model.manifest import load as load_manifest
from envbisect.snapshot.resolver import Resolver, uv_resolver
from envbisect.snapshot.when import iso
from envbisect.transport import Transport

AGENT = "envbisect.agent.asof"


class Confidence(str, Enum):
    """How sure a reconstructed fact is."""

    HIGH = "high"  # direct evidence: a reflog entry, an install time, an mtime before
    MEDIUM = "medium"  # indirect: last commit before, a kept older wheel, an older snapshot
    LOW = "low"  # a resolver's guess (uv pip compile --exclude-newer)
    UNKNOWN = "unknown"  # no evidence: today's value taken


LOW_CONFIDENCE = (Confidence.LOW, Confidence.UNKNOWN)


@dataclass(frozen=True)
class Fact:
    """One reconstructed fact: which entry, how sure, and why."""

    section: str
    key: str
    confidence: Confidence
    method: str
    evidence: str

    def as_dict(self) -> dict[str, str]:
        return {
            "confidence": self.confidence.value,
            "method": self.method,
            "evidence": self.evidence,
        }

    def describe(self) -> str:
        return f"{self.section} {self.key}: {self.confidence.value} ({self.evidence})"


@dataclass(frozen=True)
class Reconstruction:
    """The reconstructed manifest and the facts it rests on."""

    manifest: Manifest
    facts: tuple[Fact, ...]
    as_of: datetime

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> Reconstruction:
        """The reconstruction a written manifest records (ReconstructError when none)."""
        block = manifest.section("reconstructed")
        try:
            when = datetime.fromisoformat(str(block.get("as_of")).replace("Z", "+00:00"))
        except ValueError:
            raise ReconstructError(
                f"{manifest.path or manifest.label}: not a reconstructed manifest "
                "(no reconstructed.as_of)"
            ) from None
        return cls(manifest, tuple(facts_of(manifest).values()), when)

    def doubtful(self) -> tuple[Fact, ...]:
        """Facts of low or unknown confidence: the likely reasons a good state is not good."""
        return tuple(f for f in self.facts if f.confidence in LOW_CONFIDENCE)


# ---- collecting -------------------------------------------------------------------------


def agent_params(config: Config, today: Manifest, when: datetime) -> dict[str, Any]:
    """What the as-of agent is asked about: today's repos, files and data."""
    return {
        "as_of": when.timestamp(),
        "repos": sorted(today.section("git")),
        "files": sorted(today.section("files")),
        "data": sorted(today.section("data")),
        "data_map": dict(config.data_map),
        "keep_blobs": config.keep_blobs,
        "find_links": [str(p) for p in config.find_links],
        "cmd_timeout_s": 30.0,
    }


def snapshot_as_of(
    config: Config,
    transport: Transport,
    python: str,
    when: datetime,
    *,
    label: str | None = None,
    log_dir: Path | None = None,
    timeout_s: float = 60,
) -> Reconstruction:
    """Today's snapshot of ``python``'s machine, rebuilt for ``when``."""
    from envbisect.snapshot import take_snapshot

    today = take_snapshot(
        config, transport, python, label=label, log_dir=log_dir, timeout_s=timeout_s
    )
    own_logs = log_dir is None
    logs = Path(tempfile.mkdtemp(prefix="envbisect-asof-")) if log_dir is None else log_dir
    try:
        return reconstruct(
            config, transport, python, when, today=today, log_dir=logs, timeout_s=timeout_s
        )
    except ReconstructError as exc:
        if isinstance(exc.__context__, TransportError):
            own_logs = False  # keep the full log the message points at
        raise
    finally:
        if own_logs:
            shutil.rmtree(logs, ignore_errors=True)


def reconstruct(
    config: Config,
    transport: Transport,
    python: str,
    when: datetime,
    *,
    today: Manifest,
    log_dir: Path,
    timeout_s: float = 60,
    resolver: Resolver | None = None,
) -> Reconstruction:
    """The state of ``python``'s machine at ``when``, from ``today``'s snapshot of it."""
    from envbisect.snapshot import blob_cap, store_blobs
    from envbisect.transport.reply import BlobSink

    sink = BlobSink(config.blobs_dir, blob_cap(config))
    try:
        held = transport.run_agent(
            python,
            AGENT,
            agent_params(config, today, when),
            timeout_s=timeout_s,
            log_dir=log_dir,
            name="asof",
            blobs=sink,
        )
    except TransportError as exc:
        raise ReconstructError(f"reading the history of {python}: {exc}") from None
    if "__agent_error__" in held:
        raise ReconstructError(f"reading the history of {python}: {held['__agent_error__']}")
    errors = list(held.get("errors") or []) + sink.errors
    errors.extend(store_blobs(held.get("blobs") or {}, config.blobs_dir))
    return rebuild(config, today, when, held, resolver or uv_resolver(config), errors)


def rebuild(
    config: Config,
    today: Manifest,
    when: datetime,
    held: Mapping[str, Any],
    resolver: Resolver,
    errors: list[dict[str, str]] | None = None,
) -> Reconstruction:
    """``today`` rewritten for ``when`` from what the target ``held`` (the as-of agent's
    result). Reads only earlier manifests in ``config.manifests_dir``; packages installed
    after the time with no older build kept go to ``resolver``."""
    return _Builder(config, today, when, held, resolver).build(list(errors or []))


@dataclass
class _Builder:
    """Rewrites today's sections one family at a time, collecting the facts."""

    config: Config
    today: Manifest
    when: datetime
    held: Mapping[str, Any]
    resolver: Resolver
    facts: list[Fact] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)
    earlier: list[tuple[str, Manifest]] | None = None

    def note(self, section: str, key: str, confidence: Confidence, method: str, why: str) -> None:
        self.facts.append(Fact(section, key, confidence, method, why))

    def build(self, errors: list[dict[str, str]]) -> Reconstruction:
        self.sections = {k: v for k, v in self.today.sections.items()}
        self._git()
        self._packages()
        self._loose("files")
        self._loose("data")
        self._env_and_caches()
        meta = dict(self.today.section("meta"))
        meta["label"] = f"{meta.get('label') or 'snapshot'}-as-of"
        meta["errors"] = list(meta.get("errors") or []) + errors
        if self.config.keep_blobs:
            meta["blobs_dir"] = str(self.config.blobs_dir.absolute())
        self.sections["meta"] = dict(sorted(meta.items()))
        self.sections["reconstructed"] = reconstructed_block(self.when, self.today, self.facts)
        manifest = Manifest(sections=self.sections)
        return Reconstruction(manifest, tuple(self.facts), self.when)

    # -- git ---------------------------------------------------------------------------

    def _git(self) -> None:
        out = {}
        for repo, entry in self.today.section("git").items():
            past = (self.held.get("repos") or {}).get(repo) or {}
            if past.get("error") or not isinstance(entry, dict):
                out[repo] = entry
                self.note("git", repo, Confidence.UNKNOWN, "today", str(past.get("error")))
                continue
            if not past.get("head"):
                first = past.get("first_commit_time")
                since = f" (its first commit is from {iso(first)})" if first else ""
                raise ReconstructError(
                    f"{repo}: no commit before {iso(self.when)}{since}; nothing to reconstruct"
                )
            out[repo] = {**entry, "head": past["head"], "dirty": False, "diff_sha256": None}
            self.note("git", repo, *_git_evidence(past))
        self.sections["git"] = dict(sorted(out.items()))

    def _repo_file(self, path: str) -> tuple[dict[str, Any], Fact] | None:
        for repo, past in (self.held.get("repos") or {}).items():
            files = past.get("files") or {}
            if path in files:
                head = str(past.get("head"))[:12]
                sure = Confidence.HIGH if past.get("method") == "reflog" else Confidence.MEDIUM
                why = (
                    f"content at commit {head} of {repo}; uncommitted edits of that time are "
                    "unknowable"
                )
                fact = Fact("files", path, sure, "repo-commit", why)
                entry = files[path]
                if entry.get("exists") is False:
                    entry = {"sha256": None, "size": None, "blob": None, "exists": False}
                return entry, fact
        return None

    # -- packages ----------------------------------------------------------------------

    def _packages(self) -> None:
        packages = dict(self.today.section("packages"))
        held = self.held.get("packages") or {}
        before = {
            name: info
            for name, info in held.items()
            if info.get("installed") is not None and info["installed"] <= self.when.timestamp()
        }
        if held and not before and packages:
            raise ReconstructError(
                f"no package of {self.today.section('python').get('executable') or 'the target'}"
                f" was installed before {iso(self.when)}; the environment did not exist then"
            )
        later = sorted(n for n in packages if n not in before)
        guesses = self._guesses(later, before) if later else ({}, "", None)
        for name in sorted(packages):
            if name in before:
                stamp = iso(before[name]["installed"])
                self.note(
                    "packages",
                    name,
                    Confidence.HIGH,
                    "installed-before",
                    f"{before[name]['dist_info']} installed {stamp}",
                )
                continue
            version, fact = self._past_version(name, packages[name], held.get(name), guesses)
            self.facts.append(fact)
            if version is None:
                del packages[name]
            else:
                packages[name] = {**packages[name], "version": version}
        self.sections["packages"] = dict(sorted(packages.items()))
        self._torch(packages)

    def _past_version(
        self,
        name: str,
        entry: dict[str, Any],
        info: dict[str, Any] | None,
        guesses: tuple[dict[str, str], str, str | None],
    ) -> tuple[str | None, Fact]:
        """The version of ``name`` (installed after the time) then, and why; None: absent."""
        now_v = entry.get("version")
        installed = f"today's {now_v} was installed {iso(info['installed'])}" if info else ""
        kept = [
            w
            for w in (self.held.get("kept_wheels") or {}).get(name) or []
            if w["time"] <= self.when.timestamp() and w["version"] != now_v
        ]
        if kept:
            w = kept[-1]
            why = f"{w['source']} holds {name} {w['version']} since {iso(w['time'])} "
            why += f"({w['path']}); {installed}"
            return w["version"], Fact("packages", name, Confidence.MEDIUM, "kept-wheel", why)
        if entry.get("editable") or entry.get("direct_url"):
            why = f"{installed}; installed from a local path or URL, which keeps no history"
            return now_v, Fact("packages", name, Confidence.UNKNOWN, "today", why)
        pins, source, failure = guesses
        if failure:
            why = f"{installed}; no older build on this machine; {failure}; today's taken"
            return now_v, Fact("packages", name, Confidence.UNKNOWN, "today", why)
        if name in pins:
            why = f"uv pip compile --exclude-newer {iso(self.when)} of {source}; {installed}"
            return pins[name], Fact("packages", name, Confidence.LOW, "resolved", why)
        why = f"{installed}; not required by {source} resolved as of the time: absent then"
        return None, Fact("packages", name, Confidence.LOW, "absent", why)

    def _guesses(
        self, later: list[str], before: dict[str, Any]
    ) -> tuple[dict[str, str], str, str | None]:
        """(pins, what was resolved, failure) for packages installed after the time."""
        # A local or URL install is on no index: it would only make the resolution fail.
        today = self.today.section("packages")
        local = {n for n, e in today.items() if e.get("editable") or e.get("direct_url")}
        later = [n for n in later if n not in local]
        constraints = [
            f"{n}=={i['version']}"
            for n, i in sorted(before.items())
            if i["version"] and n not in local
        ]
        for repo, past in sorted((self.held.get("repos") or {}).items()):
            for fname, text in sorted((past.get("requirements") or {}).items()):
                source = f"{fname} at {str(past.get('head'))[:12]} of {repo}"
                return self._resolve(fname, text, constraints, source)
        if not later:
            return {}, "", None
        # No requirements: the newest release before the time that the rest accepts.
        text = "".join(f"{n}\n" for n in later)
        source = "the packages installed since, against those installed before"
        return self._resolve("requirements.in", text, constraints, source)

    def _resolve(
        self, fname: str, text: str, constraints: list[str], source: str
    ) -> tuple[dict[str, str], str, str | None]:
        try:
            return self.resolver(fname, text, constraints, self.when), source, None
        except ReconstructError:
            pass
        # Pins of today's builds (local versions, private indexes) can make the constraints
        # unsatisfiable on the configured sources: the requirements alone are still evidence.
        try:
            pins = self.resolver(fname, text, [], self.when)
        except ReconstructError as exc:
            return {}, source, str(exc)
        return pins, source + " (without today's pins)", None

    def _torch(self, packages: dict[str, Any]) -> None:
        torch = self.sections.get("torch")
        if not isinstance(torch, dict) or not torch.get("version"):
            return
        version = (packages.get("torch") or {}).get("version")
        if version != torch.get("version"):
            # The build facts (git_version, cuda) were read from today's torch.
            self.sections["torch"] = {k: None for k in torch} | {"version": version}

    # -- loose files and data ------------------------------------------------------------

    def _loose(self, section: str) -> None:
        out = {}
        loose = self.held.get("loose") or {}
        for path, entry in self.today.section(section).items():
            from_repo = self._repo_file(path) if section == "files" else None
            if from_repo is not None:
                out[path], fact = from_repo
                self.facts.append(fact)
                continue
            held = loose.get(path) or {}
            stamp = held.get("mtime")
            if stamp is not None and stamp <= self.when.timestamp():
                self.note(
                    section, path, Confidence.HIGH, "unchanged", f"last modified {iso(stamp)}"
                )
                out[path] = entry
                continue
            out[path] = self._changed(section, path, entry, held)
        self.sections[section] = dict(sorted(out.items()))

    def _changed(self, section: str, path: str, entry: Any, held: Mapping[str, Any]) -> Any:
        changed = (
            f"modified {iso(held['mtime'])}, after the time" if held.get("mtime") else "missing"
        )
        earlier = self._earlier_snapshot(section, path)
        copy = held.get("copy")
        if section == "data" and copy:
            # The copy is what a run can realize; an earlier snapshot that agrees confirms it.
            why = f"{changed}; data_map copy {copy['path']} last modified {iso(copy['mtime'])}"
            sure = Confidence.MEDIUM if copy["mtime"] <= self.when.timestamp() else Confidence.LOW
            if earlier is not None and earlier[0].get("fingerprint") == copy["facts"].get(
                "fingerprint"
            ):
                why += f", as recorded by {earlier[1]}"
                sure = Confidence.HIGH
            self.note(section, path, sure, "data-map-copy", why)
            return copy["facts"]
        if earlier is not None:
            value, origin = earlier
            why = f"{changed}; as recorded by {origin}"
            self.note(section, path, Confidence.MEDIUM, "earlier-snapshot", why)
            return value
        why = f"{changed}; no earlier snapshot or copy holds it: today's taken"
        self.note(section, path, Confidence.UNKNOWN, "today", why)
        return entry

    def _earlier_snapshots(self) -> list[tuple[str, Manifest]]:
        """(created, manifest) of every snapshot in ``manifests_dir`` taken before the
        time, newest first; read once."""
        if self.earlier is None:
            self.earlier = []
            for candidate in sorted(self.config.manifests_dir.glob("*.yaml")):
                try:
                    old = load_manifest(candidate)
                except ManifestError:
                    continue
                created = str(old.section("meta").get("created") or "")
                if not old.reconstructed and created and created <= iso(self.when):
                    self.earlier.append((created, old))
            self.earlier.sort(key=lambda pair: pair[0], reverse=True)
        return self.earlier

    def _earlier_snapshot(self, section: str, path: str) -> tuple[Any, str] | None:
        """The newest earlier snapshot's entry for ``path`` (for files: with its content
        stored, or recorded as missing), and where it came from."""
        for created, old in self._earlier_snapshots():
            value = old.section(section).get(path)
            if not isinstance(value, dict):
                continue
            if section == "files" and not (value.get("blob") or value.get("exists") is False):
                continue
            name = old.path.name if old.path else old.label
            return value, f"{name} (taken {created})"
        return None

    # -- env and caches ------------------------------------------------------------------

    def _env_and_caches(self) -> None:
        if self.today.section("env"):
            why = "environment variables leave no history: today's taken"
            self.note("env", "*", Confidence.UNKNOWN, "today", why)
        caches = {}
        for name, entry in self.today.section("caches").items():
            cold = {**entry, "files": 0, "bytes": 0, "digest": None, "subdirs": {}}
            if isinstance(entry, dict) and entry.get("exists") is False:
                cold = entry
            caches[name] = cold
            why = "a compile cache's past contents are unknowable: taken as cold"
            self.note("caches", name, Confidence.UNKNOWN, "cold", why)
        if caches:
            self.sections["caches"] = caches


def _git_evidence(past: Mapping[str, Any]) -> tuple[Confidence, str, str]:
    head = str(past["head"])[:12]
    subject = past.get("subject") or ""
    if past.get("method") == "reflog":
        why = (
            f"reflog: HEAD was {head} from {iso(past['reflog_time'])} "
            f"({past.get('reflog_entry')}); commit '{subject}'"
        )
        return Confidence.HIGH, "reflog", why
    why = (
        f"{past.get('reflog')}: last commit before the time on today's HEAD, {head} of "
        f"{iso(past['commit_time'])} '{subject}' (a branch checked out then may differ)"
    )
    return Confidence.MEDIUM, "last-commit-before", why


def reconstructed_block(when: datetime, today: Manifest, facts: list[Fact]) -> dict[str, Any]:
    """The manifest's ``reconstructed:`` block: the time, what it was rebuilt from, and
    ``facts: {section: {key: {confidence, method, evidence}}}``."""
    by_section: dict[str, dict[str, Any]] = {}
    for fact in facts:
        by_section.setdefault(fact.section, {})[fact.key] = fact.as_dict()
    return {
        "as_of": iso(when),
        "from": {
            "label": today.label,
            "created": today.section("meta").get("created"),
        },
        "facts": {k: dict(sorted(v.items())) for k, v in sorted(by_section.items())},
    }


def facts_of(manifest: Manifest) -> dict[tuple[str, str], Fact]:
    """The reconstructed facts a loaded manifest carries, by (section, key)."""
    block = manifest.section("reconstructed")
    out = {}
    for section, entries in (block.get("facts") or {}).items():
        for key, raw in (entries or {}).items():
            try:
                sure = Confidence(raw.get("confidence"))
            except ValueError:
                sure = Confidence.UNKNOWN
            out[(section, key)] = Fact(
                section, key, sure, str(raw.get("method")), str(raw.get("evidence"))
            )
    return out


def summary(rec: Reconstruction) -> list[str]:
    """Human lines: counts per confidence, then each doubtful fact."""
    counts = {c: 0 for c in Confidence}
    for fact in rec.facts:
        counts[fact.confidence] += 1
    line = f"reconstructed as of {iso(rec.as_of)}: " + ", ".join(
        f"{n} {c.value}" for c, n in counts.items() if n
    )
    return [line] + [f"  {fact.describe()}" for fact in rec.doubtful()]
