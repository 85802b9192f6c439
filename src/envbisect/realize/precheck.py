"""Before the first trial of ``run``: is every package version the run will install
available from the configured sources?

A run that finds out mid-search that a version is on no index (the issue's
``cuda-bindings``) has spent trials for nothing; this check lists every such version in one
message and stops with exit 2 before anything is measured. The versions are those of the
changed packages in either endpoint's state (the units the run may bisect); a version the
target already has installed needs no source (the overlay links it), and a local direct URL
or editable install is checked on disk. Others (the release search) add their own ``Need``s.
On a remote target the sources are the target's (its paths, network and uv cache): its own
uv resolves each version (``uv pip compile --no-deps``), all in one agent call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from packaging.utils import canonicalize_name

from envbisect.model.manifest import Manifest
from envbisect.model.needs import Need, SourcesMissing, missing_message, missing_needs, same_version
from envbisect.model.sources import Sources, uv_args
from envbisect.sections.packages import PackageEntry

# A remote target's own uv, asked once for a batch: [[requirement, uv options], ...] →
# [[requirement, uv's last line], ...] for those it cannot resolve (agent op "available").
AskTarget = Callable[[list[list[Any]]], list[list[str]]]


def package_needs(
    good: Manifest, bad: Manifest, units: Iterable[Any], skip: Iterable[str] = ()
) -> list[Need]:
    """The package versions the states of ``units`` can ask for: the good and the bad entry
    of every changed package (``skip``: unit ids the run will not bisect)."""
    skipped = set(skip)
    out: dict[str, Need] = {}
    for unit in units:
        if not unit.bisectable or unit.id in skipped:
            continue
        for change in unit.changes:
            if change.section != "packages":
                continue
            for side, manifest in (("good", good), ("bad", bad)):
                entry = PackageEntry.of(manifest.section("packages").get(change.key))
                if entry is None or (entry.version is None and entry.direct_url is None):
                    continue  # absent in that state: a removal needs no source
                name = canonicalize_name(str(change.key))
                need = Need(name, entry.version, entry.requirement(name), side)
                out.setdefault(need.requirement, need)
    return list(out.values())


def check_sources(
    needs: Sequence[Need],
    sources: Sources,
    *,
    installed: dict[str, str],
    python: str | None,
    uv: str | None,
    config_path: Any = None,
) -> None:
    """SourcesMissing (exit 2) naming every missing version, else nothing."""
    if not needs:
        return
    missing = missing_needs(needs, sources, installed=installed, uv=uv, python=python)
    if missing:
        raise SourcesMissing(missing_message(missing, config_path))


def check_sources_on_target(
    needs: Sequence[Need],
    sources: Sources,
    *,
    installed: dict[str, str],
    ask: AskTarget,
    config_path: Any = None,
) -> None:
    """The same check for a remote target: its sources' paths, network and uv cache are its
    own, so its uv resolves each version (one agent call for all of them)."""
    todo = [
        n
        for n in needs
        if not (n.version is not None and same_version(installed.get(n.name), n.version))
    ]
    if not todo:
        return
    by_requirement = {n.requirement: n for n in todo}
    answer = ask([[n.requirement, uv_args(sources, n.name)] for n in todo])
    missing = [
        (by_requirement[req], f"{sources.describe(by_requirement[req].name)}, by uv on the target")
        for req, _why in answer
        if req in by_requirement
    ]
    if missing:
        raise SourcesMissing(missing_message(missing, config_path))
