"""A real training command met on its own terms (issue 46): a small torch trainer in a real
git repo prints its progress the way common trainers do — nanoGPT's ``iter N: … time Xms``,
a tqdm bar's ``it/s`` that turns into ``s/it`` when slow, Hugging Face Trainer's final
``train_samples_per_second``, or nothing at all — and ``run --until 70%`` with no
``--metric-regex`` names the commit that widened the model and its hunk (not the comment
beside it), showing the figure in the log's own unit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers_run import commit_all, git, init_repo
from tests.helpers_user_repo import envbisect

pytestmark = pytest.mark.slow

# Widened by the culprit commit: WIDTH 32 -> 768 (its other hunk only edits a comment).
TRAIN = r'''"""A tiny trainer.

It logs its progress the way FORM says.
"""
import sys, time
import torch

FORM = sys.argv[1]
WIDTH = 32
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
began = time.perf_counter()
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 40
for it in range(STEPS):
    t0 = time.perf_counter()
    loss = model(torch.randn(1024, 64)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    dt = time.perf_counter() - t0
    if FORM == "nanogpt":
        print(f"iter {it}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms, mfu -100.00%")
    elif FORM == "tqdm":
        # A bar over chunks of 200 steps' work: fast states print it/s, slow ones s/it, as
        # tqdm does on either side of one iteration a second.
        rate = 0.005 / dt
        shown = f"{rate:.2f}it/s" if rate >= 1 else f"{1 / rate:.2f}s/it"
        sys.stderr.write(f"\r{100 * it // STEPS}%|####      | {it}/{STEPS} [00:01<00:02, {shown}]")
runtime = time.perf_counter() - began
if FORM == "hf":
    print({"train_runtime": round(runtime, 4),
           "train_samples_per_second": round(STEPS * 1024 / runtime, 3),
           "train_steps_per_second": round(STEPS / runtime, 3), "train_loss": 0.5, "epoch": 1.0})
'''

# One line (nothing below it) so that the comment edit and the width are two hunks.
TRAIN_COMMENT = "It logs its progress the way FORM says.", "It logs its progress as FORM asks."
WIDEN = "WIDTH = 32", "WIDTH = 768"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """ws/repo: four commits, the third widens the model (and rewords a comment); the good
    state is the second commit, the bad one the head."""
    ws = tmp_path_factory.mktemp("forms")
    repo = init_repo(ws / "repo")
    (repo / "train.py").write_text(TRAIN)
    commits = [commit_all(repo, "trainer")]
    (repo / "README.md").write_text("a tiny trainer\n")
    commits.append(commit_all(repo, "readme"))
    text = TRAIN.replace(*TRAIN_COMMENT).replace(*WIDEN)
    (repo / "train.py").write_text(text)
    commits.append(commit_all(repo, "model: wider MLP"))
    (repo / "README.md").write_text("a tiny trainer, wider\n")
    commits.append(commit_all(repo, "readme: say so"))
    config = ws / "envbisect.yaml"
    config.write_text("repos: [repo]\nfiles: [repo/train.py]\nmanifests_dir: manifests\n")
    for label, commit in (("good", commits[1]), ("bad", commits[3])):
        git(repo, "checkout", "-q", commit)
        snap = envbisect(ws, "snapshot", "--python", sys.executable, "--label", label,
                         "-o", f"{label}.yaml")  # fmt: skip
        assert snap.returncode == 0, snap.stderr
    git(repo, "checkout", "-q", "main")
    return {"ws": ws, "repo": repo, "commits": commits}


def _run(
    world: dict[str, object], form: str, *extra: str, steps: int | None = None
) -> tuple[dict, str]:
    ws = world["ws"]
    assert isinstance(ws, Path)
    session = f".envbisect/{form}-{len(extra)}-{steps}"
    res = envbisect(
        ws, "run", "--good", "good.yaml", "--bad", "bad.yaml", "--python", sys.executable,
        "--until", "70%", "--session", str(ws / session), "--json", "-", *extra,
        "--", "python", "repo/train.py", form, *([str(steps)] if steps else []),
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    return json.loads(res.stdout[res.stdout.index("{") :]), out


def _assert_commit_and_hunk(world: dict[str, object], doc: dict, out: str) -> None:
    commits = world["commits"]
    assert isinstance(commits, list)
    (culprit,) = doc["culprits"]
    hunk = culprit["hunk"]
    assert hunk is not None and hunk["commit"] == commits[2], out
    assert "-WIDTH = 32\n+WIDTH = 768\n" in hunk["hunk_text"], out
    assert "FORM" not in hunk["hunk_text"], out  # the comment's hunk is not the cause


@pytest.mark.parametrize(
    ("form", "unit", "said"),
    [
        ("nanogpt", "ms", "an iteration's time (nanoGPT's 'iter N: … time Xms'), in ms"),
        ("tqdm", "it/s", "a progress bar's it/s (tqdm, Lightning), in it/s"),
        ("hf", "samples/s", "Hugging Face Trainer's train_samples_per_second, in samples/s"),
        ("none", "steps/s", "the probe's steps, in steps/s"),
    ],
)
def test_a_log_form_is_read_as_it_is_and_the_commit_and_hunk_named(
    world: dict[str, object], form: str, unit: str, said: str
) -> None:
    doc, out = _run(world, form, steps=300)  # 0.4 s of the good state's steps: a steady figure
    _assert_commit_and_hunk(world, doc, out)
    assert f"figure: {said}" in out
    figure = doc["figure"]
    assert figure["unit"] == unit and figure["lower_is_better"] is (unit == "ms")
    good, bad = figure["good_median"], figure["bad_median"]
    assert (bad > good) if unit == "ms" else (bad < good), figure
    culprit = next(line for line in out.splitlines() if line.startswith("Culprit: "))
    assert culprit.endswith(f" {unit}"), culprit  # the figure in its own unit
    assert "Ktok/s" not in out


def test_a_lower_is_better_regex_is_read_the_right_way_round(world: dict[str, object]) -> None:
    doc, out = _run(world, "nanogpt", "--metric-regex", r"time ([0-9.]+)ms")
    _assert_commit_and_hunk(world, doc, out)
    assert doc["figure"]["unit"] == "ms" and doc["figure"]["lower_is_better"] is True
    assert "figure: " not in out  # typed, not recognized: nothing to say


def test_until_takes_the_figures_own_unit(world: dict[str, object], tmp_path: Path) -> None:
    """``check --until 1ms`` on nanoGPT's log: the good state is good, the widened one bad;
    a token rate given for a figure in ms is refused in one line."""
    ws = world["ws"]
    assert isinstance(ws, Path)
    regex = ["--metric-regex", r"time ([0-9.]+)ms"]
    repo = world["repo"]
    assert isinstance(repo, Path)
    argv = [sys.executable, "-m", "envbisect", "check", "--python", sys.executable, *regex]
    good = subprocess.run(
        [*argv, "--until", "1ms", "--", "python", "repo/train.py", "nanogpt"],
        cwd=ws, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert good.returncode == 1, good.stdout + good.stderr  # head: the widened model
    assert good.stdout.startswith("bad: median ") and " ms > 1 ms" in good.stdout, good.stdout
    wrong = subprocess.run(
        [*argv, "--until", "12k", "--", "python", "repo/train.py", "nanogpt"],
        cwd=ws, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert wrong.returncode == 2
    assert "a token rate, but the command's figure is read in ms" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def _stops(doc: dict) -> list[list[dict]]:
    """Each trial's early stops (trials of the hunk step carry no timing: left out)."""
    return [t["timing"].get("stopped_early") or [] for t in doc["trials"] if t.get("timing")]


