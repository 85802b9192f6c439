"""The checks a run passes before its first trial: what it may touch (``scope``) and
whose manifest it realizes (``trust``). Nothing here prints; notes are returned."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from envbisect.model import scope, trust
from envbisect.model.errors import ManifestError
from envbisect.model.escape import printable
from envbisect.model.manifest import Manifest
from envbisect.model.sources import Sources


def realized_changes(diff: Any) -> list[Any]:
    """The changes of the units a run may realize (bisectable ones)."""
    return [c for u in diff.units if u.bisectable for c in u.changes]


def run_scope(config: Any, manifests: Iterable[Manifest]) -> scope.Scope:
    """The config's paths, widened by the recorded scope of this user's own manifests."""
    out = scope.Scope.of_config(config)
    for manifest in manifests:
        if trust.is_own(manifest):
            out = out.union(scope.Scope.recorded(manifest))
    return out


def indexes(config: Any) -> tuple[str, ...]:
    """The package sources the config names (indexes, find-links, pins' indexes)."""
    if config is None:
        return ()
    src = Sources.from_config(config)
    pinned = tuple(p.index for p in src.pins.values() if p.index)
    return tuple(
        dict.fromkeys(
            str(u)
            for u in (getattr(config, "index_url", None), *src.indexes, src.default_index)
            + src.find_links
            + pinned
            if u
        )
    )


def settable_env(good: Manifest, bad: Manifest, changes: Iterable[Any]) -> None:
    """ManifestError naming the first env change no process environment can hold: an
    empty name, or one with ``=`` or NUL (the OS splits the entry at the first ``=``)."""
    for change in changes:
        key = str(change.key)
        if change.section == "env" and (not key or "=" in key or "\0" in key):
            where = bad if key in bad.section("env") else good
            raise ManifestError(
                f"{where.path or where.label}: env {printable(key)!s}: a name with '=' or NUL "
                "cannot be set in a process's environment; fix or remove that entry"
            )


def check_run(
    config: Any,
    good: Manifest,
    bad: Manifest,
    diff: Any,
    *,
    trusted: Sequence[Path] = (),
    local: bool = True,
) -> list[str]:
    """ScopeError / TrustError before the first trial, else the notes to show (entries
    that ``--trust`` let through)."""
    changes = realized_changes(diff)
    settable_env(good, bad, changes)
    sc = run_scope(config, (good, bad))
    scope.check(sc, good, bad, changes, local=local, config_path=getattr(config, "path", None))
    risks = trust.review(good, bad, changes, indexes(config))
    accepted = trust.refuse_untrusted(risks, trusted)
    return [f"trusted with --trust ({r.manifest}): {r.text()}" for r in accepted]
