"""Bisection engine simulation: trials, samples and accuracy against an oracle.

For every case and N ∈ {4, 8, 16, 32, 64} units, over --seeds seeds (default 200), the same
oracle (tests/helpers_oracle.py: seeded culprit placement, seeded log-normal noise) is given
to three methods:

1. ``engine``: ``envbisect.search.engine`` (defaults: 3 samples, up to 9 near the threshold;
   ``find_all`` for the independent-culprits case, ``on_failure="skip"`` for unbuildable);
2. ``ddmin``: Zeller & Hildebrandt's plain ddmin (minimizing, subsets then complements,
   unresolved = not failing), every state measured with 3 samples and judged by its median
   against the same default threshold (geometric mean of the endpoint medians);
3. ``one-at-a-time``: each unit alone on top of good, 3 samples each, same threshold.

Trials are distinct measured states, endpoints included (2 for every method). "exact" means
the method reported exactly the true causes; "wrong" that it named a set of units that is not
a true cause (a wrong answer is worse than an ambiguous or partial one).

Cases: single culprit; two-change interaction (slow only together); two independent culprits
(either one is slow); one culprit with 10% of states unbuildable; one culprit under noise CV
0/5/10/20% with a 3× and a 1.3× drop; the two hardest noise cases again with the engine
allowed 21 samples per state instead of 9.

The k axis: the engine with k ∈ {1, 2, 4, 8} workers (k states measured per round) for
N ∈ {8, 16, 32, 64}: rounds and trials for a single culprit, an interaction, and one
culprit under CV 5% / 1.3× and CV 10% / 3× noise.

Usage: python benchmarks/bench_search.py [--seeds N] [--sizes 4 8 ...] [--ks 1 2 4 8]
[--only k]
Prints markdown tables and the goal checks; nothing is asserted. Pure Python, no I/O.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers_oracle import Oracle, make_oracle  # noqa: E402  (tests/ is put on the path above)

from envbisect.search import SearchOutcome, State, Verdict, search  # noqa: E402
from envbisect.search.verdict import median  # noqa: E402

Answer = set[frozenset[str]]
BASE_SAMPLES = 3


@dataclass(frozen=True)
class Case:
    name: str
    scenario: str
    cv: float = 0.0
    drop: float = 3.0
    max_samples: int = 9


CASES = [
    Case("single culprit", "single"),
    Case("interaction (slow only together)", "interaction"),
    Case("two independent culprits", "independent"),
    Case("10% of states unbuildable", "unbuildable"),
    *[
        Case(f"noise CV {cv:.0%}, {drop}x drop", "single", cv, drop)
        for drop in (3.0, 1.3)
        for cv in (0.0, 0.05, 0.10, 0.20)
    ],
    # The same noisy cases with the engine allowed more samples per state near the threshold.
    Case("noise CV 10%, 1.3x drop, engine max_samples=21", "single", 0.10, 1.3, 21),
    Case("noise CV 20%, 1.3x drop, engine max_samples=21", "single", 0.20, 1.3, 21),
]


@dataclass(frozen=True)
class Run:
    trials: int
    samples: int
    answer: Answer
    ambiguous: bool = False


def run_engine(oracle: Oracle, case: Case) -> Run:
    result = search(
        oracle.units,
        oracle,
        max_samples=case.max_samples,
        find_all=case.scenario == "independent",
        on_failure="skip" if case.scenario == "unbuildable" else "bad",
    )
    answer = {frozenset(c.units) for c in result.culprits}
    return Run(
        len(result.trials),
        result.samples,
        answer,
        ambiguous=result.outcome is not SearchOutcome.FOUND,
    )


class Fixed:
    """A baseline's measurements: 3 samples per state, median vs the default threshold."""

    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle
        self.cache: dict[frozenset[str], Verdict] = {}
        good = oracle(State.of(()), BASE_SAMPLES).samples
        bad = oracle(State.of(oracle.units), BASE_SAMPLES).samples
        self.threshold = math.sqrt(median(good) * median(bad))
        self.trials = 2
        self.cache[frozenset()] = Verdict.GOOD
        self.cache[frozenset(oracle.units)] = Verdict.BAD

    def __call__(self, units: frozenset[str]) -> Verdict:
        if units not in self.cache:
            self.trials += 1
            out = self.oracle(State.of(units), BASE_SAMPLES)
            if out.failure:
                verdict = Verdict.UNRESOLVED
            else:
                verdict = Verdict.GOOD if median(out.samples) >= self.threshold else Verdict.BAD
            self.cache[units] = verdict
        return self.cache[units]


