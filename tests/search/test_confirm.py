"""Confirmation: everything but the culprit, and what it leaves open."""

from __future__ import annotations

from helpers_oracle import Oracle
from helpers_search import Wired, wire

from envbisect.search.confirm import Confirmation
from envbisect.search.recheck import LoadCheck
from envbisect.search.state import Outcome, State, TestFn
from envbisect.search.verdict import Verdict
from envbisect.search.wording import Say

UNITS = ("a", "b", "c")
ALL = frozenset(UNITS)


def phase(test: TestFn, *, find_all: bool = False) -> tuple[Wired, Confirmation]:
    w = wire(UNITS, test, threshold=6000.0)
    load = LoadCheck(w.cache, w.scheduler, ALL, enabled=False)
    for state in (State.of(()), State.of(UNITS)):
        w.scheduler.measure(state, "endpoint")
    return w, Confirmation(w.cache, w.scheduler, load, ALL, find_all=find_all)


def test_reverting_the_culprit_restores_speed_with_evidence() -> None:
    w, confirm = phase(Oracle(UNITS, (frozenset({"b"}),)))
    w.scheduler.measure(State.of(("b",)), "confirm: alone")
    alone = confirm.alone(frozenset({"b"}))
    assert alone.good.state == State.of(()) and alone.bad.state == State.of(("b",))
    got = confirm.without(frozenset({"b"}), ALL)
    assert got.verdict is Verdict.GOOD and got.without is not None and got.restored is not None
    assert got.restored.good.state == State.of(("a", "c"))
    assert confirm.notes(frozenset({"b"}), ALL, got.verdict) == []


def test_another_cause_keeps_everything_but_the_culprit_slow() -> None:
    w, confirm = phase(Oracle(UNITS, (frozenset({"a"}), frozenset({"c"}))))
    got = confirm.without(frozenset({"a"}), ALL)
    assert got.verdict is Verdict.BAD and got.without is None
    [note] = confirm.notes(frozenset({"a"}), ALL, got.verdict)
    assert note.code is Say.OTHERS_SLOW
    w2, confirm_all = phase(Oracle(UNITS, (frozenset({"a"}), frozenset({"c"}))), find_all=True)
    assert confirm_all.notes(frozenset({"a"}), ALL, Verdict.BAD) == []


def test_a_partial_recovery_is_noted() -> None:
    def partly(state: State, n: int) -> Outcome:
        speed = 12_000.0
        if "a" in state.applied:
            speed /= 3
        if "c" in state.applied:
            speed *= 0.8  # a smaller slowdown, above the threshold
        return Outcome((speed,) * n)

    w, confirm = phase(partly)
    got = confirm.without(frozenset({"a"}), ALL)
    assert got.verdict is Verdict.GOOD
    [note] = confirm.notes(frozenset({"a"}), ALL, got.verdict)
    assert note.text() == (
        "reverting it brings back 9.6 Ktok/s, not the good state's 12.0 Ktok/s: smaller "
        "slowdowns stay above the threshold (a higher threshold and --find-all would isolate "
        "them)"
    )
