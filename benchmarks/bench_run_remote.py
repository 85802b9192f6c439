"""Per-trial actuation cost on a remote target vs locally (goal: revisiting a state ≪ 1 s).

A state with one package changed (its overlay venv already built: a revisit) and one loose
file swapped is realized and undone (``Actuator.realize`` entered and left) over and over:

1. local: the empty chain;
2. remote: through a real sshd on 127.0.0.1 and the fake ``pct exec 200 --`` (the test
   fixtures' sshd, started here), i.e. the remote agent shipped on stdin each time;
3. reference: ``Transport.run(["true"])`` through the same chain, one round trip, the floor
   of anything done on the far side.

The remote column divided by the reference says how many round trips a trial's actuation
costs (one ``realize`` call and one ``restore`` call are expected). In-process medians over
--runs. Usage: python benchmarks/bench_run_remote.py [--runs N]. Needs /usr/sbin/sshd.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers_run import (  # noqa: E402
    build_wheel,
    file_entry,
    make_venv,
    manifest,
    pkg,
    store_blob,
)
from helpers_ssh import start_sshd  # noqa: E402

from envbisect.diff import diff_manifests  # noqa: E402
from envbisect.model.manifest import load  # noqa: E402
from envbisect.model.session import Session  # noqa: E402
from envbisect.realize.actuate import Actuator  # noqa: E402 - after the path fix above
from envbisect.transport import Transport  # noqa: E402


def _actuator(tmp: Path, python: str, wheels: Path, transport: Transport) -> Actuator:
    tmp.mkdir(parents=True, exist_ok=True)
    loose = tmp / "train.cfg"
    loose.write_bytes(b"lr = 0.2\n")
    mdir = tmp / "m"
    good = manifest(
        mdir / "good.yaml",
        packages={"ebwork": pkg("1.0")},
        files={str(loose): store_blob(mdir, b"lr = 0.1\n")},
    )
    bad = manifest(
        mdir / "bad.yaml",
        packages={"ebwork": pkg("2.0")},
        files={str(loose): file_entry(b"lr = 0.2\n")},
    )
    g, b = load(good), load(bad)
    home = tmp / "far-home"
    home.mkdir(exist_ok=True)
    if transport.layers:
        transport = Transport.from_specs(
            [*(layer_text(t) for t in transport.layers), f"env HOME={home}"]
        )
    return Actuator(
        good=g,
        bad=b,
        units=diff_manifests(g, b).units,
        session=Session.start(tmp / "session", {}),
        python=python,
        transport=transport,
        index_url=(tmp / "no-index").as_uri(),
        find_links=(str(wheels),),
    )


def layer_text(layer) -> str:  # type: ignore[no-untyped-def]
    import shlex

    return shlex.join(layer.argv)


def _trials(act: Actuator, tmp: Path, n: int) -> list[float]:
    out = []
    for i in range(n + 1):
        start = time.perf_counter()
        with act.realize(frozenset(), {}, tmp / f"t{i}") as state:
            assert state.failure is None, state.failure
        if i:  # the first one builds the venv
            out.append(time.perf_counter() - start)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="envbisect-bench-remote-"))
    wheels = root / "wheels"
    build_wheel(wheels, "ebwork", "1.0", "WORK = 1\n")
    build_wheel(wheels, "ebwork", "2.0", "WORK = 8\n")
    target = make_venv(root / "target", wheels, "ebwork==2.0")
    python = str(target / "bin" / "python")
    server, proc = start_sshd(root / "sshd")
    try:
        chain = Transport.from_specs([server.via, "pct exec 200 --"])
        local_act = _actuator(root / "local", python, wheels, Transport())
        local = _trials(local_act, root / "local", args.runs)
        remote_act = _actuator(root / "remote", python, wheels, chain)
        remote = _trials(remote_act, root / "remote", args.runs)
        floor = []
        for i in range(args.runs):
            start = time.perf_counter()
            chain.run(["true"], log_dir=root / "floor", name=f"true-{i}", timeout_s=30)
            floor.append(time.perf_counter() - start)
    finally:
        proc.terminate()
        proc.wait()
    lo, re_, fl = (statistics.median(x) for x in (local, remote, floor))
    print("| realize + restore of a revisited state (cached venv, 1 file swap) | median s |")
    print("|---|---|")
    print(f"| local (empty chain) | {lo:.4f} |")
    print(f"| remote: ssh 127.0.0.1 → pct exec 200 (agent on stdin) | {re_:.4f} |")
    print(f"| reference: one round trip `true` through the same chain | {fl:.4f} |")
    print(f"remote / round trip: {re_ / fl:.2f}; remote / local: {re_ / lo:.1f}")
    print(f"runs: {args.runs} each")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
