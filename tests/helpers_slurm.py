"""A real single-node Slurm cluster for tests: munged, slurmctld and slurmd on this machine.

Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them). Everything lives in a
temporary directory: its own munge key and socket, a ``slurm.conf`` with free ports, state
and spool dirs; ``SLURM_CONF`` points the clients (srun, salloc, squeue, scancel) at it. When
the daemons cannot start (not installed, not root), the tests that need them skip with the
reason. ``start_cluster`` is also used by ``benchmarks/bench_slurm.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TOOLS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "squeue", "scancel", "sinfo")


@dataclass(frozen=True)
class SlurmCluster:
    root: Path
    conf: Path
    node: str
    pids: tuple[int, ...]

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def squeue(self, name: str | None = None) -> list[str]:
        """Job ids in the queue (of job ``name`` when given)."""
        argv = ["squeue", "-h", "-o", "%i"] + (["-n", name] if name else [])
        out = subprocess.run(argv, env=self.env(), capture_output=True, text=True, check=False)
        return out.stdout.split()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def why_not() -> str | None:
    """Why a cluster cannot be started here, or None."""
    missing = [t for t in TOOLS if shutil.which(t) is None and not Path(f"/usr/sbin/{t}").exists()]
    if missing:
        return (
            f"Slurm/munge not installed ({', '.join(missing)} missing); "
            ".ci/run installs slurm-wlm and munge"
        )
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs as the test's user"
    return None


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def start_cluster(root: Path) -> SlurmCluster:
    """Start munged + slurmctld + slurmd under ``root``; returns once the node is idle."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    munge = root / "munge"
    munge.mkdir(mode=0o755, exist_ok=True)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    for d in ("state", "spool", "log"):
        (root / d).mkdir(exist_ok=True)
    sock = munge / "sock"
    subprocess.run(
        [
            _tool("munged"),
            "--force",
            f"--socket={sock}",
            f"--key-file={key}",
            f"--pid-file={munge / 'pid'}",
            f"--log-file={munge / 'log'}",
            f"--seed-file={munge / 'seed'}",
        ],
        check=True,
        capture_output=True,
    )
    node = socket.gethostname().split(".")[0]
    cpus = len(os.sched_getaffinity(0))
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=envbisect-test",
                f"SlurmctldHost={node}(127.0.0.1)",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                "AuthType=auth/munge",
                f"AuthInfo=socket={sock}",
                "CredType=cred/munge",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "SchedulerType=sched/backfill",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/none",
                "ReturnToService=2",
                "MpiDefault=none",
                "KillWait=2",
                "MinJobAge=300",
                "InactiveLimit=0",
                # Several jobs share the two cores of a test machine.
                f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                "OverSubscribe=FORCE:8",
                "",
            ]
        )
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run([_tool("slurmctld"), "-i"], env=env, check=True, capture_output=True)
    subprocess.run([_tool("slurmd")], env=env, check=True, capture_output=True)
    deadline = time.monotonic() + 30
    while True:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, check=False
        )
        if out.stdout.strip() in ("idle", "mix", "alloc"):
            break
        if time.monotonic() > deadline:
            log = (root / "log" / "slurmctld.log").read_text()[-1500:]
            raise RuntimeError(f"slurm node not idle after 30 s (sinfo: {out.stdout!r}): {log}")
        time.sleep(0.2)
    pids = []
    for f in (root / "slurmctld.pid", root / "slurmd.pid", munge / "pid"):
        pids.append(int(f.read_text().split()[0]))
    return SlurmCluster(root=root, conf=conf, node=node, pids=tuple(pids))


def stop_cluster(cluster: SlurmCluster) -> None:
    subprocess.run(
        ["scancel", "--full", "-u", "root"], env=cluster.env(), capture_output=True, check=False
    )
    for pid in cluster.pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for pid in cluster.pids:
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)


def _skip(reason: str) -> None:
    # CI (.ci/run) installs Slurm and must run these tests: there, not starting is a failure.
    if os.environ.get("CI_REQUIRE_SLURM") == "1":
        pytest.fail(f"CI_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = why_not()
    if reason:
        _skip(reason)
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
        _skip(f"a single-node Slurm cluster could not start here: {exc}")
        raise
    try:
        yield cluster
    finally:
        stop_cluster(cluster)
