"""``env``: environment variables, ``{NAME: value | {redacted: <sha256 prefix>}}``.

A redacted value (a secret) compares by its hash only: a plain value on one side is hashed
and compared to the other side's prefix. A plain value that a snapshot would redact today
(an older or hand-written manifest) is shown redacted too, by the same rules
(``envbisect.agent.redact``). An env unit is bisectable unless the good value is redacted
(it cannot be set again). Realized in the per-trial environment (its realizer, below).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from envbisect.agent.redact import is_redacted, redact_env
from envbisect.model.changes import Change, ChangeKind, Found, Unit, keys
from envbisect.model.plan import Context, FactQuery, Plan, Sandbox, Values
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


# ---- realizing-------------------------------------------------------------------------


class EnvRealizer:
    """Each env unit's variable set to the state's value, or unset; a redacted value is
    passed through from the environment envbisect runs in."""

    section = "env"

    def facts(self, ctx: Context, key: str, old: Any, new: Any, query: FactQuery) -> None:
        return None

    def blocker(self, ctx: Context, key: str, old: Any, new: Any) -> str | None:
        for side, value in (("good", old), ("bad", new)):
            if not is_redacted(value) or (side == "bad" and ctx.env_holds(key, value)):
                continue
            why = (
                "so it cannot be set"
                if side == "good"
                else f"and {key} {ctx.here} is not that value, so it cannot be set"
            )
            return (
                f"env {key}: the {side} value is a secret, redacted in the manifest, {why}; "
                f"every trial passes {key} through from your environment unchanged"
            )
        return None

    def plan(self, ctx: Context, sandbox: Sandbox, values: Values, plan: Plan) -> Plan:
        unset = tuple(key for key, (_s, value) in values.items() if value is None)
        set_ = {key: value for key, (_s, value) in values.items() if isinstance(value, str)}
        # Anything else is redacted, and (see blocker) the environment already holds it.
        return plan.with_env(set_, unset)


@register
class Env(Section):
    name = "env"
    bisectable = True
    realizer = EnvRealizer()

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
