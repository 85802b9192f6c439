"""The bisection engine (pure: ``search``, ``verdict``) and its I/O parts (actuate, session).

Imported as ``envbisect.bisect``; it does not shadow the stdlib ``bisect`` (src layout).
"""

from __future__ import annotations

from envbisect.bisect.search import (
    BatchTestFn,
    Culprit,
    Event,
    EventKind,
    Evidence,
    Narrowed,
    Outcome,
    SearchOutcome,
    SearchResult,
    State,
    TestFn,
    Trial,
    search,
)
from envbisect.bisect.verdict import Judge, Noise, Verdict

__all__ = [
    "BatchTestFn",
    "Culprit",
    "Event",
    "EventKind",
    "Evidence",
    "Judge",
    "Narrowed",
    "Noise",
    "Outcome",
    "SearchOutcome",
    "SearchResult",
    "State",
    "TestFn",
    "Trial",
    "Verdict",
    "search",
]
