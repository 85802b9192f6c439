"""States measured again when their bad verdict rests on samples taken under load."""

from __future__ import annotations

from helpers_search import wire

from envbisect.search.recheck import LoadCheck
from envbisect.search.state import Outcome, State
from envbisect.search.verdict import Verdict


class BusyOnce:
    """Nothing is slow; the first samples of state {"a"} are taken under load, slowly."""

    def __init__(self) -> None:
        self.loaded = True

    def __call__(self, state: State, n: int) -> Outcome:
        if state.applied == {"a"} and self.loaded:
            self.loaded = False
            return Outcome(samples=(300.0,) * n, contended=(True,) * n)
        return Outcome(samples=(1000.0,) * n, contended=(False,) * n)


def setup(enabled: bool):  # type: ignore[no-untyped-def]
    w = wire(["a", "b"], BusyOnce(), threshold=700.0)
    check = LoadCheck(w.cache, w.scheduler, w.units.everything, enabled=enabled)
    w.scheduler.measure(State.of(()), "endpoint: good")
    w.scheduler.measure(State.of(("a",)), "isolate")
    return w, check


def test_a_bad_verdict_under_passing_load_is_measured_again_once() -> None:
    w, check = setup(enabled=True)
    state = State.of(("a",))
    assert w.cache[state].verdict is Verdict.BAD
    assert check.mostly_loaded(w.cache[state])
    assert check.recheck(state)
    assert w.cache[state].verdict is Verdict.GOOD
    assert [n.text() for n in check.notes] == [
        "trial 2 measured again: good at 1.0 Ktok/s, not bad as its samples under load said"
    ]
    assert not check.recheck(state)  # once per state


def test_rechecks_are_off_unless_asked_for() -> None:
    w, check = setup(enabled=False)
    assert not check.recheck(State.of(("a",)))
    assert w.cache[State.of(("a",))].verdict is Verdict.BAD and not check.notes


def test_an_endpoint_under_load_is_measured_again_with_a_note() -> None:
    w = wire(["a"], BusyOnce(), threshold=700.0)
    check = LoadCheck(w.cache, w.scheduler, w.units.everything, enabled=True)
    good = w.scheduler.start(State.of(()), "endpoint: good", 3)
    bad = w.scheduler.start(State.of(("a",)), "endpoint: bad", 3)
    check.endpoints(good, bad)
    assert bad.samples == [1000.0] * 3 and bad.set_aside == [300.0] * 3
    assert [n.text() for n in check.notes] == [
        "the bad endpoint was measured again: its first samples were taken under load; "
        "now 1.0 Ktok/s"
    ]