def test_a_long_real_run_ends_once_its_rate_is_known(world: dict[str, object]) -> None:
    """nanoGPT's default is 5,000 iterations: a slow state's run ends once its rate is
    known (a fast one's sub-millisecond steps need 1 s of kept steps, most of its run), a
    clean exit (no crash), and the same commit and hunk are named."""
    doc, out = _run(world, "nanogpt", steps=5000)
    _assert_commit_and_hunk(world, doc, out)
    bad = doc["trials"][1]["timing"]["stopped_early"]
    assert bad[-1]["why"].startswith("rate known: ") and bad[-1]["at_step"] < 1500, bad
    assert "stopped at step " in out
    assert [t for t in doc["trials"] if t["failure"]] == []


def test_steps_end_each_run_where_the_user_says(world: dict[str, object]) -> None:
    doc, _out = _run(world, "nanogpt", "--steps", "30", steps=5000)
    stops = _stops(doc)
    assert stops and all(s[-1] == {"at_step": 30, "why": "--steps 30"} for s in stops), stops


def test_a_figure_printed_only_at_exit_keeps_a_typed_regexs_run_whole(
    world: dict[str, object],
) -> None:
    regex = r"train_samples_per_second': ([0-9.]+)"
    doc, out = _run(world, "hf", "--metric-regex", regex, steps=200)
    _assert_commit_and_hunk(world, doc, out)
    stops = _stops(doc)
    assert stops and stops == [[] for _ in stops]  # its figure comes at the end
