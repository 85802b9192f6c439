"""When the probe ends a long run (``agent/probe_stop.py``, issue 46): once its rate is known,
never while it compiles, never before the log's own figure has lines, and at --steps or
--max-trial-s whatever the rule says. The rule as a pure function over step ends."""

from __future__ import annotations

import io
import time

import pytest

from envbisect.agent import probe_stop

RULE = {"min_steps": 20, "min_kept_s": 0.0, "tolerance": 0.03, "min_lines": 6}


def _ends(n: int, step: float = 0.01, jitter: float = 0.0, t0: float = 1.0) -> list[float]:
    out, t = [], t0
    for i in range(n):
        t += step * (1 + (jitter if i % 2 else -jitter))
        out.append(t)
    return out


@pytest.fixture(autouse=True)
def _fresh() -> None:
    probe_stop.STOP.update(rule=None, fn=None, lines=0, said=None)


def test_steady_steps_stop_once_twenty_are_kept() -> None:
    assert probe_stop._why(RULE, _ends(29), [], time.perf_counter()) is None  # 19 kept
    why = probe_stop._why(RULE, _ends(30), [], time.perf_counter())
    assert why is not None and why.startswith("rate known: 20 steps, median within ±0.0%")


def test_kept_steps_must_span_the_least_time() -> None:
    rule = dict(RULE, min_kept_s=1.0)
    assert probe_stop._why(rule, _ends(60, step=0.01), [], time.perf_counter()) is None
    assert probe_stop._why(rule, _ends(200, step=0.01), [], time.perf_counter()) is not None


def test_noisy_steps_run_on_until_the_median_is_known() -> None:
    noisy = _ends(32, jitter=0.1)
    assert probe_stop._why(RULE, noisy, [], time.perf_counter()) is None
    assert probe_stop._why(RULE, _ends(400, jitter=0.1), [], time.perf_counter()) is not None


def test_a_compile_inside_the_kept_steps_holds_the_run() -> None:
    ends = _ends(60)
    recompiled = [(ends[50] - 0.005, ends[50])]  # a new shape at step 51
    assert probe_stop._why(RULE, ends, recompiled, time.perf_counter()) is None
    later = _ends(200)
    assert probe_stop._why(RULE, later, [(later[50] - 0.005, later[50])], 0.0) is not None


def test_a_typed_figure_needs_its_lines_a_recognized_one_may_have_none() -> None:
    typed = dict(RULE, patterns=["x"], require_lines=True)
    assert probe_stop._why(typed, _ends(40), [], time.perf_counter()) is None
    probe_stop.STOP["lines"] = 6
    assert probe_stop._why(typed, _ends(40), [], time.perf_counter()) is not None
    probe_stop.STOP["lines"] = 0
    forms = dict(RULE, patterns=["x"], require_lines=False)
    assert probe_stop._why(forms, _ends(40), [], time.perf_counter()) is not None
    probe_stop.STOP["lines"] = 2  # its lines have begun: wait for enough of them
    assert probe_stop._why(forms, _ends(40), [], time.perf_counter()) is None


def test_steps_and_max_trial_s_end_the_run_whatever_the_rule() -> None:
    noisy = _ends(10, jitter=0.4)
    assert probe_stop._why(dict(RULE, max_steps=10), noisy, [], 0.0) == "--steps 10"
    assert probe_stop._why(dict(RULE, max_s=0.5), noisy, [], time.perf_counter() - 1) == (
        "--max-trial-s 0.5"
    )


def test_the_figures_lines_are_counted_as_they_are_written() -> None:
    import re

    out = io.StringIO()
    counting = probe_stop._Counting(out, [re.compile(r"time ([0-9.]+)ms")])
    counting.write("iter 1: time 3.1ms\niter 2: time 3.0ms\n")
    counting.write("\r 50%|##  | 2/4 [00:01<00:01, 2.0it/s]")
    assert probe_stop.STOP["lines"] == 2
    assert out.getvalue().startswith("iter 1: time 3.1ms")


def test_a_rank_of_several_is_never_ended_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    probe_stop.configure({"stop": dict(RULE)}, lambda why: None)
    assert probe_stop.STOP["rule"] is None
