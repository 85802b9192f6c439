"""`envbisect demo` (and `make demo`): bisect a realistic drift end to end on this machine."""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

from envbisect.model.errors import EnvBisectError
from envbisect.run import demo


def _say(text: str) -> None:
    click.echo(click.style("==> ", fg="cyan", bold=True) + text, err=True)


def _show(argv: tuple[str, ...], env_shown: tuple[str, ...]) -> None:
    shown = ["envbisect", *argv[3:]] if argv[:3] == (sys.executable, "-m", "envbisect") else argv
    line = " ".join([*env_shown, shlex.join(shown)])
    click.echo(click.style("$ " + line, bold=True), err=True)


def _measure_good(sc: demo.Scenario, me: list[str]) -> float:
    """Median tok/s of the smoke test in the good state: the user's "it used to do X".

    One process with ``GOOD_RUNS`` timed windows: a process start and warm-up cost more
    than a window of the tiny preset, and the windows are the samples a trial takes too."""
    argv = [*demo.measure_argv(sc, me), "--samples", str(demo.GOOD_RUNS)]
    _show(tuple(argv), ())
    proc = subprocess.run(
        [*argv, "--format", "json"],
        env=dict(sc.good_env),
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise demo.DemoError(
            f"the smoke test gave no result in the good state: {proc.stderr.strip()[-300:]}"
        ) from None
    if not data.get("ok") or not data.get("tok_per_s"):
        raise demo.DemoError(f"the smoke test failed in the good state: {data.get('error')}")
    rates = [float(x) for x in data.get("samples") or [data["tok_per_s"]]]
    _say("samples: " + ", ".join(f"{r:,.0f}" for r in rates) + " tok/s")
    return statistics.median(rates)


@click.command("demo")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-work"),
    show_default=True,
    help="Where the demo builds its repo, venv, data, manifests and session.",
)
@click.option(
    "--rebuild", is_flag=True, help="Throw away what an earlier demo built and start over."
)
def command(workdir: Path, rebuild: bool) -> int:
    """Bisect a realistic environment drift end to end, with nothing to prepare.

    Builds a good state (a drafter-training git repo, a uv venv reusing the installed CPU
    torch, a JSONL dataset, a compile cache), snapshots it, applies seven field-like changes
    (package upgrade, hand-patched model file, new commit, grown dataset, two env vars,
    cleared compile cache), snapshots the bad state, then runs the real `envbisect diff` and
    `envbisect run` a user would type. Exactly one change genuinely slows the smoke test.
    Re-running reuses what was built; --rebuild starts over.
    """
    start = time.monotonic()
    root = workdir.resolve()
    me = [sys.executable, "-m", "envbisect"]
    sc = demo.scenario_paths(root)
    ready = (root / demo.READY).exists() and not rebuild
    if ready:
        _say(f"reusing the demo built in {root} (--rebuild to start over)")
    else:
        _say(f"building the good state in {root}")
        sc = demo.build_good_state(root, _say)
        _run_step(demo.snapshot_step(sc, me, "good"))
        _say("measuring the good state (what 'training used to do')")
        good_tps = _measure_good(sc, me)
        _say(
            f"good state: median {good_tps:,.0f} tok/s now; the run counts anything under "
            f"{demo.THRESHOLD_FRACTION:.0%} of the good state, as it measures it itself "
            "(under the load of the moment), as the regression"
        )
        _say("applying the drift")
        demo.apply_drift(sc, _say)
        _run_step(demo.snapshot_step(sc, me, "bad"))
        (root / demo.READY).write_text(json.dumps({}), encoding="utf-8")
    code = 0
    for step in demo.demo_steps(sc, me):
        code = _run_step(step)
    elapsed = time.monotonic() - start
    _say(f"report: {sc.report}")
    _say(f"demo finished in {elapsed:.0f} s")
    return code


def _run_step(step: demo.Step) -> int:
    """Run one shown command; a diff's exit 1 ("different") is its success."""
    _say(step.title)
    _show(step.argv, step.env_shown)
    proc = subprocess.run(list(step.argv), env=dict(step.env), check=False)
    if proc.returncode not in step.ok_codes:
        raise EnvBisectError(
            f"demo step '{step.title}' exited {proc.returncode} (expected "
            f"{' or '.join(map(str, step.ok_codes))}); its output is above"
        )
    return 0 if proc.returncode in step.ok_codes else proc.returncode
