"""Caveats about a run as a whole (``Actuator.notes``, printed once at the start), and how
a redacted env value is matched against the environment trials start from."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from envbisect.agent.redact import is_redacted
from envbisect.model.manifest import Manifest
from envbisect.sections.git import GitEntry


def run_notes(
    good: Manifest, bad: Manifest, units: Sequence[Any], blocked: frozenset[str]
) -> list[str]:
    """The run's caveats: secrets passed through unchanged, then what each repo's
    uncommitted changes mean (``blocked``: the units the actuator cannot realize)."""
    out: list[str] = [
        f"env {key} is a secret (redacted in the manifest): every trial passes it "
        "through from your environment unchanged"
        for key in passed_through(good, bad, units, blocked)
    ]
    for unit in units:
        for change in unit.changes:
            if change.section == "git":
                out += dirty_notes(good, bad, str(change.key))
    return out


def dirty_notes(good: Manifest, bad: Manifest, key: str) -> list[str]:
    """What a repo's uncommitted changes in either state mean for the run."""
    out = []
    repo = key.rstrip("/") + "/"
    for side, m in (("good", good), ("bad", bad)):
        if not GitEntry.of(m.section("git").get(key)).dirty:
            continue
        tracked = sorted(f for f in m.section("files") if str(f).startswith(repo))
        if tracked:
            out.append(
                f"git {key} had uncommitted changes in the {side} state; "
                f"only the {len(tracked)} file(s) under files: in that repo are "
                "reproduced from the manifest, any other uncommitted edit is not"
            )
        else:
            out.append(
                f"git {key} had uncommitted changes in the {side} state; "
                "they are not reproduced unless their files are listed under files:"
            )
    return out


def passed_through(
    good: Manifest, bad: Manifest, units: Sequence[Any], blocked: frozenset[str]
) -> list[str]:
    """Env vars with a redacted side that no trial sets (their unit is not realized)."""
    out = []
    for unit in units:
        if unit.bisectable is not False and unit.id not in blocked:
            continue
        for change in unit.changes:
            if change.section == "env" and (
                is_redacted(good.section("env").get(str(change.key)))
                or is_redacted(bad.section("env").get(str(change.key)))
            ):
                out.append(str(change.key))
    return sorted(out)


def env_holds(env: Mapping[str, str], key: str, value: Mapping[str, Any]) -> bool:
    """True when ``env`` holds the redacted ``value`` of variable ``key`` (its hash starts
    with the recorded prefix)."""
    current = env.get(key)
    prefix = str(value.get("redacted") or "")
    if current is None or not prefix:
        return False
    digest = hashlib.sha256(current.encode("utf-8", "surrogateescape")).hexdigest()
    return digest.startswith(prefix)
