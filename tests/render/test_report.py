"""report.py: the trial table, evidence lines, the markdown report and the JSON document."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envbisect.cli import cli
from envbisect.diff import diff_manifests
from envbisect.model import manifest as mf
from envbisect.render.culprit import culprit_sentence
from envbisect.render.report import as_json, explain_trial, render_markdown, trial_table
from envbisect.run.launch import SmokeCommand
from envbisect.run.result import Culprit, RunResult, TrialRow
from tests.helpers_run import Scenario, build_wheel, freeze, make_venv, pkg


def _rows(units: list[str]) -> list[TrialRow]:
    return [
        TrialRow(1, (), (12000.0,) * 3, 12000.0, "good", purpose="endpoint: good"),
        TrialRow(2, tuple(units), (4000.0,) * 3, 4000.0, "bad", purpose="endpoint: bad"),
        TrialRow(
            3,
            tuple(units[:2]),
            (11900.0, 12100.0, 12000.0),
            12000.0,
            "unresolved",
            purpose="isolate",
        ),
        TrialRow(
            4,
            (units[0],),
            (21000.0,) * 3,
            21000.0,
            "good",
            purpose="confirm: alone",
            outlier="1.75× faster than the good state",
        ),
    ]


UNITS = [
    "env:DFLASH_VERIFY",
    "files:/root/dflash/configs/drafter.yaml",
    "packages:transformers",
    "git:/root/dflash",
]


def test_long_applied_lists_are_never_cut_off() -> None:
    """Found 6: the applied column was cut off (`env:DFLASH_VERIFY, fil…`)."""
    table = trial_table(_rows(UNITS))
    assert "…" not in table
    assert "[1] env:DFLASH_VERIFY" in table and "[4] packages:transformers" in table
    assert "[1] [2] [4] [3]" in table  # trial 2 applies all four, in their order
    md = trial_table(_rows(UNITS), fmt="github")
    assert "- [2] `files:/root/dflash/configs/drafter.yaml`" in md
    short = trial_table(_rows(["env:A", "env:B"]))
    assert "env:A, env:B" in short and "[1]" not in short
    assert "outlier: 1.75× faster than the good state" in table


def test_every_evidence_line_says_what_the_trial_was_and_what_it_means() -> None:
    lines = [explain_trial(r, {"env:DFLASH_VERIFY"}) for r in _rows(UNITS)]
    assert lines[0] == (
        "- trial 1 (the good state as recorded, nothing applied): median 12.0 Ktok/s → "
        "good: at or above the threshold"
    )
    assert "unresolved: within the noise of the threshold, so it counts neither way" in lines[2]
    assert "; with the culprit" in lines[2]
    assert "**outlier: 1.75× faster than the good state**" in lines[3]
    unfaithful = TrialRow(
        5,
        ("env:A",),
        (),
        None,
        "unresolved",
        failure="state not faithful: env A",
        purpose="isolate",
    )
    assert explain_trial(unfaithful, set()).endswith(
        "unresolved: state not faithful: env A, so it counts neither way"
    )


def _result(tmp_path: Path) -> RunResult:
    good = mf.load(Path("fixtures/diff/seed/good.yaml").absolute())
    bad = mf.load(Path("fixtures/diff/seed/bad.yaml").absolute())
    diff = diff_manifests(good, bad)
    unit = diff.unit("env:PYTORCH_CUDA_ALLOC_CONF")
    return RunResult(
        outcome="found",
        threshold=8000.0,
        culprits=(Culprit(unit, good_median=12000.0, bad_median=4000.0, bad_trial=2),),
        trials=tuple(_rows(UNITS)),
        diff=diff,
        blocked={},
        notes=(),
        session=tmp_path / "s",
        message="culprit: env:PYTORCH_CUDA_ALLOC_CONF",
        good_path=Path("good.yaml"),
        bad_path=Path("bad.yaml"),
        smoke=SmokeCommand(("python", "train.py")),
        threshold_source="--until-ktoks 8k",
        machine={
            "cpu": "AMD EPYC",
            "cpus": 16,
            "gpu": "1× NVIDIA H200",
            "driver": "580.1",
            "torch": "2.11.0+cu130",
            "cuda": "13.0",
            "python": "3.12.3",
            "load": "1.00",
        },
    )


def test_the_markdown_report_has_a_header_no_cli_text_and_a_next_line(tmp_path: Path) -> None:
    md = render_markdown(_result(tmp_path))
    assert (
        "- machine: CPU AMD EPYC ×16; GPU 1× NVIDIA H200, driver 580.1; torch 2.11.0+cu130 "
        "(CUDA 13.0); python 3.12.3; load 1.00" in md
    )
    assert "- threshold: good means ≥ 8,000 tok/s (8.0 Ktok/s), from --until-ktoks 8k" in md
    assert "--all" not in md  # no CLI text pasted into markdown
    head = md.index("### Changes between the two states")
    assert md[head:].split("\n")[2].startswith("**")  # the diff summary, not another heading
    assert "### Next\n\nThe culprit alone, on this machine:\n\n```\n" in md
    assert "env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py" in md
    assert "envbisect run --good good.yaml --bad bad.yaml --until-ktoks 8000" in md


def test_the_json_document_names_its_schema_and_flags_outliers(tmp_path: Path) -> None:
    doc = as_json(_result(tmp_path))
    assert doc["schema"] == "envbisect/run@1"
    assert doc["outliers"] == [{"trial": 4, "outlier": "1.75× faster than the good state"}]
    assert doc["trials"][3]["outlier"] == "1.75× faster than the good state"
    assert doc["next"].startswith("env PYTORCH_CUDA_ALLOC_CONF=")


def test_outliers_are_states_beyond_either_endpoint_by_more_than_the_noise() -> None:
    """Found 2: a state ran 1.8× faster than the good state and nothing noticed."""
    from envbisect.run.result import outlier

    good, bad = [18000.0, 18500.0, 17600.0], [9000.0, 9100.0, 8800.0]
    assert outlier([31000.0, 29000.0, 33000.0], good, bad, 0.03) == (
        "1.72× faster than the good state"
    )
    assert outlier([4000.0, 4100.0, 3900.0], good, bad, 0.03) == "2.25× slower than the bad state"
    assert outlier([18800.0, 19000.0, 18700.0], good, bad, 0.03) is None  # within the noise
    assert outlier([21000.0] * 3, good, bad, 0.30) is None  # a noisy machine: not beyond it
    # Found as a user, one core kept busy: the bad state's own code flagged 1.57x slower
    # than the bad state. Taken mostly under load, a state is not flagged; half is mostly.
    slow = [5700.0, 5800.0, 5600.0]
    assert outlier(slow, good, bad, 0.03, (True, True, False)) is None
    assert outlier(slow, good, bad, 0.03, (True, False, False)) == (
        "1.58× slower than the bad state"
    )
    # Found as a user next: the good state's own code flagged 1.62x faster than the good
    # state, each trial one process of 26 timed steps (spread 0.3): as independent samples
    # the medians' error was tiny; one process each, it is not beyond the noise.
    steps = [176.0 * f for f in (0.7, 0.8, 0.9, 1.0, 1.0, 1.1, 1.3, 1.5) * 3]
    fast = [x * 1.62 for x in steps]
    assert outlier(fast, steps, [], 0.3) == "1.62× faster than the good state"
    assert outlier(fast, steps, [], 0.3, runs=(1, 1, 0)) is None
    assert outlier(fast, steps, [], 0.3, runs=(12, 12, 0)) == "1.62× faster than the good state"


@pytest.mark.slow
def test_the_next_command_run_by_a_shell_makes_the_culprit_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run names ebwork 1.0 → 3.0; its Next, run by bash on a fresh target venv in
    the good state and then in the bad state, leaves exactly the culprit state's packages:
    ebwork 3.0 (the culprit), ebonly kept (removed in bad, not the culprit), ebnew gone
    (added in bad, not the culprit) — and runs the workload with the target's python."""
    sc = Scenario(tmp_path)
    build_wheel(sc.wheels, "ebnew", "1.0", "N = 1\n")
    sc.venv("ebwork==3.0", "ebnew==1.0")
    git = sc.git_entry(sc.commits[0])
    sc.write(
        good={"packages": {"ebwork": pkg("1.0"), "ebonly": pkg("1.0")}, "git": git},
        bad={"packages": {"ebwork": pkg("3.0"), "ebnew": pkg("1.0")}, "git": git},
        loose_good=b"lr = 0.1\n",
        loose_bad=b"lr = 0.1\n",
    )
    out = tmp_path / "result.json"
    monkeypatch.chdir(sc.repo)  # the user types the command from their repo
    res = CliRunner().invoke(
        cli,
        [
            "run",
            "--config",
            str(sc.config),
            "--python",
            sc.python,
            "--session",
            str(tmp_path / "session"),
            "--json",
            str(out),
            "--bad",
            str(sc.bad),
            "--",
            "python",
            "train.py",
        ],
        standalone_mode=False,
        catch_exceptions=False,
    )
    doc = json.loads(out.read_text())
    assert res.return_value == 0, res.output
    assert [c["unit"] for c in doc["culprits"]] == ["packages:ebwork"]
    nxt = doc["next"]
    assert f"uv pip uninstall --python {sc.python} ebnew && " in nxt
    assert f"--default-index {sc.index.as_uri()} --find-links {sc.wheels}" in nxt
    assert nxt.endswith(f"&& cd {sc.repo} && {sc.python} train.py")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for state in (("ebwork==1.0", "ebonly==1.0"), ("ebwork==3.0", "ebnew==1.0")):
        shutil.rmtree(sc.target)
        make_venv(sc.target, sc.wheels, *state)
        proc = subprocess.run(
            ["bash", "-c", nxt],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        assert "tok/s" in proc.stdout
        assert freeze(sc.target).split() == ["ebonly==1.0", "ebwork==3.0"], state


def test_a_culprit_without_a_figure_of_its_own_says_its_slowdown_with_the_rest() -> None:
    unit = _result(Path("/nonexistent")).culprits[0].unit
    c = Culprit(unit, with_rest=(57_500.0, 5_600.0), crash="crashed 3 of 5 (good: 0 of 1): X")
    line = culprit_sentence(c, None, None)
    assert line.endswith(
        "— 57.5 → 5.6 Ktok/s with the rest of the change — crashed 3 of 5 (good: 0 of 1): X"
    ), line
    assert "with the rest" not in culprit_sentence(c, 60_000.0, 6_000.0)


def test_found_causes_say_which_other_units_a_good_trial_cleared(tmp_path: Path) -> None:
    """The H100's field drift (sixth session): the data and the emptied inductor cache were
    named, and nothing said the patch, the repo, the allocator setting were innocent, which
    the trials had shown (trials 7 and 8 good), nor that the triton cache was only ever run
    beside a culprit."""
    import dataclasses

    base = _result(tmp_path)
    data, cache = (
        base.diff.unit("data:/root/data/prompts-v2.jsonl"),
        base.diff.unit("caches:inductor"),
    )
    patch, repo = "files:/root/models/dflash-drafter/modeling_dflash.py", "git:/root/dflash@2"
    alloc, triton = "env:PYTORCH_CUDA_ALLOC_CONF", "packages:transformers"
    every = (data.id, cache.id, patch, repo, alloc, triton)
    rows = [
        TrialRow(1, (), (62100.0,), 62100.0, "good", purpose="endpoint: good"),
        TrialRow(2, every, (6900.0,), 6900.0, "bad", purpose="endpoint: bad"),
        TrialRow(3, (patch, repo, alloc), (61900.0,), 61900.0, "good", runs=16),
        TrialRow(5, (data.id,), (1900.0,), 1900.0, "bad", runs=5, crashes=3),
        TrialRow(6, (cache.id, triton, patch, repo, alloc), (54600.0,), 54600.0, "good"),
        TrialRow(7, (patch, repo), (54800.0,), 54800.0, "good"),
        TrialRow(8, (alloc,), (56300.0,), 56300.0, "good"),
        TrialRow(10, (cache.id,), (), None, "bad", runs=5, crashes=4),
    ]
    result = dataclasses.replace(
        base, culprits=(Culprit(data), Culprit(cache, hidden=True)), trials=tuple(rows)
    )
    lines = render_markdown(result)
    assert (
        "Not causes (a trial with them and without the culprits was good): "
        f"{patch}, {repo[:-2]} (good in trial 7, 54.8 Ktok/s); {alloc} (good in trial 8, "
        "56.3 Ktok/s)" in lines
    )
    assert f"Not judged apart from a culprit (no trial held them without one): {triton}" in lines
    doc = as_json(result)
    assert {c["unit"]: c["good_trial"] for c in doc["not_causes"]} == {
        patch: 7,
        repo[:-2]: 7,
        alloc: 8,
    }
    assert doc["not_judged_apart"] == [triton]
    # no culprit, no such line: the other units are not "not causes" of nothing
    none = dataclasses.replace(result, culprits=(), outcome="not-reproduced")
    assert "Not causes" not in render_markdown(none) and as_json(none)["not_causes"] == []


def test_a_repo_cleared_beside_its_own_culprit_file_says_what_of_it_was_cleared(
    tmp_path: Path,
) -> None:
    """A user's run (tenth session): the culprit a commit of train.py in their repo, then
    "Not causes: git:<that repo>", which read as the repo's history being innocent."""
    import dataclasses

    from envbisect.model.changes import Unit

    base = _result(tmp_path)
    train = Unit("files:/u/proj/train.py", "files", "/u/proj/train.py", (), True)
    rows = [
        TrialRow(1, (), (800.0,), 800.0, "good", purpose="endpoint: good"),
        TrialRow(2, (train.id, "git:/u/proj", "git:/u/other"), (200.0,), 200.0, "bad"),
        TrialRow(3, ("git:/u/proj", "git:/u/other"), (790.0,), 790.0, "good"),
        TrialRow(4, (train.id,), (210.0,), 210.0, "bad"),
    ]
    result = dataclasses.replace(base, culprits=(Culprit(train),), trials=tuple(rows))
    from envbisect.render.culprit import not_cause_lines

    line = next(ln for ln in not_cause_lines(result) if "Not causes" in ln)
    assert (
        "git:/u/other, git:/u/proj (the rest of its checkout; the culprit's file is a unit of "
        "its own) (good in trial 3" in line
    ), line


def test_a_package_step_state_counts_as_its_unit_among_the_not_causes(tmp_path: Path) -> None:
    """``torch-stack[triton]`` (a state of the package step) is the torch stack, as the trial
    table's legend reads it: not a unit of its own that no trial cleared."""
    import dataclasses

    base = _result(tmp_path)
    rows = (
        TrialRow(1, (), (12000.0,), 12000.0, "good"),
        TrialRow(2, ("env:PYTORCH_CUDA_ALLOC_CONF", "torch-stack"), (4000.0,), 4000.0, "bad"),
        TrialRow(3, ("torch-stack[triton]",), (11900.0,), 11900.0, "good"),
    )
    found = dataclasses.replace(base, trials=rows).not_causes()
    assert [(t.index, units) for t, units in found.cleared] == [(3, ("torch-stack",))]
    assert found.untried == () and found.unsettled == ()


def test_a_unit_held_without_a_culprit_only_in_an_unresolved_trial_is_not_cleared(
    tmp_path: Path,
) -> None:
    """Found as a user through --via (session 7): the grown data was held without the
    culprit cache only in trial 5, unresolved (5.2 Ktok/s against a good 6.6), and the
    result said "no trial held them without one", which trial 5 had."""
    import dataclasses

    base = _result(tmp_path)
    data, cache = "data:/root/data/prompts-v2.jsonl", base.diff.unit("caches:inductor")
    alloc = "env:PYTORCH_CUDA_ALLOC_CONF"
    rows = (
        TrialRow(1, (), (6600.0,), 6600.0, "good", purpose="endpoint: good"),
        TrialRow(2, (cache.id, data, alloc), (2400.0,), 2400.0, "bad", purpose="endpoint: bad"),
        TrialRow(4, (alloc,), (5500.0,), 5500.0, "good"),
        TrialRow(5, (data, alloc), (5200.0,), 5200.0, "unresolved"),
        TrialRow(7, (cache.id,), (1700.0,), 1700.0, "bad"),
    )
    result = dataclasses.replace(base, culprits=(Culprit(cache),), trials=rows)
    found = result.not_causes()
    assert [(t.index, u) for t, u in found.unsettled] == [(5, (data,))]
    assert found.untried == ()
    lines = render_markdown(result)
    assert (
        "Not cleared (without the culprits only in trials not judged good): "
        f"{data} (unresolved in trial 5, 5.2 Ktok/s)" in lines
    )
    assert "Not judged apart" not in lines
    assert as_json(result)["not_settled"] == [
        {"unit": data, "trial": 5, "verdict": "unresolved", "median_tok_per_s": 5200.0}
    ]


def test_next_covers_every_culprit_and_reproduce_keeps_the_runs_options(tmp_path: Path) -> None:
    """Found as a user: a --find-all run's report reproduced without --find-all, and its
    Next showed the first of two culprits only."""
    import dataclasses

    from envbisect.run.context import target_args
    from envbisect.run.options import RunOptions

    result = _result(tmp_path)
    second = result.diff.unit("git:/root/dflash")
    later = Culprit(second, good_median=12000.0, bad_median=6000.0, commit="0123456789abcd")
    both = (*result.culprits, later)
    smoke = SmokeCommand(("python", "train.py"), steps=30)
    options = RunOptions(good=Path("good.yaml"), bad=Path("bad.yaml"), smoke=smoke,
                         python="python3", find_all=True)  # fmt: skip
    result = dataclasses.replace(result, culprits=both, target_args=target_args(options))
    md = render_markdown(result)
    assert "The culprit env:PYTORCH_CUDA_ALLOC_CONF alone, on this machine:" in md
    assert "The culprit git:/root/dflash alone, on this machine:" in md
    assert "envbisect run --python python3 --find-all --steps 30 --good good.yaml" in md


def test_a_figure_in_its_own_unit_is_reproduced_in_it(tmp_path: Path) -> None:
    import dataclasses

    from envbisect.model.units import Unit, showing

    result = dataclasses.replace(_result(tmp_path), threshold=1 / 0.150)  # 150 ms a step
    with showing(Unit("ms", 1e-3, lower_is_better=True)):
        md = render_markdown(result)
        doc = as_json(result)
    assert "--until 150ms" in md
    assert doc["figure"]["unit"] == "ms" and doc["figure"]["threshold"] == 150.0
    assert "Ktok/s" not in md.split("### Changes between the two states")[0]
