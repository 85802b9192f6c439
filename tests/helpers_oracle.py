"""An oracle test function for the bisection engine: a known truth, measured noisily.

``Oracle`` answers ``test(state, n)`` the way a training box would: ``n`` throughput samples
of the state's true speed with multiplicative (log-normal) noise, or a build failure for the
states it declares unbuildable. The truth is a set of *causes*: each cause is a set of units
that makes training ``drop`` times slower when all of them are applied (one unit: a plain
culprit; two units: an interaction, slow only together). Several causes are independent
culprits (any one of them is enough). An ordered unit is slow from its ``first_bad`` item on.

``make_oracle(n, scenario, seed, ...)`` places the causes at random (seeded). Shared by the
engine's tests and by ``benchmarks/bench_search.py``.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from envbisect.search import Outcome, State

SCENARIOS = ("single", "interaction", "independent", "unbuildable")


@dataclass
class Oracle:
    units: tuple[str, ...]
    causes: tuple[frozenset[str], ...]
    base: float = 12_800.0
    drop: float = 3.0
    cv: float = 0.0
    unbuildable: float = 0.0
    seed: int = 0
    first_bad: Mapping[str, int] = field(default_factory=dict)
    calls: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        # CV of a log-normal: sigma = sqrt(log(1 + cv^2)).
        self._sigma = math.sqrt(math.log1p(self.cv**2))

    def _unit_slow(self, state: State, unit: str) -> bool:
        if unit not in state.applied:
            return False
        pos = state.position(unit)
        return pos is None or pos >= self.first_bad.get(unit, 0)

    def is_slow(self, state: State) -> bool:
        return any(all(self._unit_slow(state, u) for u in cause) for cause in self.causes)

    def builds(self, state: State) -> bool:
        if not self.unbuildable or not state.applied or state.applied == frozenset(self.units):
            return True
        key = f"{self.seed}:{sorted(state.applied)}:{state.positions}".encode()
        h = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
        return h >= self.unbuildable

    def true_speed(self, state: State) -> float:
        return self.base / self.drop if self.is_slow(state) else self.base

    def __call__(self, state: State, n: int) -> Outcome:
        self.calls += 1
        if not self.builds(state):
            return Outcome(failure="build: no wheel for this combination")
        speed = self.true_speed(state)
        self.samples += n
        return Outcome(
            samples=tuple(speed * math.exp(self._rng.gauss(0.0, self._sigma)) for _ in range(n))
        )


def unit_names(n: int) -> tuple[str, ...]:
    return tuple(f"u{i:02d}" for i in range(n))


def make_oracle(
    n: int,
    scenario: str = "single",
    seed: int = 0,
    *,
    cv: float = 0.0,
    drop: float = 3.0,
    unbuildable: float | None = None,
) -> Oracle:
    """An oracle over ``n`` units with causes placed at random for ``scenario``.

    ``single``: one culprit. ``interaction``: two units slow only together. ``independent``:
    two culprits, either one slow. ``unbuildable``: one culprit, 10% of states fail to build.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}")
    units = unit_names(n)
    rng = random.Random(f"place:{n}:{scenario}:{seed}")
    if scenario in ("single", "unbuildable"):
        causes: Sequence[frozenset[str]] = (frozenset({rng.choice(units)}),)
    elif scenario == "interaction":
        causes = (frozenset(rng.sample(units, 2)),)
    else:
        a, b = rng.sample(units, 2)
        causes = (frozenset({a}), frozenset({b}))
    if unbuildable is None:
        unbuildable = 0.1 if scenario == "unbuildable" else 0.0
    return Oracle(
        units=units,
        causes=tuple(causes),
        drop=drop,
        cv=cv,
        unbuildable=unbuildable,
        seed=seed,
    )
