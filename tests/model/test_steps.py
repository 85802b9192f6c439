"""The probe's timed steps as a run's samples, and the time breakdowns (pure)."""

from __future__ import annotations

import statistics

import pytest

from envbisect.model.metric import Measurement
from envbisect.model.steps import StepSamples, breakdown, trial_timing, with_steps


def _facts(times: list[float]) -> dict:
    return {"steps": {"rule": "optimizer", "steps": len(times) + 1, "intervals_s": times}}


def test_the_samples_median_is_the_reported_figure_a_held_up_step_lowers_its_own() -> None:
    # 9 steps of 0.1 s, one held up 10x; the command's figure (over all steps) sinks with it
    times = [0.1] * 8
    times[5] = 1.0
    figure = 1000 / statistics.mean(times)  # 1000 tokens a step
    m = with_steps(Measurement(figure, None, "regex", {"samples": [figure]}), _facts(times), 3)
    assert m.tok_per_s == figure  # the reported figure stays the command's
    assert len(m.samples) == 6  # 8 timed steps, the first third (2) left out
    assert statistics.median(m.samples) == pytest.approx(figure)
    assert min(m.samples) == pytest.approx(figure / 10)  # the held-up step, 10x slower
    assert m.result["samples_from"]["steps_used"] == [4, 9]


def test_a_figure_that_counts_a_compile_before_the_kept_steps_is_what_is_judged() -> None:
    """Found as a user: a script whose figure spans its whole run printed 7.2 Ktok/s on a
    warm cache and 2.3 on a cold one; the kept steps, all after the compile, were read in
    its units as 13.2 and 44.3 Ktok/s and the run said "the full set of changes runs fast"."""
    warm, cold = [0.5, 0.02, 0.02, 0.02, 0.02, 0.02], [12.0, 0.01, 0.01, 0.01, 0.01, 0.01]
    for figure, times in ((7200.0, warm), (2300.0, cold)):
        one = Measurement(figure, None, "regex", {"samples": [figure]})
        assert statistics.median(with_steps(one, _facts(times), 3).samples) == figure


def test_steps_are_used_only_when_the_figure_gave_fewer_samples_than_asked() -> None:
    per_line = Measurement(5.0, None, "regex", {"samples": [4.0, 5.0, 6.0]})
    assert with_steps(per_line, _facts([0.1] * 8), 3) is per_line
    one = Measurement(5.0, None, "regex", {"samples": [5.0]})
    assert with_steps(one, _facts([0.1] * 8), 1) is one  # one sample asked
    assert with_steps(one, _facts([0.1]), 3) is one  # one timed step: fewer than the figure
    assert with_steps(one, None, 3) is one and StepSamples.of({"steps": {}}) is None


def test_a_held_up_step_that_compiled_leaves_the_figure_the_one_sample() -> None:
    # the same steps, the held-up one spent 0.6 of its 1.0 s in torch.compile's backend
    times = [0.1] * 8
    times[5] = 1.0
    ends = [0.0]
    for t in times:
        ends.append(round(ends[-1] + t, 6))
    facts = _facts(times)
    facts["steps"].update(ends_s=ends, compile_spans_s=[[ends[5] + 0.2, ends[5] + 0.8]])
    figure = 1000 / statistics.mean(times)
    m = with_steps(Measurement(figure, None, "regex", {"samples": [figure]}), facts, 3)
    assert m.samples == (figure,)
    used = m.result["samples_from"]
    assert used["from"] == "figure" and used["compiled_steps"] == [7]
    assert m.result["compiled_in_windows"] == {"steps": [7], "compile_s": 0.6}
    # a compile of a tenth of a step is not holding it up: the steps are the samples
    facts["steps"]["compile_spans_s"] = [[ends[5] + 0.2, ends[5] + 0.3]]
    m = with_steps(Measurement(figure, None, "regex", {"samples": [figure]}), facts, 3)
    assert len(m.samples) == 6 and "compiled_in_windows" not in m.result


def test_a_drafter_figure_over_windows_that_compiled_is_not_replaced_by_steps() -> None:
    """Seen on the H100: the drafter's one figure (4.7 Ktok/s, window 1 recompiled) was
    replaced by 18 step samples of 48-74 Ktok/s from its facts."""
    hot = {"windows": [1], "frames": 9}
    result = {"samples": [4702.0], "tok_per_s": 4702.0, "compiled_in_windows": hot}
    m = with_steps(Measurement(4702.0, None, "frame", result), _facts([0.02] * 20), 3)
    assert m.samples == (4702.0,)
    assert m.result["samples_from"]["compiled_windows"] == [1]
    assert (
        "torch compiled during timed window(s) 1 (9 frame(s))" in m.result["samples_from"]["text"]
    )


def test_breakdowns_add_up() -> None:
    facts = {
        "compile": {"compile_s": 2.0},
        "steps": {"first_end_s": 5.0, "last_end_s": 8.0, "at_exit_s": 8.5},
    }
    run = breakdown(10.0, facts)
    assert run == {
        "wall_s": 10.0, "startup_s": 4.5, "compile_s": 2.0, "steps_s": 3.0, "after_s": 0.5
    }  # fmt: skip
    assert breakdown(3.0, None)["startup_s"] is None
    call = {"wall_s": 12.5, "fill_s": 0.0, "runs": [{"wall_s": 10.0, "breakdown": run}]}
    t = trial_timing([call])
    assert t["realize_s"] == 2.5 and t["processes"] == 1 and t["steps_s"] == 3.0


def test_threads_stepping_together_give_windows_of_one_step_each() -> None:
    # three threads, each step 0.3 s but taking turns: thread 0 steps at 0.1, 0.2 (then waits
    # 0.4 s), 0.7, 0.8, ...: its own steps are 0.1 s or 0.5 s. The program's rate is one
    # step every 0.1 s; windows of three merged ends (one step of each) are all 0.3 s.
    merged = [round(0.1 * i, 6) for i in range(1, 31)]
    facts = {
        "steps": {
            "rule": "optimizer",
            "steps": 10,
            "sources": 4,  # a warm-up optimizer stepped once, before the threads
            "beside": 3,
            "intervals_s": [0.1, 0.5] * 4 + [0.1],
            "merged_ends_s": merged,
            "ends_s": [],
        }
    }
    got = StepSamples.of(facts)
    assert got is not None and got.per == 3
    assert got.times == pytest.approx([0.3] * 6)  # 10 window ends, 9 timed, 3 left out
    figure = 3000 / 0.3
    m = with_steps(Measurement(figure, None, "regex", {"samples": [figure]}), facts, 3)
    assert statistics.median(m.samples) == pytest.approx(figure)
    used = m.result["samples_from"]
    assert used["steps_per_sample"] == 3 and used["steps_used"] == [5, 10]
    assert used["text"].startswith("windows 5-10 of 10 timed by the probe (3 optimizers")
    assert "; 1 more stepped only before or after it" in used["rule"]
