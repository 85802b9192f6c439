"""Launchers met as users type them (issue 46): a 2-rank ``torchrun`` (gloo, CPU) given by
absolute path, its venv not on PATH, probed on every rank with the venv's own interpreter;
``probe --python X -- python train.py`` runs X."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DDP = r"""
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for it in range(8):
    model(torch.randn(64, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


def _probe(tmp_path: Path, *argv: str, path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path, "TMPDIR": str(tmp_path)}  # torchrun's own temp dirs
    return subprocess.run(
        [sys.executable, "-m", "envbisect", "probe", "--log-dir", str(tmp_path / "logs"),
         "--json", str(tmp_path / "probe.json"), *argv],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip


def test_torchrun_by_path_probes_every_rank_with_its_own_interpreter(tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text(DDP)
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("no torchrun beside this interpreter")
    res = _probe(
        tmp_path, "--", str(torchrun), "--standalone", "--nproc_per_node", "2", "ddp.py",
        path="/usr/bin:/bin",  # the venv not on PATH, as a user calls it
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    logs = tmp_path / "logs"
    assert "No module named 'torch'" not in (logs / "probe.stderr").read_text()
    for facts in (logs / "probe.facts.json", logs / "probe.facts.json.rank1"):
        data = json.loads(facts.read_text())
        assert data["steps"]["steps"] == 8, facts  # each rank's optimizer steps, timed
    assert "steps: 8 timed (each optimizer step())" in res.stdout


def test_probe_python_runs_a_bare_python_in_the_command(tmp_path: Path) -> None:
    (tmp_path / "which.py").write_text("import sys; print('interpreter', sys.executable)\n")
    res = _probe(tmp_path, "--python", sys.executable, "--", "python", "which.py",
                 path="/usr/bin:/bin")  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    out = (tmp_path / "logs" / "probe.stdout").read_text()
    assert f"interpreter {sys.executable}" in out
