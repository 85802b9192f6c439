"""Is the realized state the state that was asked for? One cheap snapshot says.

Before a trial measures anything, the collector agent runs inside the realized state (its
python, its environment, through the same layer chain) and records only the sections a
check needs (python, packages, torch, files, git, env: about a tenth of a second). That
snapshot is compared with what the state should be: the good manifest with the applied
units' changes from the bad one; everything the run does not bisect stays as the target is
(the bad manifest). Any difference is a finding, shown on the trial as ``state not
faithful: ...``; the trial is then unresolved, never counted good or bad.

What is compared, per (section, key) the manifests recorded:

- ``python`` version and implementation (the target's, whatever is applied);
- every package either manifest lists: present or absent, and its version;
- the files, git heads and env values of the diff's units, at the places the state puts
  them (a file inside a repo that has a worktree this trial is checked in the worktree).

A package or variable that neither manifest recorded is not judged (hand-written manifests
list a few); the trial log's environment diff shows everything else.
"""

from __future__ import annotations

import glob
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from envbisect.agent.redact import is_redacted
from envbisect.agent.redact import redact_env as redact_env_value
from envbisect.model.errors import TransportError
from envbisect.model.files import FileEntry
from envbisect.sections.caches import CACHE_ENV
from envbisect.sections.git import GitEntry
from envbisect.sections.packages import PackageEntry
from envbisect.transport import Transport

AGENT = "envbisect.agent.collector"
SECTIONS = ("python", "packages", "files", "git", "env")


@dataclass(frozen=True)
class StateCheck:
    """The realized state against the expected one: ``differences`` empty means faithful."""

    differences: tuple[str, ...]
    checked: int  # facts compared
    elapsed_s: float
    error: str | None = None  # the check itself could not run (the state is then untested)

    @property
    def faithful(self) -> bool:
        return not self.differences and self.error is None

    def summary(self, limit: int = 3) -> str:
        """``state not faithful: packages ebwork 3.0, expected 1.0; ...``."""
        if self.error is not None:
            return f"state not checked: {self.error}"
        shown = list(self.differences[:limit])
        if len(self.differences) > limit:
            shown.append(f"{len(self.differences) - limit} more in trial.json")
        return "state not faithful: " + "; ".join(shown)

    def as_dict(self) -> dict[str, Any]:
        return {
            "faithful": self.faithful,
            "differences": list(self.differences),
            "checked": self.checked,
            "elapsed_s": round(self.elapsed_s, 3),
            "error": self.error,
        }


def _version(value: Any) -> str | None:
    entry = PackageEntry.of(value)
    return None if entry is None else entry.version


def expected_facts(
    good: Any,
    bad: Any,
    values: Mapping[tuple[str, str], tuple[Any, Any]],
    where: Mapping[str, str],
) -> dict[tuple[str, str], Any]:
    """(section, key as realized) → the expected fact.

    ``values``: the actuator's ``(section, key) → (source manifest, value)`` for the state;
    ``where``: a recorded path → where the state puts it (worktrees), identity otherwise.
    """
    out: dict[tuple[str, str], Any] = {}
    py = bad.section("python")
    for field in ("version", "implementation"):
        if py.get(field) is not None:
            out[("python", field)] = str(py[field])
    names: dict[str, str] = {}
    for m in (good, bad):
        for name in m.section("packages"):
            names.setdefault(canonicalize_name(name), str(name))
    chosen: dict[str, Any] = {
        canonicalize_name(k): v for (s, k), (_src, v) in values.items() if s == "packages"
    }
    bad_pkgs: dict[str, Any] = {canonicalize_name(k): v for k, v in bad.section("packages").items()}
    good_pkgs: dict[str, Any] = {
        canonicalize_name(k): v for k, v in good.section("packages").items()
    }
    for name in sorted(names):
        if name in chosen:
            value = chosen[name]
        elif name in bad_pkgs:
            value = bad_pkgs[name]
        else:
            value = good_pkgs.get(name)
        out[("packages", name)] = _version(value)
    for (section, key), (_src, value) in sorted(values.items()):
        if section == "files":
            entry = FileEntry.of(value)
            out[("files", where.get(key, key))] = None if entry is None else entry.sha256
        elif section == "git":
            out[("git", where.get(key, key))] = GitEntry.of(value).head
        elif section == "env" and key not in CACHE_ENV.values():
            # A cache variable always points into the trial's sandbox (the caches realizer).
            out[("env", key)] = None if value is None else value
    return out


