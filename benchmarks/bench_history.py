"""Commit and hunk narrowing: extra trials against the ⌈log2 C⌉ + ⌈log2 H⌉ + 2 goal.

A simulated run over 4 units, one of them a file inside a repo whose change is C commits
that touched it plus an uncommitted edit (C + 1 versions); the version where it turns slow
(a commit or the uncommitted edit, uniformly at random, seeded) changes H lines far apart
(H hunks), one of which (at random) makes training ``drop`` times slower. The real engine
(``bisect.search``, the file unit ordered over its versions) and the run's real hunk step
(``bisect.hunkrun.find_hunk``, which applies hunk subsets with ``hunks.apply`` and judges
them as the run does) are given a simulated actuator and a measuring oracle: the speed
follows the realized file content (slow when it holds the slow line), log-normal noise.

"Extra trials" are the trials below the isolated unit: the engine's narrowing over the
versions plus the hunk search's. "exact": the named version and hunk are the true ones.

Usage: python benchmarks/bench_history.py [--seeds N] [--cv 0 0.05 0.10] [--drop 3]
[--commits 1 2 4 ...] [--hunks 1 2 3 ...]
Prints a markdown table and the goal check; nothing is asserted. Pure Python, no I/O.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from envbisect.model.history import UNCOMMITTED, FileVersion  # noqa: E402
from envbisect.search import Outcome, State, search  # noqa: E402
from envbisect.search.hunkrun import HunkSettings, find_hunk  # noqa: E402

FILE = "/w/repo/model.py"
UNIT = f"files:{FILE}"
OTHERS = ("git:/w/repo", "env:A", "packages:b")
SLOW = "SLOW = True\n"
GAP = 3  # unchanged lines between hunks, so each edited line is its own hunk


@dataclass
class _Change:
    key: str


@dataclass
class _Unit:
    id: str
    changes: tuple[_Change, ...]
    section: str = "files"


class _Manifest:
    def section(self, name: str) -> Mapping[str, Any]:
        return {"/w/repo": {}} if name == "git" else {}


class SimFile:
    """The actuator's side of the hunk step: versions, contents, registered variants."""

    def __init__(self, commits: int, hunks: int, rng: random.Random) -> None:
        lines = 2 + hunks * (GAP + 1)
        self.base = [f"line {i}\n" for i in range(lines)]
        self.contents: list[str] = []
        text = list(self.base)
        self.culprit_version = rng.randrange(commits + 1)
        self.culprit_hunk = rng.randrange(hunks)
        for v in range(commits + 1):
            if v == self.culprit_version:
                for h in range(hunks):
                    at = 1 + h * (GAP + 1)
                    text[at] = SLOW if h == self.culprit_hunk else f"edited {v}.{h}\n"
            else:
                text[-1] = f"last line, version {v}\n"
            self.contents.append("".join(text))
        self.good_text = "".join(self.base)
        self.items = [f"c{v:02d}" for v in range(commits)] + [UNCOMMITTED]
        self.variants = list(self.contents)
        self.units = [_Unit(UNIT, (_Change(FILE),))]
        self.good = self.bad = _Manifest()
        self.remote = False

    def ordered(self) -> dict[str, list[str]]:
        return {UNIT: self.items}

    def file_versions(self) -> dict[str, tuple[FileVersion, ...]]:
        return {UNIT: tuple(FileVersion(i, str(n), 0, "s", "d") for n, i in enumerate(self.items))}

    def content(self, unit_id: str, pos: int | None) -> bytes:
        text = (
            self.good_text
            if pos == -1
            else self.contents[-1]
            if pos is None
            else self.variants[pos]
        )
        return text.encode()

    def add_variant(self, unit_id: str, content: bytes) -> int:
        text = content.decode()
        if text not in self.variants:
            self.variants.append(text)
        return self.variants.index(text)

    def text_of(self, state: State) -> str:
        if UNIT not in state.applied:
            return self.good_text
        pos = state.position(UNIT)
        return self.contents[-1] if pos is None else self.variants[pos]


class Measure:
    """n samples of a state's speed: slow when the file holds the slow line."""

    def __init__(self, sim: SimFile, cv: float, drop: float, seed: int) -> None:
        self.sim = sim
        self.rng = random.Random(seed)
        self.sigma = math.sqrt(math.log1p(cv**2))
        self.drop = drop

    def __call__(self, state: State, n: int) -> Outcome:
        speed = 12_800.0 / (self.drop if SLOW in self.sim.text_of(state) else 1.0)
        return Outcome(tuple(speed * math.exp(self.rng.gauss(0, self.sigma)) for _ in range(n)))


@dataclass(frozen=True)
class Row:
    extra: int
    exact: bool
    found: bool  # the engine isolated the file (before anything below it)


def one(commits: int, hunks: int, cv: float, seed: int, drop: float = 3.0) -> Row:
    sim = SimFile(commits, hunks, random.Random(f"{commits}:{hunks}:{seed}"))
    measure = Measure(sim, cv, drop, seed)
    units = [UNIT, *OTHERS]
    result = search(units, measure, ordered={UNIT: sim.items})
    numbers = {t.state: t.index for t in result.trials}
    hunk, trials = find_hunk(
        result,
        sim,
        measure,
        HunkSettings(),
        lambda line: None,
        lambda s: numbers.get(s, 0),
    )
    extra = sum(1 for t in result.trials if t.purpose.startswith("narrow: ")) + len(trials)
    exact = (
        hunk is not None
        and hunk.version.item == sim.items[sim.culprit_version]
        and hunk.culprit is not None
        and hunk.culprit.number == sim.culprit_hunk + 1
    )
    return Row(extra, exact, [c.units for c in result.culprits] == [(UNIT,)])


def goal(commits: int, hunks: int) -> int:
    def log2c(n: int) -> int:
        return math.ceil(math.log2(n)) if n > 1 else 0

    return log2c(commits) + log2c(hunks) + 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--cv", type=float, nargs="+", default=[0.0, 0.05, 0.10])
    parser.add_argument("--commits", type=int, nargs="+", default=[1, 2, 4, 5, 8, 16, 32])
    parser.add_argument("--hunks", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16])
    parser.add_argument("--drop", type=float, default=3.0, help="how many times slower")
    args = parser.parse_args()
    started = time.perf_counter()
    print(
        "| C commits (+1 uncommitted) | H hunks | noise CV | extra trials mean | max | goal | "
        "max ≤ goal | exact | file isolated |"
    )
    print("|---:|---:|---:|---:|---:|---:|:-:|---:|---:|")
    over = 0
    for cv in args.cv:
        for c in args.commits:
            for h in args.hunks:
                rows = [one(c, h, cv, s, args.drop) for s in range(args.seeds)]
                extra = [r.extra for r in rows]
                g = goal(c, h)
                ok = max(extra) <= g
                over += not ok
                exact = sum(r.exact for r in rows) / len(rows)
                found = sum(r.found for r in rows) / len(rows)
                print(
                    f"| {c} | {h} | {cv:.0%} | {statistics.mean(extra):.2f} | {max(extra)} | "
                    f"{g} | {'yes' if ok else '**no**'} | {exact:.1%} | {found:.1%} |"
                )
    print(
        f"\n{over} cell(s) over the goal; {args.seeds} seeds per cell; "
        f"{time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
