"""The bisection engine (pure: ``search``, ``verdict``) and its I/O parts (actuate, session).

Imported as ``envbisect.search``; it does not shadow the stdlib ``bisect`` (src layout).
"""

from __future__ import annotations

from envbisect.search.engine import (
    BatchTestFn,
    Event,
    EventKind,
    Evidence,
    Isolation,
    Narrowed,
    Outcome,
    SearchOutcome,
    SearchResult,
    SearchSettings,
    State,
    TestFn,
    Trial,
    search,
)
from envbisect.search.verdict import Judge, Noise, Verdict

__all__ = [
    "BatchTestFn",
    "Event",
    "EventKind",
    "Evidence",
    "Isolation",
    "Judge",
    "Narrowed",
    "Noise",
    "Outcome",
    "SearchOutcome",
    "SearchResult",
    "SearchSettings",
    "State",
    "TestFn",
    "Trial",
    "Verdict",
    "search",
]
