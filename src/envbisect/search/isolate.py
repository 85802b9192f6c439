"""Isolation with Zeller's dd (the isolating variant, "+/-"), and the search for a minimal
set of units that is bad alone (one unit, or several that are slow only together).

With conclusive verdicts dd is binary splitting (k-ary with k workers); unresolved states
make it try the complement, then split finer, like ``git bisect skip``. Finer splits do not
beat noise: once a handful of states sit inside the noise band it stops and says so.
"""

from __future__ import annotations

from envbisect.search.budget import Budget, log2ceil
from envbisect.search.result import EventKind
from envbisect.search.samples import SampleCache
from envbisect.search.scheduler import Scheduler
from envbisect.search.state import Purpose, State, Units
from envbisect.search.verdict import Verdict
from envbisect.search.wording import Reason, Say, say


class Ambiguous(Exception):
    """The cause is somewhere in ``candidates`` but the search cannot say where (``why``)."""

    def __init__(self, candidates: frozenset[str], why: Reason) -> None:
        super().__init__(why.text())
        self.candidates = candidates
        self.why = why


def chain(
    passing: frozenset[str], failing: frozenset[str], delta: list[str], workers: int
) -> list[frozenset[str]]:
    """``passing``, the k nested states of a k-ary split of ``delta``, ``failing``."""
    k = min(workers, len(delta) - 1)
    cuts = [(j * len(delta)) // (k + 1) for j in range(1, k + 1)]
    return [passing, *(passing | frozenset(delta[:c]) for c in cuts), failing]


Pair = tuple[frozenset[str], frozenset[str]]


class Isolator:
    """The isolation phase of one search. ``core`` is the part of the cause isolated so
    far; ``candidates`` the smallest set known to hold the cause (for an aborted search)."""

    def __init__(
        self,
        cache: SampleCache,
        scheduler: Scheduler,
        budget: Budget,
        units: Units,
        *,
        ordered_sizes: tuple[int, ...] = (),
    ) -> None:
        self.cache = cache
        self.scheduler = scheduler
        self.budget = budget
        self.units = units
        self.ordered_sizes = ordered_sizes
        self.workers = scheduler.workers
        self.core: frozenset[str] = frozenset()
        self.candidates: frozenset[str] = units.everything
        self.too_noisy = 0

    def first_split(self) -> list[tuple[State, str]]:
        """The first k-ary split's states, measured speculatively with the endpoints (as
        Pinpoint does): a worker done with the good state takes them while the full set
        runs, and they are needed whenever the endpoints come out as expected."""
        if self.workers == 1 or len(self.units) < 2:
            return []
        states = chain(frozenset(), self.units.everything, list(self.units.ids), self.workers)
        return [(State.of(s), Purpose.SPECULATIVE) for s in states[1:-1]]

    def dd(self, passing: frozenset[str], failing: frozenset[str], purpose: str) -> Pair:
        """Narrow (passing good, failing bad, passing ⊂ failing) to a 1-unit difference.

        Returns the final pair; their difference has more than one unit only when every
        split of it is unresolved.
        """
        n = 2
        # Finer splits help around unbuildable states, not against noise (every state is
        # as noisy): after this many states inside the noise band, stop and say so.
        noisy: set[State] = set()
        self.too_noisy = 0
        while True:
            delta = self.units.sorted(failing - passing)
            self.candidates = frozenset(delta) | self.core
            if len(delta) <= 1:
                return passing, failing
            if len(noisy) > max(4, log2ceil(len(self.units))):
                self.too_noisy = len(noisy)
                return passing, failing
            self.budget.estimate_isolation(len(delta), self.workers, self.ordered_sizes)
            if self.workers > 1 and n == 2:
                moved = self._split_round(passing, failing, delta, purpose, noisy)
                if moved is not None:
                    passing, failing = moved
                    continue
            n = min(n, len(delta))
            parts = [
                frozenset(delta[i * len(delta) // n : (i + 1) * len(delta) // n]) for i in range(n)
            ]
            if self.workers > 1:
                self._prefetch(passing, failing, parts, purpose)
            passing, failing, step = self._lazy_step(passing, failing, parts, purpose, noisy)
            if step is not None:
                n = 2 if step else max(n - 1, 2)
                continue
            if n >= len(delta):
                return passing, failing
            n = min(2 * n, len(delta))

    def _unresolved(self, state: State, noisy: set[State]) -> None:
        """An unresolved state that ran counts against the noise limit."""
        if not self.cache[state].failure:
            noisy.add(state)

    def _lazy_step(
        self,
        passing: frozenset[str],
        failing: frozenset[str],
        parts: list[frozenset[str]],
        purpose: str,
        noisy: set[State],
    ) -> tuple[frozenset[str], frozenset[str], bool | None]:
        """Lazy dd: act on the first conclusive test. Testing passing ∪ Δi, then failing \\ Δi
        (the "+/-" of dd) means any conclusive verdict narrows the pair. Returns the pair and
        whether the cause is inside the Δi that moved it (None: every test unresolved)."""
        for part in parts:
            for state, inside in ((passing | part, True), (failing - part, False)):
                v = self.scheduler.measure(State.of(state), purpose)
                if v is Verdict.UNRESOLVED:
                    self._unresolved(State.of(state), noisy)
                    continue
                # passing ∪ Δi bad, or failing \ Δi good: the cause is inside Δi (restart
                # at halves); otherwise only Δi is ruled out (Zeller: n - 1).
                step = (v is Verdict.BAD) == inside
                if v is Verdict.BAD:
                    return passing, state, step
                return state, failing, step
        return passing, failing, None

    def _split_round(
        self,
        passing: frozenset[str],
        failing: frozenset[str],
        delta: list[str],
        purpose: str,
        noisy: set[State],
    ) -> Pair | None:
        """One round of k-ary splitting with k workers: cut ``delta`` into k + 1 parts and
        measure the k nested states ``passing`` + the first j parts at once. The last good
        one before the first bad one is the new pair (one culprit among N: ⌈log_{k+1} N⌉
        rounds). None when every state of the round was unresolved."""
        states = chain(passing, failing, delta, self.workers)
        verdicts = self.scheduler.measure_many([(State.of(s), purpose) for s in states[1:-1]])
        marks = [Verdict.GOOD, *verdicts, Verdict.BAD]
        for state, v in zip(states[1:-1], verdicts, strict=True):
            if v is Verdict.UNRESOLVED:
                self._unresolved(State.of(state), noisy)
        hi = marks.index(Verdict.BAD)
        lo = max(i for i in range(hi) if marks[i] is Verdict.GOOD)
        if (lo, hi) == (0, len(states) - 1):
            return None
        return states[lo], states[hi]

    def _prefetch(
        self,
        passing: frozenset[str],
        failing: frozenset[str],
        parts: list[frozenset[str]],
        purpose: str,
    ) -> None:
        """Measure dd's next states in rounds of ``workers``, in the order the lazy loop
        tests them, until one is conclusive (the loop then reads them from the cache)."""
        states = [State.of(s) for part in parts for s in (passing | part, failing - part)]
        i = 0
        while i < len(states):
            batch: list[State] = []
            while i < len(states) and len(batch) < self.workers:
                if states[i] not in self.cache and states[i] not in batch:
                    batch.append(states[i])
                i += 1
            self.scheduler.measure_many([(st, purpose) for st in batch])
            if any(self.cache[st].verdict is not Verdict.UNRESOLVED for st in states[:i]):
                return

    def find_core(self, bad: frozenset[str]) -> frozenset[str]:
        """A minimal set of units that is bad alone, inside the bad set ``bad``."""
        core = self.core = frozenset()
        pool = bad
        start, end = self._first_pair(bad)
        while True:
            passing, failing = self.dd(
                core | start, core | (end if end is not None else pool), Purpose.ISOLATE
            )
            start = frozenset()
            end = None
            delta = failing - passing
            if len(delta) != 1:
                raise self._not_isolated(core, delta, failing)
            core = self.core = core | delta
            rest = passing - core
            self.candidates = core | rest  # until `core` alone is shown slow
            if not rest:
                return core  # `failing` is exactly the core, measured bad
            if self._bad_alone(core, failing, bad):
                return core
            # Good alone: the rest of the cause is inside the last good state; isolate it
            # with the core applied.
            pool = rest
            self.cache.emit(
                EventKind.PHASE, say(Say.NEEDS_MORE_UNITS, units=self.units.sorted(core))
            )

    def _first_pair(self, bad: frozenset[str]) -> tuple[frozenset[str], frozenset[str] | None]:
        """Where isolation inside ``bad`` starts: the largest state inside it already measured
        good (after a first culprit, that skips what its search already cleared) and, with
        several workers, the smallest one above that measured bad (None: ``bad`` itself)."""
        start = max(
            (
                r.state.applied
                for r in self.cache
                if r.verdict is Verdict.GOOD and not r.state.positions and r.state.applied < bad
            ),
            key=len,
            default=frozenset(),
        )
        if self.workers == 1:
            return start, None
        # States measured speculatively along with the endpoints narrow the first pair.
        end = min(
            (
                r.state.applied
                for r in self.cache
                if r.verdict is Verdict.BAD
                and not r.state.positions
                and start < r.state.applied <= bad
            ),
            key=len,
            default=None,
        )
        return start, end

    def _not_isolated(
        self, core: frozenset[str], delta: frozenset[str], failing: frozenset[str]
    ) -> Ambiguous:
        """Why dd stopped short of one unit, with the smallest state known to hold the cause."""
        if self.too_noisy:
            return Ambiguous(
                failing,
                say(
                    Say.TOO_NOISY,
                    states=self.too_noisy,
                    sigma=self.cache.noise().sigma,
                    max_samples=self.scheduler.max_samples,
                ),
            )
        # `failing` is proven slow and holds a whole cause; one of `delta` is part of it, the
        # rest of it (an interaction) may be among the others: shrink those.
        return Ambiguous(
            self._shrink(core | delta, failing),
            say(Say.ALL_UNRESOLVED, units=self.units.sorted(delta)),
        )

    def _bad_alone(
        self, core: frozenset[str], failing: frozenset[str], bad: frozenset[str]
    ) -> bool:
        """Confirm ``core`` alone is slow (True) or fast (False: it needs more units);
        ``Ambiguous`` when that cannot be judged."""
        if self.workers > 1:
            # The two confirmations in one round (the second is wasted if the core turns
            # out to need more units).
            self.scheduler.measure_many(
                [
                    (State.of(core), Purpose.CONFIRM_ALONE),
                    (State.of(bad - core), Purpose.CONFIRM_WITHOUT),
                ]
            )
        v = self.scheduler.measure(State.of(core), Purpose.CONFIRM_ALONE)
        if v is not Verdict.UNRESOLVED:
            return v is Verdict.BAD
        rec = self.cache[State.of(core)]
        found = self._shrink(core, failing)
        why = say(
            Say.UNJUDGED_ALONE,
            core=self.units.sorted(core),
            failure=rec.failure,
            together=self.units.sorted(found - core) if found != core else [],
        )
        raise Ambiguous(found, why)

    def _shrink(self, keep: frozenset[str], bad: frozenset[str]) -> frozenset[str]:
        """A small measured-bad state between ``keep`` and ``bad`` (which is measured bad).

        Used when ``keep`` alone cannot be judged: dd from (keep, bad) treats ``keep`` as the
        good side without proof, but only ever returns a state measured bad, so the result
        still holds a whole cause; it just names far fewer bystanders than ``bad``.
        """
        if keep == bad:
            return bad
        self.cache.emit(EventKind.PHASE, say(Say.NARROWING_CONTEXT, units=self.units.sorted(keep)))
        return self.dd(keep, bad, Purpose.CONTEXT)[1]
