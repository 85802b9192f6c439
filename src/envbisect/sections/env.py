"""``env``: environment variables, ``{NAME: value | {redacted: <sha256 prefix>}}``.

A redacted value (a secret) compares by its hash only: a plain value on one side is hashed
and compared to the other side's prefix. A plain value that a snapshot would redact today
(an older or hand-written manifest) is shown redacted too, by the same rules
(``envbisect.agent.redact``). An env unit is bisectable unless the good value is redacted
(it cannot be set again). Realized in the per-trial environment (``bisect.realizers``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from envbisect.agent.redact import is_redacted, redact_env
from envbisect.changes import Change, ChangeKind, Found, Unit, keys
from envbisect.sections import Section, register

REDACTED_GOOD_REASON = "the good value is redacted in the manifest, so it cannot be set again"


def _shown(name: str, value: Any) -> Any:
    return redact_env(name, value) if isinstance(value, str) else value


def env_equal(old: Any, new: Any) -> bool:
    """Equal values, or a plain value whose hash has the other side's redacted prefix."""
    if old == new:
        return True
    for red, plain in ((old, new), (new, old)):
        if is_redacted(red) and isinstance(plain, str):
            prefix = str(red["redacted"])
            return hashlib.sha256(plain.encode()).hexdigest()[: len(prefix)] == prefix
    return False


@register
class Env(Section):
    name = "env"
    rank = 4
    bisectable = True

    def compare(
        self, src: tuple[str, str], g: Mapping[str, Any], b: Mapping[str, Any]
    ) -> Iterator[Found]:
        for name in keys(g, b):
            old, new = g.get(name), b.get(name)
            if name in g and name in b and env_equal(old, new):
                continue
            kind = (
                ChangeKind.ADDED
                if name not in g
                else ChangeKind.REMOVED
                if name not in b
                else ChangeKind.CHANGED
            )
            old, new = _shown(name, old), _shown(name, new)
            note = "redacted: compared by hash" if is_redacted(old) or is_redacted(new) else None
            yield Found(Change(self.name, name, old, new, kind, note))

    def unit(self, change: Change) -> Unit:
        unit = super().unit(change)
        if change.kind is not ChangeKind.ADDED and is_redacted(change.old):
            return replace(unit, bisectable=False, reason=REDACTED_GOOD_REASON)
        return unit
