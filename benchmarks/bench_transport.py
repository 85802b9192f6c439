"""Per-call overhead of a transport chain over a bare local run of the echo agent.

Each call is ``Transport.run_agent(python, "envbisect.agent.echo", params)``: build the
bundle, start the chain, ship the program on stdin, read the framed result back. Chains:

    local            no layer (the reference)
    sh -c            one shell layer
    ssh 127.0.0.1    a real sshd started by this script (tests/helpers_ssh.py), new
                     connection per call (no ControlMaster), key auth, BatchMode
    ssh, ControlPersist   the ssh row with one reused connection (-o ControlMaster=auto
                     -o ControlPersist=60), as a user can put in the --via layer
    ssh + fake pct   the ssh row plus tests/fakes/bin/pct (a Python script: one more
                     interpreter start, as a real pct -- Perl -- has its own start cost)

Rounds run the chains in turn (local, sh, ssh, ssh+pct, local, ...) so drift hits all
alike; reported: median wall ms per chain, median of the per-round difference to local
(the overhead) and median of the per-round ratio to local.

Usage:
    python benchmarks/bench_transport.py [--rounds N]     # in-process paired medians
    python benchmarks/bench_transport.py --once [--via LAYER ...]
        # one call through the chain, then exit: for timing whole processes A/B from outside
    python benchmarks/bench_transport.py --serve-sshd
        # start the test sshd, print its --via string, keep it up until interrupted
Nothing is asserted; results are recorded in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from envbisect.transport import Transport  # noqa: E402 - after the tests path is added

PARAMS = {"q": "it's $(x) `y` ü", "n": list(range(10))}


def one_call(transport: Transport, python: str, log_dir: Path) -> float:
    start = time.perf_counter()
    result = transport.run_agent(
        python, "envbisect.agent.echo", PARAMS, timeout_s=60, log_dir=log_dir
    )
    elapsed = time.perf_counter() - start
    if result.get("params") != PARAMS:
        raise SystemExit(f"wrong result via {transport.describe()}: {result}")
    return elapsed


def _caller(transport: Transport, python: str, log_dir: Path) -> Callable[[], float]:
    return lambda: one_call(transport, python, log_dir)


def start_test_sshd(work: Path):  # type: ignore[no-untyped-def]
    """The tests' sshd (or None with a reason when sshd is not installed)."""
    import helpers_ssh

    try:
        return helpers_ssh.start_sshd(work / "sshd")
    except BaseException as exc:  # pytest.skip raises a BaseException subclass
        if type(exc).__name__ == "Skipped":
            print(f"ssh rows skipped: {exc}", file=sys.stderr)
            return None
        raise


def paired(chains: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    for run in chains.values():  # warm-up: page cache, sshd's first fork
        run()
    times: dict[str, list[float]] = {name: [] for name in chains}
    for _ in range(rounds):
        for name, run in chains.items():
            times[name].append(run())
    return times


def report(times: dict[str, list[float]], python: str, rounds: int) -> str:
    ref = times["local"]
    lines = [
        f"echo agent via Transport.run_agent, target {python}, {rounds} paired rounds",
        "",
        "| chain | median ms | overhead vs local, median ms | ratio to local, median |",
        "|---|---:|---:|---:|",
    ]
    for name, values in times.items():
        diff = statistics.median(v - r for v, r in zip(values, ref, strict=True))
        ratio = statistics.median(v / r for v, r in zip(values, ref, strict=True))
        lines.append(
            f"| {name} | {statistics.median(values) * 1000:.1f} | {diff * 1000:+.1f} "
            f"| {ratio:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--once", action="store_true", help="one call, then exit")
    parser.add_argument("--via", action="append", default=[], metavar="LAYER")
    parser.add_argument("--serve-sshd", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-transport-"))
    try:
        if args.once:
            one_call(Transport.from_specs(args.via), args.python, work)
            return
        started = start_test_sshd(work)
        if args.serve_sshd:
            if started is None:
                raise SystemExit(1)
            print(started[0].via, flush=True)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            try:
                with contextlib.suppress(KeyboardInterrupt):
                    started[1].wait()
            finally:
                started[1].terminate()
                started[1].wait()
            return
        fake_pct = ROOT / "tests" / "fakes" / "bin" / "pct"
        specs: dict[str, list[str]] = {"local": [], "sh -c": ["sh -c"]}
        if started is not None:
            via = started[0].via
            specs["ssh 127.0.0.1"] = [via]
            specs["ssh + fake pct"] = [via, f"{fake_pct} exec 200 --"]
            # What a user can add to the layer to reuse one connection for all calls.
            mux = f"-o ControlMaster=auto -o ControlPath={work}/mux-%p -o ControlPersist=60"
            specs["ssh, ControlPersist"] = [via.replace("ssh ", f"ssh {mux} ", 1)]
        chains = {
            name: _caller(Transport.from_specs(spec), args.python, work / name.replace(" ", "_"))
            for name, spec in specs.items()
        }
        try:
            print(report(paired(chains, args.rounds), args.python, args.rounds))
        finally:
            if started is not None:
                mux_via = specs["ssh, ControlPersist"][0]
                subprocess.run(
                    [
                        *Transport.from_specs([mux_via]).layers[0].argv[:-1],
                        "-O",
                        "exit",
                        mux_via.rsplit(" ", 1)[1],
                    ],
                    capture_output=True,
                    check=False,
                )
                started[1].terminate()
                started[1].wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
