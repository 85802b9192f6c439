"""Causes the bad state hides (``search.masked``), found on the H100 (issue 31): the field's
drift, built-in drafter, three threads. The empty cache crashes the threaded command, but
the field's ``is_fx_symbolic_tracing`` patch, part of the same drift, stops the crash: the
bad state ran clean and slow (the grown data), everything but the data ran good, and
``--find-all`` named the data alone. Each remaining group alone on top of good finds the
cache."""

from __future__ import annotations

from envbisect.search import search
from envbisect.search.masked import groups
from envbisect.search.state import Outcome, State, Units

CACHE = ("caches:inductor", "caches:triton")
PATCH = ("files:/w/repo/dflash_model.py", "git:/w/repo")
# In the order the run gave them on the H100 (the diff's sections: files, git, env, data,
# caches): the first split, the patch and the allocator setting, ran good.
UNITS = [*PATCH, "env:PYTORCH_CUDA_ALLOC_CONF", "data:/w/prompts.jsonl", *CACHE]


class PatchedDrift:
    """An empty inductor cache crashes every run unless the patch is applied; the grown
    data makes runs 27 times slower; the allocator setting and the triton cache change
    nothing."""

    def __init__(self) -> None:
        self.calls: list[frozenset[str]] = []

    def __call__(self, state: State, n: int) -> Outcome:
        self.calls.append(state.applied)
        patched = all(u in state.applied for u in PATCH)
        if "caches:inductor" in state.applied and not patched:
            return Outcome(failure="crash: exit 1: RuntimeError: Detected that you are using FX")
        rate = 2000.0 if "data:/w/prompts.jsonl" in state.applied else 56000.0
        return Outcome(samples=(rate,) * n)


def test_groups_are_sections_and_a_repo_with_its_files() -> None:
    rest = frozenset(UNITS) - {"data:/w/prompts.jsonl"}
    assert groups(Units(UNITS), rest) == [
        frozenset(PATCH),
        frozenset({"env:PYTORCH_CUDA_ALLOC_CONF"}),
        frozenset(CACHE),
    ]


def test_find_all_names_a_cause_the_bad_state_hides() -> None:
    world = PatchedDrift()
    res = search(UNITS, world, find_all=True, threshold_fraction=0.7)
    assert res.outcome.value == "found", res.message
    assert [c.units for c in res.culprits] == [("data:/w/prompts.jsonl",), ("caches:inductor",)]
    data, cache = res.culprits
    assert data.hidden_by is None
    assert cache.hidden_by == frozenset(UNITS) - {"data:/w/prompts.jsonl"}
    assert cache.alone.bad.crashes == cache.alone.bad.runs == 5  # its crash rate, told
    assert frozenset(CACHE) in world.calls  # the cache group alone, on top of good
    assert frozenset({"env:PYTORCH_CUDA_ALLOC_CONF"}) in world.calls
    assert frozenset(PATCH) in world.calls
    assert "caches:triton" not in {u for c in res.culprits for u in c.units}


def test_a_cause_isolation_meets_first_is_not_screened_again() -> None:
    world = PatchedDrift()
    units = [*CACHE, "data:/w/prompts.jsonl", "env:PYTORCH_CUDA_ALLOC_CONF", *PATCH]
    res = search(units, world, find_all=True, threshold_fraction=0.7)
    assert [c.units for c in res.culprits] == [("caches:inductor",), ("data:/w/prompts.jsonl",)]
    assert all(c.hidden_by is None for c in res.culprits)


def test_without_find_all_nothing_is_screened() -> None:
    world = PatchedDrift()
    res = search(UNITS, world, threshold_fraction=0.7)
    assert [c.units for c in res.culprits] == [("data:/w/prompts.jsonl",)]
    assert frozenset(CACHE) not in world.calls


def test_the_hidden_causes_rate_runs_go_at_once_after_one_alone() -> None:
    world = PatchedDrift()
    batches: list[tuple[frozenset[str], int]] = []

    def at_once(state: State, runs: int) -> Outcome:
        batches.append((state.applied, runs))
        out = world(state, 1)
        if out.failure:
            return Outcome(failure=out.failure, runs=runs, crashes=runs, rate_only=True)
        return Outcome(runs=runs, rate_only=True)

    res = search(
        UNITS, world, find_all=True, threshold_fraction=0.7, rate_together=4, test_rate=at_once
    )
    cache = res.culprits[-1]
    assert cache.units == ("caches:inductor",)
    assert batches == [(frozenset({"caches:inductor"}), 3)]  # runs 1 and 2 alone, then 3
    assert cache.alone.bad.crashes == cache.alone.bad.runs == 5
    data = res.culprits[0].alone.bad  # ran clean: its rate runs are one after the other
    assert data.failure is None and data.runs == 1