def _split(items: list[str], n: int) -> list[frozenset[str]]:
    return [frozenset(items[i * len(items) // n : (i + 1) * len(items) // n]) for i in range(n)]


def run_ddmin(oracle: Oracle, case: Case) -> Run:
    test = Fixed(oracle)
    config = list(oracle.units)
    n = 2
    while len(config) >= 2:
        subsets = _split(config, n)
        reduced: list[str] | None = None
        for s in subsets:
            if test(s) is Verdict.BAD:
                reduced, n = [u for u in config if u in s], 2
                break
        if reduced is None:
            for s in subsets:
                rest = frozenset(config) - s
                if test(rest) is Verdict.BAD:
                    reduced, n = [u for u in config if u in rest], max(n - 1, 2)
                    break
        if reduced is None:
            if n >= len(config):
                break
            n = min(2 * n, len(config))
        else:
            config = reduced
    return Run(test.trials, test.trials * BASE_SAMPLES, {frozenset(config)})


def run_one_at_a_time(oracle: Oracle, case: Case) -> Run:
    test = Fixed(oracle)
    answer = {frozenset({u}) for u in oracle.units if test(frozenset({u})) is Verdict.BAD}
    return Run(test.trials, test.trials * BASE_SAMPLES, answer, ambiguous=not answer)


METHODS: dict[str, Callable[[Oracle, Case], Run]] = {
    "engine": run_engine,
    "ddmin": run_ddmin,
    "one-at-a-time": run_one_at_a_time,
}


K_CASES = [
    Case("single culprit", "single"),
    Case("interaction (slow only together)", "interaction"),
    Case("noise CV 5%, 1.3x drop", "single", 0.05, 1.3),
    Case("noise CV 10%, 3.0x drop", "single", 0.10, 3.0),
]


@dataclass(frozen=True)
class KRun:
    rounds: int
    trials: int
    exact: bool
    wrong: bool


def run_engine_k(oracle: Oracle, case: Case, k: int) -> KRun:
    result = search(
        oracle.units,
        oracle,
        max_samples=case.max_samples,
        workers=k,
        test_many=lambda calls: [oracle(s, n) for s, n in calls],
    )
    answer = {frozenset(c.units) for c in result.culprits}
    truth = set(oracle.causes)
    return KRun(
        result.rounds, len(result.trials), answer == truth, any(a not in truth for a in answer)
    )


def logk(n: int, k: int) -> int:
    return math.ceil(math.log(n, k + 1) - 1e-9)


def k_axis(seeds: int, sizes: list[int], ks: list[int]) -> list[str]:
    """The k table; returns the goal lines."""
    goals: list[str] = []
    cells: dict[tuple[str, int, int], list[KRun]] = {}
    for case in K_CASES:
        print(f"\n### k workers: {case.name}\n")
        print("| N | k | rounds mean / max | trials mean / max | exact | wrong |")
        print("|---:|---:|---:|---:|---:|---:|")
        for n in sizes:
            for k in ks:
                runs = [
                    run_engine_k(
                        make_oracle(n, case.scenario, seed, cv=case.cv, drop=case.drop), case, k
                    )
                    for seed in range(seeds)
                ]
                cells[(case.name, n, k)] = runs
                print(
                    f"| {n} | {k} | {statistics.fmean(r.rounds for r in runs):.2f} / "
                    f"{max(r.rounds for r in runs)} | "
                    f"{statistics.fmean(r.trials for r in runs):.2f} / "
                    f"{max(r.trials for r in runs)} | "
                    f"{sum(r.exact for r in runs) / len(runs):.1%} | "
                    f"{sum(r.wrong for r in runs) / len(runs):.1%} |"
                )
    for n in sizes:
        for k in ks:
            single = cells[("single culprit", n, k)]
            cv5 = cells[("noise CV 5%, 1.3x drop", n, k)]
            cv10 = cells[("noise CV 10%, 3.0x drop", n, k)]
            bound = logk(n, k) + 2
            worst = max(r.rounds for r in single)
            e5 = sum(r.exact for r in cv5) / len(cv5)
            e10 = sum(r.exact for r in cv10) / len(cv10)
            wrong = sum(r.wrong for r in cv5 + cv10)
            # With one worker the endpoints and the confirmations are a round each: the
            # goal there is the trial count of the sequential search.
            checks = (
                [
                    (
                        f"single: rounds max {worst} <= {bound}",
                        worst <= bound and all(r.exact for r in single),
                    )
                ]
                if k > 1
                else []
            ) + [
                (f"CV5% 1.3x exact {e5:.1%} >= 95%", e5 >= 0.95),
                (f"CV10% 3x exact {e10:.1%} >= 99%", e10 >= 0.99),
                (f"{wrong} wrong", wrong == 0),
            ]
            if k == 1:
                trials = max(r.trials for r in single)
                checks.append((f"trials max {trials} <= {log2c(n) + 4}", trials <= log2c(n) + 4))
            marks = "; ".join(f"{t} {'met' if ok else 'MISSED'}" for t, ok in checks)
            goals.append(f"- N={n}, k={k}: {marks}")
    return goals


@dataclass(frozen=True)
class Summary:
    mean_trials: float
    max_trials: int
    mean_samples: float
    exact: float
    wrong: float


def summarise(runs: list[Run], truths: list[Answer]) -> Summary:
    exact = sum(r.answer == t for r, t in zip(runs, truths, strict=True))
    wrong = sum(any(a not in t for a in r.answer) for r, t in zip(runs, truths, strict=True))
    return Summary(
        mean_trials=statistics.fmean(r.trials for r in runs),
        max_trials=max(r.trials for r in runs),
        mean_samples=statistics.fmean(r.samples for r in runs),
        exact=exact / len(runs),
        wrong=wrong / len(runs),
    )


def log2c(n: int) -> int:
    return math.ceil(math.log2(n))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--only", choices=["k"], help="only the k axis")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.only == "k":
        sizes = [n for n in args.sizes if n >= 8] or [8, 16, 32, 64]
    else:
        results = method_tables(args.seeds, args.sizes)
        print("\n### Goals (engine)\n")
        for n in args.sizes:
            print(f"- N={n}: {engine_goals(results, n)}")
        sizes = [n for n in args.sizes if n >= 8]
    goals = k_axis(args.seeds, sizes, args.ks)
    print("\n### Goals (k workers)\n")
    print("\n".join(goals))
    print(f"\n{args.seeds} seeds per cell; {time.perf_counter() - started:.0f} s in all.")
    return 0


def method_tables(seeds: int, sizes: list[int]) -> dict[tuple[str, int, str], Summary]:
    """One table per case: every method over ``seeds`` oracles per size; the summaries."""
    results: dict[tuple[str, int, str], Summary] = {}
    for case in CASES:
        print(f"\n### {case.name}\n")
        print(
            "| N | engine trials mean / max | engine samples | engine exact | engine wrong "
            "| ddmin trials mean / max | ddmin exact | ddmin wrong "
            "| one-at-a-time trials | one-at-a-time exact | one-at-a-time wrong |"
        )
        print("|---:" * 11 + "|")
        for n in sizes:
            row: dict[str, Summary] = {}
            for method, fn in METHODS.items():
                runs, truths = [], []
                for seed in range(seeds):
                    oracle = make_oracle(n, case.scenario, seed, cv=case.cv, drop=case.drop)
                    runs.append(fn(oracle, case))
                    truths.append(set(oracle.causes))
                row[method] = results[(case.name, n, method)] = summarise(runs, truths)
            e, d, o = row["engine"], row["ddmin"], row["one-at-a-time"]
            print(
                f"| {n} | {e.mean_trials:.2f} / {e.max_trials} | {e.mean_samples:.1f} "
                f"| {e.exact:.1%} | {e.wrong:.1%} | {d.mean_trials:.2f} / {d.max_trials} "
                f"| {d.exact:.1%} | {d.wrong:.1%} | {o.mean_trials:.0f} | {o.exact:.1%} "
                f"| {o.wrong:.1%} |"
            )
    return results


def engine_goals(results: dict[tuple[str, int, str], Summary], n: int) -> str:
    """The engine's goals at size ``n``, each marked met or MISSED."""
    single = results[("single culprit", n, "engine")]
    inter = results[("interaction (slow only together)", n, "engine")]
    cv10 = results[("noise CV 10%, 3.0x drop", n, "engine")]
    cv5 = results[("noise CV 5%, 1.3x drop", n, "engine")]
    checks = [
        (
            f"single, no noise: max {single.max_trials} <= {log2c(n) + 3}, "
            f"exact {single.exact:.1%}",
            single.max_trials <= log2c(n) + 3 and single.exact == 1,
        ),
        (
            f"interaction: max {inter.max_trials} <= {2 * log2c(n) + 5}, exact {inter.exact:.1%}",
            inter.max_trials <= 2 * log2c(n) + 5 and inter.exact == 1,
        ),
        (f"CV10% 3x: exact {cv10.exact:.1%} >= 99%", cv10.exact >= 0.99),
        (f"CV5% 1.3x: exact {cv5.exact:.1%} >= 95%", cv5.exact >= 0.95),
    ]
    return "; ".join(f"{text} {'met' if ok else 'MISSED'}" for text, ok in checks)


if __name__ == "__main__":
    raise SystemExit(main())
