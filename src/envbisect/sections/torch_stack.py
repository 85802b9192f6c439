"""The torch stack: the ``torch`` section (``{version, git_version, cuda, hip, cudnn, nccl,
triton}``, read from ``torch/version.py`` without importing torch) and the wheels that pin
each other — torch, triton, pytorch-triton, torchvision, torchaudio, every ``nvidia-*`` and
``cuda-*`` wheel. All of their changes form one unit, ``torch-stack``: moving torch without
its CUDA wheels is not a state anybody runs. Realized as packages (an overlay venv).

A guilty stack is split into its *components* (``components``): torch itself, triton, the
CUDA runtime wheels, and each other wheel on its own. Torch pins its companions in its
``Requires-Dist``; a state that mixes components of two torch versions can leave one outside
those pins (``outside_pins``), which the run says next to its result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbisect.model.changes import VOLATILE_KEYS, Change, Found, Unit
from envbisect.sections import Section, register

_TORCH_STACK_NAMES = frozenset(
    {"torch", "triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"}
    | {"torchvision", "torchaudio"}
)
_STACK_HEADLINE = ("torch", "triton", "pytorch-triton", "torchvision", "torchaudio")


def is_torch_stack(package: str) -> bool:
    """Whether a (normalised) package name moves with torch."""
    return (
        package in _TORCH_STACK_NAMES
        or package.startswith("nvidia-")
        or package.startswith("cuda-")
    )


def in_stack(change: Change) -> bool:
    """Whether ``change`` belongs to the torch stack unit."""
    return change.section == "torch" or (
        change.section == "packages" and is_torch_stack(change.key)
    )


TORCH = "torch itself"
TRITON = "triton"
CUDA = "the CUDA runtime wheels"


def component_of(package: str) -> str:
    """The component of the stack a (normalised) wheel belongs to: torch itself, triton
    (``triton``, ``pytorch-triton*``), the CUDA runtime wheels (``nvidia-*``, ``cuda-*``), or
    the wheel's own name (torchvision, torchaudio, anything else torch pins)."""
    if package == "torch":
        return TORCH
    if package == "triton" or package.startswith("pytorch-triton"):
        return TRITON
    if package.startswith(("nvidia-", "cuda-")):
        return CUDA
    return package


@dataclass(frozen=True)
class Component:
    """One part of a torch stack unit, realized on its own: its package changes (keys of
    the ``packages`` section, in the unit's order)."""

    name: str
    changes: tuple[Change, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(str(c.key) for c in self.changes)

    def describe(self) -> str:
        """``torch itself (2.13.0+cpu → 2.14.1)``, ``the CUDA runtime wheels (18 changed:
        nvidia-cublas-cu12 12.8 → 12.9, …)``; a missing side is ``absent``."""
        shown = [f"{c.key} {c.old or 'absent'} → {c.new or 'absent'}" for c in self.changes]
        if self.name != CUDA and len(self.changes) == 1:
            c = self.changes[0]
            return f"{self.name} ({c.old or 'absent'} → {c.new or 'absent'})"
        head = ", ".join(shown[:3]) + (f", … {len(shown) - 3} more" if len(shown) > 3 else "")
        return f"{self.name} ({len(shown)} changed: {head})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "component": self.name,
            "changes": [{"key": c.key, "old": c.old, "new": c.new} for c in self.changes],
        }


def components(unit: Unit) -> tuple[Component, ...]:
    """The stack unit's package changes grouped into components, torch itself first, then
    triton, the CUDA wheels and the rest by name. torch's build facts follow the torch
    wheel and are no component of their own."""
    groups: dict[str, list[Change]] = {}
    for c in unit.changes:
        if c.section == "packages":
            groups.setdefault(component_of(canonicalize_name(str(c.key))), []).append(c)
    first = (TORCH, TRITON, CUDA)
    order = [n for n in first if n in groups] + sorted(n for n in groups if n not in first)
    return tuple(Component(n, tuple(groups[n])) for n in order)


def pins(requires: Iterable[str]) -> dict[str, Requirement]:
    """torch's ``Requires-Dist`` lines → normalised name → the requirement that applies on
    this machine (markers evaluated; requirements of extras left out)."""
    out: dict[str, Requirement] = {}
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        marker = req.marker
        if marker is not None and ("extra" in str(marker) or not marker.evaluate()):
            continue
        out[canonicalize_name(req.name)] = req
    return out


def outside_pins(
    torch: str, requires: Iterable[str], versions: Mapping[str, str | None]
) -> list[str]:
    """What in a state lies outside the pins of its torch (``torch`` the version, ``requires``
    its Requires-Dist): one sentence per wheel, e.g. ``triton 3.6.0 with torch 2.14.1 is
    outside torch's pin (==3.7.0): result may not be meaningful``. ``versions``: the
    state's version of every stack wheel torch may pin (None: absent)."""
    out = []
    wanted = pins(requires)
    for name, version in sorted(versions.items()):
        req = wanted.get(canonicalize_name(name))
        if req is None or not str(req.specifier):
            continue
        spec = str(req.specifier)
        if version is None:
            out.append(
                f"{name} is absent with torch {torch}, which pins it ({spec}): result may "
                "not be meaningful"
            )
            continue
        try:
            inside = req.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            continue
        if not inside:
            out.append(
                f"{name} {version} with torch {torch} is outside torch's pin ({spec}): "
                "result may not be meaningful"
            )
    return out


def _title(changes: tuple[Change, ...]) -> str:
    for section, key in (("packages", "torch"), ("torch", "version")):
        for c in changes:
            if c.section == section and c.key == key:
                return f"torch stack (torch {c.old or '-'} → {c.new or '-'})"
    return "torch stack"


def _stack_rank(change: Change) -> tuple[int, str]:
    """Headline wheels first, then torch's build facts, then the CUDA wheels by name."""
    if change.section == "packages" and change.key in _STACK_HEADLINE:
        return (0, f"{_STACK_HEADLINE.index(change.key):02d}")
    if change.section == "torch":
        return (1, "")  # stable sort keeps the manifest's fact order
    return (2, change.key)


@register
class TorchStack(Section):
    name = "torch"
    unit_section = "torch-stack"
    bisectable = True
    fails_whole = True
    derived = True  # torch's build facts follow from the torch wheel (packages realizes it)

    def is_volatile(self, key: str) -> bool:
        return key in VOLATILE_KEYS

    def claim(self, found: list[Found]) -> tuple[list[Unit], list[Found]]:
        stack = tuple(sorted((f.change for f in found if in_stack(f.change)), key=_stack_rank))
        if not stack:
            return [], found
        rest = [f for f in found if not in_stack(f.change)]
        return [Unit("torch-stack", "torch-stack", _title(stack), stack, True)], rest
