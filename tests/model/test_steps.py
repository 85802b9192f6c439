"""The probe's timed steps as a run's samples, and the time breakdowns (pure)."""

from __future__ import annotations

import statistics

import pytest

from envbisect.model.metric import Measurement
from envbisect.model.steps import StepSamples, breakdown, trial_timing, with_steps


def _facts(times: list[float]) -> dict:
    return {"steps": {"rule": "optimizer", "steps": len(times) + 1, "intervals_s": times}}


def test_a_held_up_step_lowers_its_own_sample_not_the_median() -> None:
    # 9 steps of 0.1 s, one held up 10x; the command's figure (over all steps) sinks with it
    times = [0.1] * 8
    times[5] = 1.0
    figure = 1000 / statistics.mean(times)  # 1000 tokens a step
    m = with_steps(Measurement(figure, None, "regex", {"samples": [figure]}), _facts(times), 3)
    assert m.tok_per_s == figure  # the reported figure stays the command's
    assert len(m.samples) == 6  # 8 timed steps, the first third (2) left out
    assert statistics.median(m.samples) == pytest.approx(10_000)  # 1000 tokens / 0.1 s
    assert min(m.samples) == pytest.approx(1000)
    assert m.result["samples_from"]["steps_used"] == [4, 9]


def test_steps_are_used_only_when_the_figure_gave_fewer_samples_than_asked() -> None:
    per_line = Measurement(5.0, None, "regex", {"samples": [4.0, 5.0, 6.0]})
    assert with_steps(per_line, _facts([0.1] * 8), 3) is per_line
    one = Measurement(5.0, None, "regex", {"samples": [5.0]})
    assert with_steps(one, _facts([0.1] * 8), 1) is one  # one sample asked
    assert with_steps(one, _facts([0.1]), 3) is one  # one timed step: fewer than the figure
    assert with_steps(one, None, 3) is one and StepSamples.of({"steps": {}}) is None


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