def compare(expected: Mapping[tuple[str, str], Any], sections: Mapping[str, Any]) -> list[str]:
    """The differences between ``expected`` and a collected snapshot's ``sections``."""
    packages = {canonicalize_name(k): v for k, v in (sections.get("packages") or {}).items()}
    got = {**sections, "packages": packages}
    diffs: list[str] = []
    for (section, key), want in expected.items():
        check = _CHECKS.get(section)
        line = check(key, want, got.get(section) or {}) if check is not None else None
        if line:
            diffs.append(line)
    return diffs


def _python_diff(key: str, want: Any, got: Mapping[str, Any]) -> str | None:
    have = got.get(key)
    if have is not None and str(have) != want:
        return f"python {key} {have}, expected {want}"
    return None


def _package_diff(key: str, want: Any, got: Mapping[str, Any]) -> str | None:
    have = _version(got.get(key))
    if have == want:
        return None
    return f"packages {key} {have or 'absent'}, expected {want or 'absent'}" + (
        " (a copy outside the state's venv shadows it?)" if have and want else ""
    )


def _file_diff(key: str, want: Any, got: Mapping[str, Any]) -> str | None:
    entry = FileEntry.of(got.get(key))
    have = entry.sha256 if entry is not None else None
    if have == want:
        return None
    return f"files {key} {_short(have) or 'absent'}, expected {_short(want) or 'absent'}"


def _git_diff(key: str, want: Any, got: Mapping[str, Any]) -> str | None:
    raw = got.get(key) or {}
    have = GitEntry.of(raw).head
    if have == want:
        return None
    why = (
        raw.get("error") if isinstance(raw, Mapping) else None
    )  # the collector's, not a manifest's
    shown = _short(have) or (f"unreadable ({why})" if why else "no commit")
    return f"git {key} at {shown}, expected {_short(want)}"


def _env_diff(key: str, want: Any, got: Mapping[str, Any]) -> str | None:
    have = got.get(key)
    if is_redacted(want):
        # A secret the trial passed through: the environment must hold the value whose hash
        # the manifest recorded.
        if _env_hash(have, str(want["redacted"])) != want["redacted"]:
            return f"env {key} {_env_text(have)}, expected {_env_text(want)}"
        return None
    shown = want if want is None else redact_env_value(key, str(want))
    if have != shown:
        return f"env {key} {_env_text(have)}, expected {_env_text(shown)}"
    return None


_CHECKS = {
    "python": _python_diff,
    "packages": _package_diff,
    "files": _file_diff,
    "git": _git_diff,
    "env": _env_diff,
}


def _env_hash(value: Any, like: str) -> str | None:
    """The sha256 prefix (as long as ``like``) of an env value as the collector reported it."""
    if is_redacted(value):
        return str(value["redacted"])[: len(like)]
    if isinstance(value, str):
        return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[: len(like)]
    return None


def _short(sha: Any) -> str | None:
    return None if sha is None else str(sha)[:12]


def _env_text(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, dict):
        return f"<redacted {value.get('redacted')}>"
    return repr(value)


def check_state(
    *,
    transport: Transport,
    python: str,
    env: Mapping[str, str] | None,
    expected: Mapping[tuple[str, str], Any],
    log_dir: Path,
    timeout_s: float = 60,
) -> StateCheck:
    """Snapshot the realized state through ``transport`` and compare it with ``expected``.

    ``env``: the state's environment for a local run (None when ``transport`` already
    carries it as ``env`` layers).
    """
    started = time.monotonic()
    params: dict[str, Any] = {
        "only": list(SECTIONS) + ["torch"],
        "repos": sorted(k for s, k in expected if s == "git"),
        "files": sorted(glob.escape(k) for s, k in expected if s == "files"),
        "env": sorted(k for s, k in expected if s == "env"),
        "data": [],
        "caches": {},
        "probes": [],
        "keep_blobs": None,
        "cmd_timeout_s": 10.0,
    }
    try:
        out = transport.run_agent(
            python,
            AGENT,
            params,
            timeout_s=timeout_s,
            log_dir=log_dir,
            env=dict(env) if env is not None else None,
            name="state-check",
        )
    except TransportError as exc:
        return StateCheck((), 0, time.monotonic() - started, error=str(exc))
    sections = out.get("sections") or {}
    diffs = compare(expected, sections)
    return StateCheck(tuple(diffs), len(expected), time.monotonic() - started)
