"""``data``: datasets by path, ``{size, records, fingerprint}``. A change is a different
size, record count or content fingerprint. A data unit is realizable only where
envbisect.yaml's ``data_map`` says where the other version lives (``run`` checks it; diff
only notes it). Realized by rewriting argv paths and ``ENVBISECT_DATA_<n>``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envbisect.model.changes import (
    METADATA_NOTE,
    Change,
    EntryPair,
    Found,
    Unit,
    human_bytes,
    read_fields,
    strip_volatile,
)
from envbisect.model.plan import Context, FactQuery, Plan, Sandbox, Swap, Values
from envbisect.sections import DiffContext, KeyedSection, register


@dataclass(frozen=True)
class DataEntry:
    """One dataset as a manifest records it."""

    size: Any = None
    records: Any = None
    fingerprint: Any = None

    def describe(self) -> str:
        """``1,000 records, 2.0 MB`` (or the size alone)."""
        size = human_bytes(self.size)
        if isinstance(self.records, int):
            return f"{self.records:,} records, {size}"
        return size


# ---- realizing-------------------------------------------------------------------------


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
        """Argv paths rewritten to the state's version, and the version put where a program
        that builds its own data path finds it: its place in the state's worktree links to
        it; outside any worktree, the old version is swapped in (journaled) on a local
        target."""
        data_keys = sorted(str(k) for k in (ctx.bad.section("data") or {}))
        path_map: list[tuple[str, str]] = []
        env: dict[str, str] = {}
        links: list[tuple[str, str, str]] = []
        swaps: list[Swap] = []
        for key, (source, _value) in values.items():
            use = key
            if source is ctx.good and key in ctx.data_map:
                use = ctx.data_map[key]
            # Always mapped, to itself where the live file is the state's: a dataset inside a
            # bisected repo must not become the worktree's committed copy (the longest prefix
            # wins over the repo's), which every state would then read alike.
            path_map.append((key, use))
            if key in data_keys:
                env[f"ENVBISECT_DATA_{data_keys.index(key)}"] = use
            image = _in_worktree(key, plan.worktrees)
            if image is not None:
                links.append((image[0], use, image[1]))
            elif use != key and sandbox.local and os.path.isfile(use):
                swaps.append(Swap(key, _sha256(use), key, Path(use)))
        return replace(
            plan,
            path_map=plan.path_map + tuple(path_map),
            links=plan.links + tuple(links),
            swaps=plan.swaps + tuple(swaps),
        ).with_env(env)


def _in_worktree(key: str, worktrees: tuple[tuple[str, str, str], ...]) -> tuple[str, str] | None:
    """Where ``key`` (a path inside a repo the state puts in a worktree) is in that
    worktree, and the worktree."""
    for repo, _head, path in worktrees:
        prefix = repo.rstrip("/") + "/"
        if key.startswith(prefix):
            return path.rstrip("/") + "/" + key[len(prefix) :], path
    return None


_SHA: dict[tuple[str, int, int], str] = {}


def _sha256(path: str) -> str:
    """The content hash of ``path`` (kept per size and mtime: a dataset is hashed once)."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _SHA:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _SHA[key] = h.hexdigest()
    return _SHA[key]


@register
class Data(KeyedSection):
    name = "data"
    bisectable = True
    realizer = DataRealizer()
    reason = (
        "bisectable only where envbisect.yaml's data_map says where the old dataset lives; "
        "run decides"
    )

    def describe(self, raw: dict[str, Any]) -> str:
        return read_fields(DataEntry, raw).describe()

    def judge_both(self, pair: EntryPair, old: dict[str, Any], new: dict[str, Any]) -> Found:
        if strip_volatile(old) == strip_volatile(new):
            return Found(pair.change(self.name, METADATA_NOTE), volatile=True)
        if pair.shown_old == pair.shown_new:
            note = "same size and records, different content (fingerprint)"
            return Found(pair.change(self.name, note))
        return Found(pair.change(self.name))

    def regroup(self, units: list[Unit], ctx: DiffContext) -> list[Unit]:
        """A data unit whose old version data_map names: say where, not "only where ..."."""
        return [self._mapped(u, ctx.data_map) for u in units] if ctx.data_map else units

    def _mapped(self, unit: Unit, data_map: Mapping[str, str]) -> Unit:
        change: Change = unit.changes[0]
        if unit.section != self.name or change.key not in data_map:
            return unit
        where = data_map[change.key]
        return replace(unit, reason=f"the other version is at {where} (data_map); run checks it")
