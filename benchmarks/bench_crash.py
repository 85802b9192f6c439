"""Intermittent crashes: right answers and cost of the engine's crash-rate verdicts.

For N in {4, 8, 16, 32} units and crash rates 1/3 and 1/8, over --seeds seeds (default 400),
one seeded unit is the culprit: every process of a state that applies it crashes with that
probability, independently (the field's race: some processes die, others run). Throughput
is the same in every state (log-normal noise, CV 3%), so the crash is the only regression.
A call of the test function is one process, two for an endpoint asked for more than one
sample (as ``envbisect run`` splits the endpoints' samples); a crash ends the process and
keeps the samples taken before it.

Methods:

1. ``rate``: the engine as built (``on_failure="bad"``): the bad endpoint is run until its
   crash rate is estimated, every state that runs clean is run until a crash at that rate
   would have shown with 95% probability (``envbisect.search.crashrate``); ``crash_runs=40``
   lets a bad endpoint that is not slow run up to 40 times looking for a crash first.
2. ``coin``: the same engine told nothing about crash kinds (failures reported as plain
   text, so no rate is estimated and no state gets extra runs): one crash is bad, one clean
   process is good -- the verdict before the crash rate; ``crash_runs=40`` too, so the bad
   endpoint is found crashing as often as in ``rate``.

"right" = the culprit named, alone. "runs" = processes started (the sample cost that
matters: each is a start and a warm-up). Prints a markdown table and the goal (rate: >= 95%
right). Pure Python, no I/O.

Usage: python benchmarks/bench_crash.py [--seeds N] [--sizes 4 8 16 32]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from envbisect.search import Outcome, SearchOutcome, State, search

SPEED = 5000.0
CV = 0.03


@dataclass
class Oracle:
    """A state's processes crash with ``rate`` when the culprit is applied."""

    units: list[str]
    culprit: str
    rate: float
    rng: random.Random
    plain: bool = False  # report crashes as text without the crash kind (the coin method)
    runs: int = 0

    def __call__(self, state: State, n: int) -> Outcome:
        endpoint = not state.applied or len(state.applied) == len(self.units)
        processes = 2 if endpoint and n > 1 else 1
        per = [-(-n // processes)] * processes
        per[-1] = n - per[0] * (processes - 1)
        samples: list[float] = []
        for k in range(processes):
            self.runs += 1
            if self.culprit in state.applied and self.rng.random() < self.rate:
                text = "died: RuntimeError" if self.plain else "crash: RuntimeError"
                return Outcome(samples=tuple(samples), failure=text, runs=k + 1)
            samples += [SPEED * math.exp(self.rng.gauss(0, CV)) for _ in range(per[k])]
        return Outcome(samples=tuple(samples), runs=processes)


@dataclass(frozen=True)
class Run:
    right: bool
    runs: int
    trials: int


def run(n: int, rate: float, seed: int, plain: bool) -> Run:
    rng = random.Random(seed * 7919 + n)
    units = [f"u{i:02d}" for i in range(n)]
    oracle = Oracle(units, rng.choice(units), rate, rng, plain=plain)
    result = search(units, oracle, crash_runs=40)
    names = [c.units for c in result.culprits]
    right = result.outcome is SearchOutcome.FOUND and names == [(oracle.culprit,)]
    return Run(right, oracle.runs, len(result.trials))


METHODS: dict[str, Callable[[int, float, int], Run]] = {
    "rate": lambda n, r, s: run(n, r, s, plain=False),
    "coin": lambda n, r, s: run(n, r, s, plain=True),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=400)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32])
    ns = ap.parse_args()
    started = time.perf_counter()
    goals = []
    print("| crash rate | N | method | right | runs mean / max | trials mean |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for rate in (1 / 3, 1 / 8):
        for n in ns.sizes:
            for name, fn in METHODS.items():
                runs = [fn(n, rate, seed) for seed in range(ns.seeds)]
                right = sum(r.right for r in runs) / len(runs)
                print(
                    f"| 1/{round(1 / rate)} | {n} | {name} | {right:.1%} | "
                    f"{statistics.fmean(r.runs for r in runs):.1f} / {max(r.runs for r in runs)} "
                    f"| {statistics.fmean(r.trials for r in runs):.1f} |"
                )
                if name == "rate":
                    ok = "met" if right >= 0.95 else "MISSED"
                    goals.append(
                        f"- rate 1/{round(1 / rate)}, N={n}: right {right:.1%} >= 95% {ok}"
                    )
    print("\n" + "\n".join(goals))
    print(f"\n{ns.seeds} seeds per cell; {time.perf_counter() - started:.0f} s in all.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
