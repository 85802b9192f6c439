"""Nothing compiled twice: a whole ``envbisect run`` on a user's repo (real git, real torch
on CPU), where trials whose compiled code is the same share one compile cache and a trial
whose compiled code changed gets its own (``envbisect.run.compilecache``); each trial's
samples come from one process and its time is broken down (``envbisect.model.steps``)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from envbisect.realize.actuate import Realized
from envbisect.run.compilecache import CompileCaches, defpath, source_sha
from tests.helpers_run import commit_all, init_repo
from tests.helpers_user_repo import envbisect

pytestmark = pytest.mark.slow

MODEL = """import torch

WORK = {work}
W = torch.randn(512, 512) / 23


@torch.compile(backend="eager")
def block(x):
    for _ in range(WORK):
        x = torch.tanh(x @ W)
    return x
"""

TRAIN = """import hashlib, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import model

LR = {lr}
print("cache_dir=" + os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""))
with open(model.__file__, "rb") as fh:
    print("model=" + hashlib.sha256(fh.read()).hexdigest()[:12])
torch.manual_seed(0)
lin = torch.nn.Linear(512, 512)
opt = torch.optim.SGD(lin.parameters(), lr=LR)
x = torch.randn(256, 512)
began = time.perf_counter()
for _ in range(8):
    loss = model.block(lin(x)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("throughput: %.1f tok/s" % (8 * x.numel() / (time.perf_counter() - began)))
"""

METRIC = r"throughput: ([0-9.]+) tok/s"


def _world(tmp: Path) -> tuple[Path, Path, list[str]]:
    ws = tmp / "ws"
    repo = init_repo(ws / "repo")
    (repo / "model.py").write_text(MODEL.format(work=1))
    (repo / "train.py").write_text(TRAIN.format(lr="1e-3"))
    commits = [commit_all(repo, "first")]
    (ws / "envbisect.yaml").write_text(yaml.safe_dump({"repos": [str(repo)]}))
    snap = envbisect(ws, "snapshot", "-o", "good.yaml", "--python", sys.executable)
    assert snap.returncode == 0, snap.stderr
    (repo / "train.py").write_text(TRAIN.format(lr="2e-3"))  # not compiled: shares
    commits.append(commit_all(repo, "train: raise the learning rate"))
    (repo / "model.py").write_text(MODEL.format(work=30))  # compiled code changed
    commits.append(commit_all(repo, "model: deeper block"))
    (repo / "train.py").write_text(TRAIN.format(lr="2e-3") + "# done\n")
    commits.append(commit_all(repo, "train: a comment"))
    snap = envbisect(ws, "snapshot", "-o", "bad.yaml", "--python", sys.executable)
    assert snap.returncode == 0, snap.stderr
    return ws, repo, commits


def _printed(trial_dir: Path, name: str) -> set[str]:
    out = set()
    for path in trial_dir.glob("run-*.stdout"):
        out.update(re.findall(rf"^{name}=(.*)$", path.read_text(), re.MULTILINE))
    return out


def test_same_compiled_code_shares_one_cache_and_changed_code_does_not(tmp_path: Path) -> None:
    ws, repo, commits = _world(tmp_path)
    res = envbisect(
        ws,
        "run", "--good", "good.yaml", "--bad", "bad.yaml", "--python", sys.executable,
        "--session", "sess", "--metric-regex", METRIC, "--until", "50%", "--json", "-",
        "--report", "report.md",
        "--", "python", "repo/train.py",
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    doc = json.loads(res.stdout[res.stdout.index("{") :])
    assert doc["culprits"][0]["commit"] == commits[2], out

    by_trial: dict[int, dict] = {}
    for row in doc["trials"]:
        trial_dir = ws / "sess" / "trials" / f"{row['index']:03d}"
        [cache] = {json.dumps(c) for c in row["timing"]["compile_cache"]}
        cache = json.loads(cache)
        # the runs really ran with the cache the trial log names
        assert _printed(trial_dir, "cache_dir") == {cache["dir"] + "/inductor"}, out
        [model] = _printed(trial_dir, "model")
        by_trial[row["index"]] = {"model": model, "cache": cache, "row": row}

    dirs_by_model: dict[str, set[str]] = {}
    for t in by_trial.values():
        dirs_by_model.setdefault(t["model"], set()).add(t["cache"]["dir"])
    # one cache per compiled code: the same model.py, one dir; a changed one, another dir
    assert len(dirs_by_model) == 2 and all(len(d) == 1 for d in dirs_by_model.values()), out
    assert len({d for ds in dirs_by_model.values() for d in ds}) == 2, out
    # the learning-rate commit (train.py changed, model.py as good) shared the good trial's
    good = next(t for t in by_trial.values() if t["row"]["applied"] == [])
    shared = [
        t
        for i, t in by_trial.items()
        if t["model"] == good["model"] and t is not good and t["cache"]["shared"]
    ]
    assert shared and all(t["cache"]["made_by_trial"] == good["row"]["index"] for t in shared), out
    # what Dynamo traced: block and the module globals it reads (WORK), not train.py
    assert good["cache"]["keyed_on"] == ["model.py::<globals>", "model.py::block"], out

    # samples from one process: every trial ran one, with >= 3 samples (the endpoints are
    # 30× apart: the good one takes no second process)
    for t in by_trial.values():
        timing = t["row"]["timing"]
        assert timing["processes"] == 1, out
        assert timing.get("quick_exits") == 1, out  # the probe ended it after the program
        assert len(t["row"]["samples"]) >= 3, out
        assert timing["samples_from"] and timing["steps_s"] > 0, out
        assert timing["realize_s"] >= 0 and timing["startup_s"] > 0, out
    assert "time: 1 process: start-up" in res.stderr, out
    report = (ws / "report.md").read_text()
    assert re.search(r"- trial 1 \(.*\(1 process: start-up [0-9.]+s, compile", report), report


def test_no_sharing_when_a_cache_is_a_unit_of_the_difference(tmp_path: Path) -> None:
    class Unit:
        section = "caches"

    caches = CompileCaches.for_run(tmp_path, [Unit()], remote=False)
    realized = Realized(python=sys.executable, env={}, cwd=tmp_path)
    assert caches.choose(realized, ["python", "x.py"], {}, [], 1) is None
    assert not (tmp_path / "compile-caches").exists()


def test_the_key_of_traced_code_is_its_definition_and_its_module_globals(tmp_path: Path) -> None:
    base = (
        '"""Doc."""\nimport torch\nEPS = 1e-6\n\n\n'
        "@torch.compile\ndef step(x):\n    return x * EPS\n\n\n"
        "def mask(n):\n    return lambda q, k: q >= k\n\n\n"
        "class Block:\n    def forward(self, x):\n        return x\n"
    )
    (tmp_path / "m.py").write_text(base)
    keys = ["m.py::step", "m.py::<globals>", "m.py::Block.forward", "m.py::" + defpath(
        "mask.<locals>.<lambda>"
    )]  # fmt: skip
    before = {k: source_sha(tmp_path, k) for k in keys}
    assert all(before.values()) and defpath("<module>") == ""

    def after(old: str, new: str) -> dict[str, str | None]:
        (tmp_path / "m.py").write_text(base.replace(old, new))
        return {k: source_sha(tmp_path, k) for k in keys}

    changed = {k for k, v in after('"""Doc."""', '"""Other doc."""').items() if v != before[k]}
    assert changed == set()  # the docstring is no code
    changed = {k for k, v in after("EPS = 1e-6", "EPS = 1e-5").items() if v != before[k]}
    assert changed == {"m.py::<globals>"}
    changed = {
        k for k, v in after("@torch.compile\n", "@torch.compile()\n").items() if v != before[k]
    }
    assert changed == {"m.py::step"}  # a decorator is part of the definition
    changed = {k for k, v in after("q >= k", "q > k").items() if v != before[k]}
    assert changed == {"m.py::mask"}
    changed = {k for k, v in after("return x\n", "return x + 1\n").items() if v != before[k]}
    assert changed == {"m.py::Block.forward"}
