"""The bisection engine (pure: ``search``, ``verdict``; its phases in ``engine``'s sibling
modules, its words in ``wording``) and the narrowing steps below a culprit (hunks, packages).

Imported as ``envbisect.search``; it does not shadow the stdlib ``bisect`` (src layout).
"""

from __future__ import annotations

from envbisect.search.engine import search
from envbisect.search.result import (
    Event,
    EventKind,
    Evidence,
    Isolation,
    Narrowed,
    SearchOutcome,
    SearchResult,
    Trial,
)
from envbisect.search.state import (
    BatchTestFn,
    OnFailure,
    Outcome,
    Purpose,
    RateTestFn,
    SearchSettings,
    State,
    TestFn,
)
from envbisect.search.verdict import Judge, Noise, Verdict
from envbisect.search.wording import Reason, Say

__all__ = [
    "BatchTestFn",
    "Event",
    "EventKind",
    "Evidence",
    "Isolation",
    "Judge",
    "Narrowed",
    "Noise",
    "OnFailure",
    "Outcome",
    "Purpose",
    "RateTestFn",
    "Reason",
    "Say",
    "SearchOutcome",
    "SearchResult",
    "SearchSettings",
    "State",
    "TestFn",
    "Trial",
    "Verdict",
    "search",
]
