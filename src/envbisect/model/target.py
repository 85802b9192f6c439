"""What the target python has installed, as the agent's ``probe`` operation reports it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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
    no_bytecode: tuple[str, ...] = ()  # packages installed without .pyc files

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
            no_bytecode=tuple(data.get("no_bytecode") or ()),
        )
