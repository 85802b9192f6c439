"""Intermittent crashes as a rate: the estimate at the bad endpoint, the clean runs every
other state gets, and how trials say it (engine with a seeded oracle; pure, no I/O)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from envbisect.search import Event, Outcome, SearchOutcome, State, search
from envbisect.search.crashrate import (
    CrashRate,
    clear_confidence,
    runs_to_clear,
)

UNITS = [f"u{i}" for i in range(8)]


class Intermittent:
    """Every process of a state holding ``culprit`` crashes with ``rate`` (seeded); a call
    is one process, two for an endpoint asked for more than one sample."""

    def __init__(self, culprit: str, rate: float, seed: int) -> None:
        self.culprit, self.rate, self.rng = culprit, rate, random.Random(seed)
        self.calls: list[tuple[State, int]] = []

    def __call__(self, state: State, n: int) -> Outcome:
        self.calls.append((state, n))
        endpoint = not state.applied or len(state.applied) == len(UNITS)
        procs = 2 if endpoint and n > 1 else 1
        samples: list[float] = []
        for k in range(procs):
            if self.culprit in state.applied and self.rng.random() < self.rate:
                return Outcome(tuple(samples), failure="crash: RuntimeError", runs=k + 1)
            samples += [5000.0 + self.rng.random()] * (n // procs or 1)
        return Outcome(tuple(samples), runs=procs)


def test_the_rate_its_lower_bound_and_the_runs_that_clear_a_state() -> None:
    two_of_six = CrashRate(2, 6)
    assert two_of_six.describe() == "crashed 2 of 6" and two_of_six.intermittent
    assert 0 < two_of_six.lower() < two_of_six.rate
    assert not CrashRate(1, 5).estimated() and CrashRate(3, 10).estimated()
    assert CrashRate(3, 3).estimated()  # a steady crash: no need to go on
    assert not CrashRate(3, 5).estimated()  # three quick crashes may overstate a rare one
    assert CrashRate(0, 24).estimated()  # a rate that low is estimated by its runs
    # (1 - lower)^runs <= 1 - confidence: a state crashing like it shows in that many runs
    for crash in (CrashRate(3, 9), CrashRate(3, 24), CrashRate(3, 3)):
        runs = runs_to_clear(crash, 0.95)
        assert (1 - crash.lower()) ** runs <= 0.05 < (1 - crash.lower()) ** (runs - 1)
    assert runs_to_clear(CrashRate(3, 9), clear_confidence(8)) > runs_to_clear(CrashRate(3, 9))


@pytest.mark.parametrize("rate", [1 / 3, 1 / 8])
def test_an_intermittent_crash_is_found_and_every_clean_state_is_cleared(rate: float) -> None:
    events: list[Event] = []
    oracle = Intermittent("u5", rate, seed=11)
    result = search(UNITS, oracle, crash_runs=40, progress=events.append)
    assert result.outcome is SearchOutcome.FOUND
    assert [c.units for c in result.culprits] == [("u5",)]
    bad = result.trials[1]
    assert bad.crashes >= 3 or bad.runs >= 24
    needed = runs_to_clear(bad.crash_rate, clear_confidence(len(UNITS)))
    for t in result.trials:
        if t.crashes:
            assert "u5" in t.state.applied and t.verdict.value == "bad"
        else:
            assert t.runs >= needed, t  # a clean state ran until the rate would have shown
    said = [e.message for e in events]
    assert any(f"crashed {bad.crashes} of {bad.runs}" in m for m in said)
    assert any(f"after {needed} clean runs" in m for m in said)
    assert bad.as_dict()["crashes"] == bad.crashes and bad.as_dict()["runs"] == bad.runs


def test_a_state_that_crashed_once_is_bad_and_a_steady_crash_costs_little() -> None:
    oracle = Intermittent("u2", 1.0, seed=1)  # crashes every time
    result = search(UNITS, oracle)
    assert [c.units for c in result.culprits] == [("u2",)]
    bad = result.trials[1]
    assert (bad.crashes, bad.runs) == (3, 3)
    # 3 of 3: every clean state needs only a few runs
    assert max(t.runs for t in result.trials if not t.crashes) <= runs_to_clear(
        CrashRate(3, 3), clear_confidence(len(UNITS))
    )


def test_skip_means_no_rate_is_estimated() -> None:
    oracle = Intermittent("u2", 1.0, seed=1)
    result = search(UNITS, oracle, on_failure="skip")
    assert result.outcome is not SearchOutcome.FOUND
    assert all(t.runs <= 2 for t in result.trials)


def test_without_crash_runs_a_bad_endpoint_that_runs_clean_is_not_reproduced() -> None:
    oracle = Intermittent("u2", 0.0001, seed=3)
    result = search(UNITS, oracle)
    assert result.outcome is SearchOutcome.NOT_REPRODUCED
    assert result.trials[1].runs <= 9  # only what the noise model asked for
    looked = search(UNITS, Intermittent("u2", 0.0001, seed=3), crash_runs=40)
    assert looked.outcome is SearchOutcome.NOT_REPRODUCED and looked.trials[1].runs == 40


# A real command that crashes in one run of three while EB_FLAKY is set (a counter file
# beside it stands in for the race's timing), else runs at one speed.
FLAKY = r"""
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
n = int(os.environ.get("ENVBISECT_SAMPLES", "1"))
if os.environ.get("EB_FLAKY"):
    path = os.path.join(here, "count")
    count = int(open(path).read()) + 1 if os.path.exists(path) else 1
    open(path, "w").write(str(count))
    if count % 3 == 0:
        sys.exit("RuntimeError: Detected that you are using FX to symbolically trace")
with open(os.environ["ENVBISECT_RESULT"], "w") as fh:
    json.dump({"ok": True, "tok_per_s": 1000.0, "samples": [1000.0 + k for k in range(n)]}, fh)
"""


@pytest.mark.slow
def test_run_says_the_crash_rate_per_trial(tmp_path: Path) -> None:
    import json
    import sys

    from click.testing import CliRunner

    from envbisect.cli import cli
    from tests.helpers_run import manifest

    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    good = manifest(tmp_path / "good.yaml", env={})
    bad = manifest(tmp_path / "bad.yaml", env={"EB_FLAKY": "1", "EB_HARMLESS": "1"})
    (tmp_path / "envbisect.yaml").write_text("{}\n")
    out = tmp_path / "r.json"
    argv = [
        "run", "--config", str(tmp_path / "envbisect.yaml"), "--python", sys.executable,
        "--good", str(good), "--bad", str(bad), "--session", str(tmp_path / "session"),
        "--json", str(out), "--report", str(tmp_path / "report.md"), "--crash-runs", "6",
        "--", sys.executable, str(script),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, argv, standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0, res.output
    doc = json.loads(out.read_text())
    assert [c["unit"] for c in doc["culprits"]] == ["env:EB_FLAKY"]
    bad_row = doc["trials"][1]
    assert bad_row["crashes"] >= 3 and bad_row["crash_rate"] == (
        f"crashed {bad_row['crashes']} of {bad_row['runs']}"
    )
    clean = [t for t in doc["trials"] if not t["crashes"]]
    assert clean and all(t["runs"] > 3 for t in clean)  # cleared, not judged on one run
    assert bad_row["crash_rate"] in res.stderr  # progress
    assert bad_row["crash_rate"] in (tmp_path / "report.md").read_text()  # table
