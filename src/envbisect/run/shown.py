"""How a compared value reads: hashes shortened, secrets never shown.

Shared by the diff's rendering (``envbisect.render.diff``) and a run's culprits
(``envbisect.run.result``): below both, so that ``run`` never imports ``render``.
"""

from __future__ import annotations

import re
from typing import Any

from envbisect.model.escape import printable

_HEX = re.compile(r"^[0-9a-f]{40,64}$")


def show_value(value: Any) -> str:
    """A compared value as a person reads it: hashes shortened, secrets never shown."""
    if value is None:
        return "-"
    if isinstance(value, dict) and "redacted" in value:
        return "<redacted>"
    text = printable(value)
    if _HEX.match(text):
        return text[:12]
    return text
