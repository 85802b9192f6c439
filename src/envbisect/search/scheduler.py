"""Which trials run when: one state at a time (``Scheduler``), or rounds of up to k states
measured together by k workers (``ParallelScheduler``, the batching strategy, with states
measured speculatively ahead of need). Every state is measured once; more samples are taken
while its median sits inside the noise band, up to ``max_samples``."""

from __future__ import annotations

from collections.abc import Sequence

from envbisect.search.budget import Budget, Spent
from envbisect.search.crashes import CrashWatch
from envbisect.search.result import EventKind, Trial
from envbisect.search.samples import Record, SampleCache
from envbisect.search.state import State
from envbisect.search.threshold import Threshold
from envbisect.search.verdict import Judge, Verdict, median, more_wanted, sample_cap
from envbisect.search.wording import Reason, Say, say


class Scheduler:
    """The sequential strategy: every trial in a round of its own."""

    workers = 1

    def __init__(
        self,
        cache: SampleCache,
        threshold: Threshold,
        crashes: CrashWatch,
        budget: Budget,
        *,
        repeats: int,
        max_samples: int,
    ) -> None:
        self.cache = cache
        self.threshold = threshold
        self.crashes = crashes
        self.budget = budget
        self.repeats = repeats
        self.max_samples = max_samples
        self.speculated: list[Record] = []  # measured ahead, judged once the endpoints are

    def trial(self, state: State) -> Trial:
        return self.cache[state].freeze()

    def measure(self, state: State, purpose: str) -> Verdict:
        """The verdict on ``state``, measuring it (once) if it is not cached."""
        cached = self.cache.get(state)
        if cached is not None:
            if cached.verdict is Verdict.UNRESOLVED and not cached.failure:
                # The noise estimate and the default threshold have been refined since:
                # judge the same samples again.
                cached.verdict = self.threshold.decide(cached)
            return cached.verdict
        rec = self.start(state, purpose, self.repeats)
        self.sample(rec)
        return self.finish(rec)

    def sample(self, rec: Record) -> None:
        """More samples of ``rec`` while it sits inside the noise band; then cleared of
        crashes."""
        while not rec.failure and self.wants_more(rec, self.threshold.judge()):
            self.more(rec)
        self.crashes.clear(rec, slow=self.slow(rec))

    def slow(self, rec: Record) -> bool:
        """Whether ``rec``'s samples alone judge it bad (below the threshold, past the noise)."""
        return bool(rec.samples) and self.threshold.decide(rec) is Verdict.BAD

    def measure_many(self, requests: Sequence[tuple[State, str]]) -> list[Verdict]:
        """Verdicts on several states."""
        return [self.measure(state, purpose) for state, purpose in requests]

    def start(self, state: State, purpose: str, n: int) -> Record:
        self.cache.round += 1
        rec = self.cache.new(state, purpose)
        self.cache.call(rec, n)
        return rec

    def start_round(
        self,
        requests: Sequence[tuple[State, str]],
        n: int,
        speculative: Sequence[tuple[State, str]] = (),
    ) -> list[Record]:
        """Start distinct, unmeasured states, one after the other (no speculation)."""
        return [self.start(state, purpose, n) for state, purpose in requests]

    def wants_more(self, rec: Record, judge: Judge) -> bool:
        """True while ``rec`` (not failed) sits inside the noise band below its cap."""
        return not rec.failure and judge.needs_more(rec.samples, self.cap(rec))

    def cap(self, rec: Record) -> int:
        """The samples ``rec`` may grow to (``verdict.sample_cap``)."""
        return sample_cap(len(rec.samples), rec.runs, self.max_samples)

    def _more_reason(self, rec: Record) -> tuple[Reason, int]:
        n = more_wanted(len(rec.samples), self.max_samples)
        if len(rec.samples) >= self.max_samples:
            return say(Say.ANOTHER_PROCESS, index=rec.index, runs=rec.runs), n
        return say(Say.MORE_SAMPLES, index=rec.index, n=n), n

    def more(self, rec: Record) -> None:
        reason, n = self._more_reason(rec)
        self.cache.emit(EventKind.MORE_SAMPLES, reason, rec)
        self.cache.call(rec, n)

    def more_many(self, recs: Sequence[Record]) -> None:
        """More samples of several trials."""
        for rec in recs:
            self.more(rec)

    def finish(self, rec: Record) -> Verdict:
        rec.verdict = self.threshold.decide(rec)
        self.budget.finished_one()
        self.report(rec)
        return rec.verdict

    def report(self, rec: Record) -> None:
        """The trial-finished event of ``rec``, as judged."""
        reason = say(
            Say.TRIAL_FINISHED,
            index=rec.index,
            verdict=rec.verdict,
            failure=rec.failure,
            median=median(rec.samples) if rec.samples and not rec.failure else None,
            samples=len(rec.samples),
            rate=self.crashes.shown(rec),
        )
        self.cache.emit(EventKind.TRIAL_FINISHED, reason, rec)

    def settle(self, recs: Sequence[Record], *, sample: bool = True) -> None:
        """Finish a round's trials: while any of them (run, not failed) sits inside the noise
        band, more samples of those together; then their verdicts. ``sample=False``: the
        verdicts on the samples they have."""
        while sample:
            judge = self.threshold.judge()
            more = [r for r in recs if self.wants_more(r, judge)]
            if not more:
                break
            self.more_many(more)
        for rec in recs:
            self.crashes.clear(rec, slow=self.slow(rec))
            self.finish(rec)

    def settle_speculated(self, reproduced: bool) -> None:
        """Judge the states measured with the endpoints (more samples only when the search
        goes on)."""
        recs, self.speculated = self.speculated, []
        self.settle(recs, sample=reproduced)

    def measure_again(self, rec: Record, *, endpoint: bool) -> Verdict:
        """Set ``rec``'s samples under load aside and measure it until judged again."""
        loaded = sum(rec.contended)
        self.cache.emit(
            EventKind.PHASE,
            say(
                Say.MEASURE_AGAIN,
                index=rec.index,
                loaded=loaded,
                samples=len(rec.samples),
                endpoint=endpoint,
            ),
        )
        rec.set_aside.extend(x for x, f in zip(rec.samples, rec.contended, strict=True) if f)
        rec.samples = [x for x, f in zip(rec.samples, rec.contended, strict=True) if not f]
        rec.contended = [False] * len(rec.samples)
        self.cache.call(rec, max(1, self.repeats - len(rec.samples)))
        self.sample(rec)
        return self.finish(rec)


