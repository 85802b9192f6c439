"""``packages``: every installed distribution, ``{name: {version, installer, editable,
direct_url}}``. A change is a version change (compared with ``packaging.version``; a changed
local label such as ``+cu128`` → ``+cu130`` is named in the note) or, at one version, a
changed install (editable, direct URL). Each package is a unit of its own, except the torch
stack's wheels (``torch_stack``). Realized by an overlay venv (its realizer, below).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from packaging.utils import canonicalize_name

from envbisect.model.changes import (
    VOLATILE_KEYS,
    ChangeKind,
    EntryPair,
    Found,
    compare_versions,
)
from envbisect.model.failure import Failure
from envbisect.model.plan import Context, FactQuery, Plan, Sandbox, Values, VenvSpec
from envbisect.model.target import TargetEnv
from envbisect.sections import KeyedSection, register


@dataclass(frozen=True)
class PackageEntry:
    """A ``packages:`` entry: a version, or a mapping with the version and how it came."""

    version: str | None = None
    editable: bool = False
    direct_url: Any = None  # PEP 610 ``direct_url.json`` as recorded (a mapping or a URL)

    @classmethod
    def of(cls, value: Any) -> PackageEntry | None:
        """The entry of ``value`` (None: the package is absent in that state)."""
        if value is None:
            return None
        if not isinstance(value, Mapping):
            return cls(version=str(value))
        version = value.get("version")
        return cls(
            version=None if version is None else str(version),
            editable=bool(value.get("editable")),
            direct_url=value.get("direct_url"),
        )

    def requirement(self, name: str) -> str:
        """What ``uv pip install`` gets for this entry: a pinned version or a direct URL."""
        direct = self.direct_url
        if isinstance(direct, Mapping) and direct.get("url"):
            vcs = direct.get("vcs_info") or {}
            if vcs.get("vcs") and vcs.get("commit_id"):
                return f"{name} @ {vcs['vcs']}+{direct['url']}@{vcs['commit_id']}"
            return f"{name} @ {direct['url']}"
        if isinstance(direct, str) and direct:
            return f"{name} @ {direct}"
        return f"{name}=={self.version}"


def _field_note(field_name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    if field_name == "editable":
        return "editable install" if new.get(field_name) else "no longer editable"
    return f"{field_name} {old.get(field_name)!r} → {new.get(field_name)!r}"


# ---- realizing-------------------------------------------------------------------------


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
        if not installs and not hides and not target.no_bytecode:
            # The target itself fits. (Without bytecode it gets an empty overlay: its
            # farm carries the bytecode the target lacks, see add_bytecode.)
            return None, None
        for hidden in sorted(hides):
            if target.dists[hidden].get("files") is None:
                return None, Failure.build(
                    f"cannot replace or remove {hidden} in {target.python}: "
                    "its installed files are not listed (no RECORD)"
                )
        spec = {
            "python": target.python,
            "install": installs,
            "hide": sorted(hides),
            "sources": ctx.sources.as_dict(),
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


@register
class Packages(KeyedSection):
    name = "packages"
    word = "package"
    bisectable = True
    fails_whole = True
    realizer = PackagesRealizer()

    def read(self, source: str, key: str, value: Any) -> dict[str, Any] | None:
        if isinstance(value, str):  # tolerate a bare version string
            return {"version": value}
        return super().read(source, key, value)

    def shown(self, raw: dict[str, Any]) -> Any:
        return raw.get("version")  # hot: every package of a 20,000-entry manifest

    def judge_both(self, pair: EntryPair, old: dict[str, Any], new: dict[str, Any]) -> Found:
        if pair.shown_old != pair.shown_new:
            kind, note = compare_versions(pair.shown_old, pair.shown_new)
            return Found(pair.change(self.name, note, kind))
        fields = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        real = [f for f in fields if f != "installer" and f not in VOLATILE_KEYS]
        if real:
            note = "; ".join(_field_note(f, old, new) for f in real)
            return Found(pair.change(self.name, note, ChangeKind.CHANGED))
        note = f"only {', '.join(fields)} differs"
        return Found(pair.change(self.name, note, ChangeKind.CHANGED), volatile=True)
