"""The sample cache: every state measured once, its samples, failure and verdict, in the order
first measured; the calls of the caller's test functions (or a replay) that fill it."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from envbisect.model.failure import CRASH_KINDS, Failure
from envbisect.search.budget import Budget
from envbisect.search.result import Event, EventKind, Trial
from envbisect.search.state import BatchTestFn, Outcome, Purpose, RateTestFn, State, TestFn
from envbisect.search.verdict import Noise, Verdict, median
from envbisect.search.wording import Reason, Say, say


@dataclass
class Record:
    """A state's trial while the search runs (``freeze()``: the ``Trial`` it reports)."""

    index: int
    state: State
    purpose: str
    samples: list[float] = field(default_factory=list)
    failure: Failure | None = None
    verdict: Verdict = Verdict.UNRESOLVED
    untestable: bool = False
    round: int = 0
    worker: str | None = None
    runs: int = 0
    crashes: int = 0
    contended: list[bool] = field(default_factory=list)
    set_aside: list[float] = field(default_factory=list)

    def freeze(self) -> Trial:
        return Trial(
            index=self.index,
            state=self.state,
            samples=tuple(self.samples),
            median=median(self.samples) if self.samples else None,
            verdict=self.verdict,
            failure=self.failure,
            purpose=self.purpose,
            round=self.round,
            worker=self.worker,
            runs=self.runs,
            crashes=self.crashes,
            contended=tuple(self.contended),
            set_aside=tuple(self.set_aside),
        )

    def take(self, out: Outcome) -> None:
        """Add what one call of the test function measured."""
        if not isinstance(out, Outcome):
            raise TypeError(f"test function returned {type(out).__name__}, not Outcome")
        if self.worker is None:
            self.worker = out.worker
        flags = (list(out.contended) + [False] * len(out.samples))[: len(out.samples)]
        pairs = zip(out.samples, flags, strict=True)
        kept = [(float(x), f) for x, f in pairs if math.isfinite(float(x))]
        good = [x for x, _ in kept]
        self.samples.extend(good)
        self.contended.extend(f for _, f in kept)
        self.runs += max(1, out.runs)
        failure = Failure.of(out.failure) if out.failure else None
        crashed = failure is not None and failure.kind in CRASH_KINDS
        self.crashes += out.crashes or (1 if crashed else 0)
        if out.untestable:
            self.untestable = True
        if failure:
            self.failure = failure
        elif not good and not out.rate_only:
            self.failure = Failure("no samples")


class SampleCache:
    """The trials of one search, keyed by state, and the one way they are measured."""

    def __init__(
        self,
        test: TestFn,
        budget: Budget,
        *,
        progress: Callable[[Event], None] | None,
        replay: Mapping[State, Outcome],
        test_many: BatchTestFn | None = None,
        test_rate: RateTestFn | None = None,
    ) -> None:
        self.test = test
        self.test_many = test_many
        self.test_rate = test_rate
        self.budget = budget
        self.progress = progress
        self.replay = dict(replay)
        self.records: dict[State, Record] = {}
        self.order: list[Record] = []
        self.round = 0

    def __contains__(self, state: State) -> bool:
        return state in self.records

    def __getitem__(self, state: State) -> Record:
        return self.records[state]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)

    def get(self, state: State) -> Record | None:
        return self.records.get(state)

    def replayed(self, state: State) -> bool:
        """Whether ``state`` comes from an earlier session (it takes no worker)."""
        return state in self.replay

    def trials(self) -> tuple[Trial, ...]:
        return tuple(r.freeze() for r in self.order)

    def noise(self) -> Noise:
        return Noise.from_groups(r.samples for r in self.order if not r.failure)

    def emit(self, kind: EventKind, reason: Reason, rec: Record | None = None) -> None:
        if self.progress is not None:
            self.progress(
                Event(
                    kind=kind,
                    message=reason.text(),
                    trial=rec.freeze() if rec else None,
                    state=rec.state if rec else None,
                    trials_left=self.budget.left,
                    reason=reason,
                )
            )

    def new(self, state: State, purpose: str) -> Record:
        """A new trial of ``state`` in the current round (``Spent`` past the budget)."""
        self.budget.check(len(self.order))
        purpose = Purpose.text(purpose)
        rec = Record(index=len(self.order) + 1, state=state, purpose=purpose, round=self.round)
        self.records[state] = rec
        self.order.append(rec)
        self.emit(
            EventKind.TRIAL_STARTED,
            say(Say.TRIAL_STARTED, index=rec.index, state=state, purpose=purpose),
            rec,
        )
        return rec

    def call(self, rec: Record, n: int) -> None:
        """``n`` more samples of ``rec`` (its replayed outcome, if it has one)."""
        replayed = self.replay.pop(rec.state, None)
        if replayed is None and self.test_many is not None:
            self.call_many([(rec, n)])
            return
        rec.take(replayed if replayed is not None else self.test(rec.state, n))

    def call_rate(self, rec: Record, runs: int) -> None:
        """``runs`` more processes of ``rec`` at once, for its crash rate alone (one after
        the other when the caller has no ``test_rate``)."""
        replayed = self.replay.pop(rec.state, None)
        if replayed is not None:
            rec.take(replayed)
        elif self.test_rate is None:
            for _ in range(runs):
                self.call(rec, 1)
        else:
            rec.take(self.test_rate(rec.state, runs))

    def call_many(self, calls: Sequence[tuple[Record, int]]) -> None:
        """Measure several states at once (one batch of the caller's workers)."""
        pending: list[tuple[Record, int]] = []
        for rec, n in calls:
            replayed = self.replay.pop(rec.state, None)
            if replayed is not None:
                rec.take(replayed)
            else:
                pending.append((rec, n))
        if not pending:
            return
        if self.test_many is None:
            outs: Sequence[Outcome] = [self.test(rec.state, n) for rec, n in pending]
        else:
            outs = self.test_many([(rec.state, n) for rec, n in pending])
        if len(outs) != len(pending):
            raise TypeError(f"batch test function returned {len(outs)} outcomes for {len(pending)}")
        for (rec, _), out in zip(pending, outs, strict=True):
            rec.take(out)
