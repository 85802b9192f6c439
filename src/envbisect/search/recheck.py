"""States measured again when their verdict rests on samples taken under other processes'
load (``SearchSettings.recheck_loaded``): a busy moment makes any state look slow."""

from __future__ import annotations

from dataclasses import dataclass

from envbisect.search.samples import Record, SampleCache
from envbisect.search.scheduler import Scheduler
from envbisect.search.state import State
from envbisect.search.verdict import Verdict, median
from envbisect.search.wording import Reason, Say, say

# Rounds of a paired measurement: good, other, good, other (as Chromium's Pinpoint
# alternates A and B): a change in the machine's speed falls on both alike.
PAIRED_ROUNDS = 2


@dataclass(frozen=True)
class Paired:
    """A good state and another measured back to back: the good state's median before
    (``before``) and in the pair (``now``), the other's in the pair (``other``)."""

    before: float
    now: float
    other: float

    def ratio(self) -> float:
        """The other's speed as a share of the good state's, measured together."""
        return self.other / self.now if self.now > 0 else 0.0


class LoadCheck:
    """The rechecks of one search; ``notes`` says what they found."""

    def __init__(
        self,
        cache: SampleCache,
        scheduler: Scheduler,
        everything: frozenset[str],
        *,
        enabled: bool,
    ) -> None:
        self.cache = cache
        self.scheduler = scheduler
        self.everything = everything
        self.enabled = enabled
        self.rechecked: set[State] = set()  # measured again, once each
        self.notes: list[Reason] = []

    def seen(self) -> bool:
        """Whether any sample of this run was taken while other processes loaded it."""
        return any(any(r.contended) for r in self.cache)

    def paired(self, other: State) -> Paired | None:
        """With load seen in this run: the good state and ``other`` measured again, one
        after the other, ``PAIRED_ROUNDS`` times; their fresh medians (both records keep the
        samples, as a recheck's do). None when load was never seen, or a side failed."""
        good = self.cache.get(State.of(()))
        rec = self.cache.get(other)
        if not self.seen() or good is None or rec is None or good.failure or rec.failure:
            return None
        if not good.samples:
            return None
        before = median(good.samples)
        fresh: dict[int, list[float]] = {id(good): [], id(rec): []}
        for _ in range(PAIRED_ROUNDS):
            for r in (good, rec):
                n = len(r.samples)
                self.cache.call(r, 1)
                fresh[id(r)] += r.samples[n:]
                if r.failure:
                    return None
        if not fresh[id(good)] or not fresh[id(rec)]:
            return None
        return Paired(before, median(fresh[id(good)]), median(fresh[id(rec)]))

    def load_varied(self) -> bool:
        """Whether some samples of this run were taken without other processes' load: only
        then is load a passing disturbance rather than the machine's steady state."""
        return any(not f for r in self.cache for f in r.contended)

    def mostly_loaded(self, rec: Record) -> bool:
        """Most of ``rec``'s samples were taken under other processes' load, while other
        samples of the run were not (load varied: a busy moment, not the machine's state)."""
        return (
            self.enabled
            and not rec.failure
            and rec.state not in self.rechecked
            and 2 * sum(rec.contended) >= len(rec.samples) > 0
            and self.load_varied()
        )

    def recheck(self, state: State) -> bool:
        """Measure ``state`` again when its bad verdict rests mostly on samples taken under
        load. Once per state; never an endpoint here (``endpoints``). True when the verdict
        changed."""
        rec = self.cache.get(state)
        if (
            rec is None
            or state in (State.of(()), State.of(self.everything))
            or rec.verdict is not Verdict.BAD
            or not self.mostly_loaded(rec)
        ):
            return False
        before = rec.verdict
        self.rechecked.add(rec.state)
        after = self.scheduler.measure_again(rec, endpoint=False)
        if after is not before:
            self.notes.append(
                say(
                    Say.RECHECKED,
                    index=rec.index,
                    after=after,
                    before=before,
                    median=median(rec.samples) if rec.samples else None,
                    failure=rec.failure,
                )
            )
        return after is not before

    def endpoints(self, good: Record, bad: Record) -> None:
        """An endpoint measured mostly under load while the other was not is measured again
        (the threshold comes from both): samples under load set aside, fresh ones taken."""
        for rec in (good, bad):
            if self.mostly_loaded(rec):
                self.rechecked.add(rec.state)
                self.scheduler.measure_again(rec, endpoint=True)
                self.notes.append(
                    say(
                        Say.ENDPOINT_RECHECKED,
                        which="good" if rec is good else "bad",
                        index=rec.index,
                        median=median(rec.samples) if rec.samples else None,
                    )
                )
