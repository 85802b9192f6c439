"""The torch stack: the ``torch`` section (``{version, git_version, cuda, hip, cudnn, nccl,
triton}``, read from ``torch/version.py`` without importing torch) and the wheels that pin
each other — torch, triton, pytorch-triton, torchvision, torchaudio, every ``nvidia-*`` and
``cuda-*`` wheel. All of their changes form one unit, ``torch-stack``: moving torch without
its CUDA wheels is not a state anybody runs. Realized as packages (an overlay venv).
"""

from __future__ import annotations

from envbisect.changes import VOLATILE_KEYS, Change, Found, Unit
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
    rank = 0
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
