"""The engine's phases wired by hand over one sample cache, for their direct tests
(``tests/test_search_<phase>.py``); ``search()`` wires them the same way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envbisect.search.budget import Budget
from envbisect.search.crashes import CrashWatch
from envbisect.search.result import Event
from envbisect.search.samples import SampleCache
from envbisect.search.scheduler import ParallelScheduler, Scheduler
from envbisect.search.state import OnFailure, Outcome, SearchSettings, State, TestFn, Units
from envbisect.search.threshold import Threshold


@dataclass
class Wired:
    units: Units
    budget: Budget
    cache: SampleCache
    threshold: Threshold
    crashes: CrashWatch
    scheduler: Scheduler
    events: list[Event] = field(default_factory=list)

    def messages(self) -> list[str]:
        return [e.message for e in self.events]


def wire(
    units: Sequence[str],
    test: TestFn,
    *,
    replay: Mapping[State, Outcome] | None = None,
    **options: Any,
) -> Wired:
    """The cache, threshold, crash watch and scheduler of a search over ``units`` with the
    ``SearchSettings`` fields in ``options``."""
    settings = SearchSettings(**options)
    on_failure = OnFailure(settings.on_failure)
    events: list[Event] = []
    the_units = Units(units)
    budget = Budget(settings.max_trials)
    cache = SampleCache(test, budget, progress=events.append, replay=replay or {})
    judged = Threshold(
        cache,
        the_units.everything,
        caller=settings.threshold,
        fraction=settings.threshold_fraction,
        on_failure=on_failure,
    )
    crashes = CrashWatch(
        cache, len(the_units), on_failure=on_failure, crash_runs=settings.crash_runs
    )
    sampling = {"repeats": settings.repeats, "max_samples": settings.max_samples}
    scheduler: Scheduler = (
        ParallelScheduler(cache, judged, crashes, budget, **sampling, workers=settings.workers)
        if settings.workers > 1
        else Scheduler(cache, judged, crashes, budget, **sampling)
    )
    return Wired(the_units, budget, cache, judged, crashes, scheduler, events)
