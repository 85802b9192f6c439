"""Intermittent crashes as a rate: how often the bad state crashes, and how many clean runs
clear a state of crashing like it. Pure arithmetic, no I/O.

A crash that strikes in some processes and not others (the field's FX race: 7 of 7 processes
with a cold compile cache, a few in ten with shapes that recompile) cannot be judged from one
run: a state that ran clean once may still crash like the bad state. So the bad endpoint's
rate is estimated first (``CrashRate``: ``ESTIMATE_CRASHES`` crashes in every run so far or
in at least ``ESTIMATE_MIN_RUNS`` runs, else ``ESTIMATE_RUNS`` runs), and every state that
did not crash is run until a state crashing at that rate would have crashed in one of its
runs with probability ``CONFIDENCE`` (``runs_to_clear``) -- per state at least, and higher
by the number of states a bisection judges (``clear_confidence``), so that the whole search
is right that often. The rate used is a lower confidence bound of the estimate (Wilson,
one-sided ``Z_LOWER``): a few runs can overstate a rate, and an overstated rate clears
states too cheaply. A state that crashed once is bad (``on_failure="bad"``): one crash is
proof, clean runs are only evidence.

Simulated: ``benchmarks/bench_crash.py`` (rates 1/3 and 1/8; right answers and runs spent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CONFIDENCE = 0.95
ESTIMATE_CRASHES = 3
ESTIMATE_RUNS = 24
ESTIMATE_MIN_RUNS = 10
Z_LOWER = 1.0  # one-sided: the rate is at least this bound with about 84% confidence
MAX_CLEAR_RUNS = 100  # a rate this low costs more runs than a bisection is worth


@dataclass(frozen=True)
class CrashRate:
    """``crashes`` of ``runs`` processes of one state crashed."""

    crashes: int
    runs: int

    @property
    def rate(self) -> float:
        return self.crashes / self.runs if self.runs else 0.0

    @property
    def intermittent(self) -> bool:
        """Crashed in some runs and ran clean in others."""
        return 0 < self.crashes < self.runs

    def lower(self, z: float = Z_LOWER) -> float:
        """Wilson lower bound of the rate."""
        n, k = self.runs, self.crashes
        if n == 0 or k == 0:
            return 0.0
        p = k / n
        centre = p + z * z / (2 * n)
        spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return max(0.0, (centre - spread) / (1 + z * z / n))

    def describe(self) -> str:
        """``crashed 2 of 6``."""
        return f"crashed {self.crashes} of {self.runs}"

    def estimated(self) -> bool:
        """Enough runs to use the rate: ``ESTIMATE_RUNS`` runs, or ``ESTIMATE_CRASHES``
        crashes in every run so far (a steady crash) or in at least ``ESTIMATE_MIN_RUNS``
        (three quick crashes of a rare one would overstate its rate)."""
        if self.runs >= ESTIMATE_RUNS:
            return True
        enough = self.crashes == self.runs or self.runs >= ESTIMATE_MIN_RUNS
        return self.crashes >= ESTIMATE_CRASHES and enough

    def runs_to_estimate(self) -> int:
        """The runs ``estimated`` asks for, as far as these runs tell: a steady crash
        ``ESTIMATE_CRASHES`` in all, else ``ESTIMATE_MIN_RUNS``, then ``ESTIMATE_RUNS``."""
        if self.crashes == self.runs:
            return max(ESTIMATE_CRASHES, self.runs + 1)
        return ESTIMATE_MIN_RUNS if self.runs < ESTIMATE_MIN_RUNS else ESTIMATE_RUNS


def clear_confidence(units: int, overall: float = CONFIDENCE) -> float:
    """The per-state confidence that keeps a whole search right with ``overall``: a
    bisection over ``units`` judges up to about ⌈log2 units⌉ + 3 states that hold the culprit
    (a split, the confirmations), and any one of them running clean by luck misleads it."""
    states = (math.ceil(math.log2(units)) if units > 1 else 0) + 3
    return 1 - (1 - overall) / states


def runs_to_clear(bad: CrashRate, confidence: float = CONFIDENCE) -> int:
    """Clean runs after which a state crashing like ``bad`` would have crashed at least once
    with probability ``confidence`` (at least 1; ``MAX_CLEAR_RUNS`` at most)."""
    rate = bad.lower()
    if rate <= 0:
        return 1
    if rate >= 1:
        return 1
    need = math.ceil(math.log(1 - confidence) / math.log(1 - rate))
    return max(1, min(MAX_CLEAR_RUNS, need))


def more_often(state: CrashRate, base: CrashRate) -> float:
    """One-sided Fisher exact test: the probability of ``state`` crashing at least this often
    if it crashed no more often than ``base`` (the good state's own rate). Small: it does."""
    k, n = state.crashes, state.runs
    crashes, runs = k + base.crashes, n + base.runs
    if not n or not crashes:
        return 1.0
    total = math.comb(runs, n)
    tail = sum(
        math.comb(crashes, i) * math.comb(runs - crashes, n - i)
        for i in range(k, min(n, crashes) + 1)
    )
    return tail / total
