"""The trial budget, and the estimate of the trials left that progress events carry."""

from __future__ import annotations

import math
from collections.abc import Iterable


class Spent(Exception):
    """The budget of distinct states is spent: the search ends ``ABORTED``."""


def log2ceil(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


class Budget:
    """At most ``max_trials`` distinct states (None: no limit); ``left`` estimates how many
    more trials the search needs (None before isolation starts)."""

    def __init__(self, max_trials: int | None) -> None:
        self.max_trials = max_trials
        self.left: int | None = None

    def room(self, used: int) -> int | None:
        """Trials the budget still allows after ``used`` (None: no limit)."""
        return None if self.max_trials is None else self.max_trials - used

    def check(self, used: int) -> None:
        """``Spent`` when no trial is left after ``used``."""
        if self.max_trials is not None and used >= self.max_trials:
            raise Spent

    def finished_one(self) -> None:
        if self.left:
            self.left -= 1

    def estimate_isolation(self, delta: int, workers: int, ordered: Iterable[int]) -> None:
        """Trials left to isolate one of ``delta`` units and bisect the ordered units (their
        item counts) after it."""
        narrowing = max((log2ceil(n + 1) for n in ordered), default=0)
        if workers > 1:
            rounds = math.ceil(math.log(delta, workers + 1)) if delta > 1 else 0
            self.left = (rounds + 1) * workers + narrowing
            return
        self.left = log2ceil(delta) + 2 + narrowing

    def estimate_narrowing(self, choices: int, workers: int) -> None:
        """Trials (rounds of ``workers``) left to find the first bad of ``choices`` items."""
        if workers > 1:
            self.left = math.ceil(math.log(choices + 1, workers + 1))
        else:
            self.left = log2ceil(choices + 1)
