"""The time of an ``--as-of``: read from the user's words, written as UTC."""

from __future__ import annotations

from datetime import datetime, timezone

from envbisect.model.errors import ReconstructError
from envbisect.model.escape import excerpt


def parse_as_of(text: str, now: datetime | None = None) -> datetime:
    """``text`` as an aware time: ISO 8601 (``2026-11-20``, ``2026-11-20 09:00``,
    ``2026-11-20T09:00Z``); without a zone it is the local time of this host."""
    now = now or datetime.now(timezone.utc)
    raw = text.strip()
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ReconstructError(
            f"--as-of {excerpt(repr(text))}: not a date; write it like '2026-11-20 09:00' "
            "(local time) or '2026-11-20T09:00Z'"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()
    if when > now:
        raise ReconstructError(
            f"--as-of {excerpt(repr(text))}: {iso(when)} is in the future (now {iso(now)})"
        )
    return when


def iso(when: datetime | float) -> str:
    """UTC, to the second, ``Z``-suffixed."""
    if not isinstance(when, datetime):
        when = datetime.fromtimestamp(when, timezone.utc)
    return when.astimezone(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
