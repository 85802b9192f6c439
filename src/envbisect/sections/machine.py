"""Facts of the machine and the snapshot itself: ``system``, ``python``, ``gpu`` and
``meta``. They are reported, never bisected: a kernel, driver, GPU model or interpreter is
not re-created by swapping software in a sandbox, and ``meta`` (created time, host, elapsed)
is volatile. Each reason says so in plain words.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from envbisect.model.changes import (
    VOLATILE_KEYS,
    VOLATILE_REASON,
    Change,
    Found,
    differing,
    presence,
    scalar_change,
)
from envbisect.sections import Section, register

_SYSTEM_REASONS = {
    "kernel": "the kernel belongs to the machine; swapping software in a sandbox cannot change it",
    "os": "the operating system release belongs to the machine image; envbisect cannot swap it",
    "libc": "the C library comes with the OS image; envbisect cannot swap it",
    "arch": "another CPU architecture is another machine",
    "cpu_model": "another CPU is hardware, not software",
    "cpu_count": "a different CPU count is hardware (or a container limit), not software",
    "mem_total_bytes": "a different amount of memory is hardware, not software",
}
_GPU_REASONS = {
    "driver": "the NVIDIA driver lives in the host kernel; envbisect cannot swap it per trial",
    "cuda_driver": "the driver's CUDA version comes with the driver; envbisect cannot swap it",
    "devices": "another GPU model or count is hardware; swapping software cannot re-create it",
}
_PYTHON_REASONS = {
    "version": "another Python version needs another interpreter; envbisect builds trial venvs "
    "with one interpreter and does not re-create the other (rebuild the venv by hand)",
    "implementation": "another Python implementation needs another interpreter",
}


class _MachineFacts(Section):
    """Plain values of the machine; ``reasons`` says per key why it is not bisected."""

    reasons: Mapping[str, str] = {}
    default_reason = ""
    fails_whole = True

    def is_volatile(self, key: str) -> bool:
        return key in VOLATILE_KEYS

    def reason_for(self, change: Change) -> str | None:
        return self.reasons.get(change.key, self.default_reason)


@register
class System(_MachineFacts):
    name = "system"
    reasons = _SYSTEM_REASONS
    default_reason = "a fact of the machine; envbisect can only report it"


@register
class Python(_MachineFacts):
    name = "python"
    reasons = _PYTHON_REASONS
    default_reason = (
        "the interpreter itself differs; what differs inside it is listed under packages"
    )


def _devices_desc(devices: Any) -> Any:
    if not isinstance(devices, list):
        return devices
    names: dict[str, int] = {}
    for d in devices:
        if isinstance(d, dict):
            label = str(d.get("name", "?"))
            if d.get("memory_mib"):
                label += f" ({d['memory_mib']} MiB)"
        else:
            label = str(d)
        names[label] = names.get(label, 0) + 1
    return ", ".join(f"{n} × {label}" for label, n in names.items()) or "none"


@register
class Gpu(_MachineFacts):
    name = "gpu"
    reasons = _GPU_REASONS
    default_reason = "a fact of the GPU; envbisect can only report it"

    def compare(
        self, src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
    ) -> Iterator[Found]:
        for key, old, new in differing(g, b):
            if key != "devices":
                yield Found(scalar_change("gpu", key, old, new), key in VOLATILE_KEYS)
                continue
            ov, nv = _devices_desc(old), _devices_desc(new)
            note = None if ov != nv else "device details differ"
            yield Found(Change("gpu", key, ov, nv, presence(old, new), note))


@register
class Meta(Section):
    """The snapshot's own facts (label, created, host, elapsed): volatile, listed last."""

    name = "meta"
    reason = VOLATILE_REASON

    def is_volatile(self, key: str) -> bool:
        return True