class ParallelScheduler(Scheduler):
    """The batching strategy: up to ``workers`` states per round, measured at the same time,
    and states measured speculatively while a worker would otherwise wait."""

    def __init__(
        self,
        cache: SampleCache,
        threshold: Threshold,
        crashes: CrashWatch,
        budget: Budget,
        *,
        repeats: int,
        max_samples: int,
        workers: int,
    ) -> None:
        super().__init__(
            cache, threshold, crashes, budget, repeats=repeats, max_samples=max_samples
        )
        self.workers = workers

    def measure_many(self, requests: Sequence[tuple[State, str]]) -> list[Verdict]:
        """Verdicts on several states, the unmeasured ones measured together (one round per
        ``workers`` of them, never the same state twice)."""
        fresh: list[tuple[State, str]] = []
        for state, purpose in requests:
            if state not in self.cache and all(state != s for s, _ in fresh):
                fresh.append((state, purpose))
        while len(fresh) > 1:
            recs = self.start_round(fresh, self.repeats)
            fresh = fresh[len(recs) :]
            self.settle(recs)
        return super().measure_many(requests)

    def start_round(
        self,
        requests: Sequence[tuple[State, str]],
        n: int,
        speculative: Sequence[tuple[State, str]] = (),
    ) -> list[Record]:
        """Start distinct, unmeasured states together as one round: as many of the first
        of them as there are workers (a state replayed from an earlier session takes none)
        and trials left in the budget, then the ``speculative`` ones (``repeats`` samples
        each; a worker that is done takes the next)."""
        left = self.budget.room(len(self.cache))
        if left is not None and left <= 0:
            raise Spent
        room, take = self.workers, 0
        for state, _ in requests:
            if take == len(requests) or (left is not None and take >= left) or room == 0:
                break
            take += 1
            if not self.cache.replayed(state):
                room -= 1
        extra = [(s, p) for s, p in speculative if s not in self.cache]
        if left is not None:
            extra = extra[: max(0, left - take)]
        self.cache.round += 1
        batch = [self.cache.new(state, purpose) for state, purpose in requests[:take]]
        spec = [self.cache.new(state, purpose) for state, purpose in extra]
        self.cache.call_many([(r, n) for r in batch] + [(r, self.repeats) for r in spec])
        self.speculated.extend(spec)
        return batch

    def more_many(self, recs: Sequence[Record]) -> None:
        """More samples of several trials, each on its own worker at the same time."""
        calls = []
        for rec in recs:
            reason, n = self._more_reason(rec)
            self.cache.emit(EventKind.MORE_SAMPLES, reason, rec)
            calls.append((rec, n))
        for i in range(0, len(calls), self.workers):
            self.cache.call_many(calls[i : i + self.workers])
