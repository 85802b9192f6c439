"""One run of the smoke command: what a trial runs (``SmokeCommand``), where and how
(``RunSpec``), how it went (``Launch``, ``RunLog``), and ``run_once``, which reads its
throughput and never raises for a bad run.

The built-in drafter is shipped on stdin and its result comes back in a frame; a user
command is run as typed (under the probe when it is Python), its paths mapped into the
state. Through ``--via``/``--target`` the state's environment reaches the far process as
innermost ``env [-u NAME ...] NAME=value ...`` layers (``far_transport``): the difference
from this process's own environment. Each run goes through ``Transport.run`` (its process
group is killed at the timeout) with full stdout/stderr under the log dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envbisect.model.errors import TransportError
from envbisect.model.escape import printable
from envbisect.model.facts import from_drafter
from envbisect.model.failure import Failure
from envbisect.model.kernels import ProfileRequest
from envbisect.model.logforms import FORMS, Choice, recognize
from envbisect.model.metric import (
    FIGURE_SEEN,
    RESULT_ENV,
    SAMPLES_ENV,
    Measurement,
    MetricSpec,
    measure,
)
from envbisect.model.steps import breakdown, from_steps, with_steps
from envbisect.model.units import STEPS, show_as
from envbisect.run import cmdcheck, probed
from envbisect.transport import Layer, LayerKind, Transport
from envbisect.transport.bundle import build_bundle
from envbisect.transport.hang import HangSpec
from envbisect.transport.reply import find_frame

DRAFTER = "envbisect.agent.drafter"
# A long run ends once 20 kept steps spanning 1 s (after a third as warm-up, none compiling)
# know their median within ±3%, and the log has shown 6 lines of its figure
# (agent/probe_stop.py).
STOP_RULE = {"min_steps": 20, "min_kept_s": 1.0, "tolerance": 0.03, "min_lines": 6}


# ----------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class SmokeCommand:
    """What a trial runs: a user argv (after ``--``) or, when ``argv`` is empty, the drafter."""

    argv: tuple[str, ...] = ()
    metric: MetricSpec | None = None
    drafter_params: Mapping[str, Any] = field(default_factory=lambda: {"preset": "auto"})
    probe: bool = True  # a Python command runs under the probe (envbisect.run.probed)
    step_fn: str | None = None  # --step-fn MODULE:QUALNAME: its returns end a timed step
    full_exit: bool = False  # --full-exit: the program's own exit, not the probe's quick one
    # How a command with no --metric-regex was read once its first run was (model.logforms):
    # every later run alike. Shared, filled once.
    choice: Choice = field(default_factory=Choice, compare=False)
    steps: int | None = None  # --steps N: end each run after N timed steps
    max_trial_s: float | None = None  # --max-trial-s S: end each run after S seconds

    def stop_rule(self) -> dict[str, Any] | None:
        """When the probe ends a run early (``agent/probe_stop.py``): once its rate is
        known, after ``--steps``, or after ``--max-trial-s``; never with ``--full-exit``."""
        if self.full_exit or self.builtin or self.choice.result:
            return None
        # A figure read one way must be read so in every run: a typed regex, or a form the
        # first run was read in, needs its lines; before any choice (or with the probe's
        # steps chosen) a run may end with none, and its steps are the figure.
        typed = self.metric is not None or self.choice.spec is not None
        spec = self.metric or self.choice.spec
        figure = [spec.pattern.pattern] if spec else [f.regex for f in FORMS]
        rule: dict[str, Any] = dict(STOP_RULE, figure=[] if self.choice.steps else figure)
        rule.update(require_lines=typed, max_steps=self.steps, max_s=self.max_trial_s)
        return rule

    @property
    def builtin(self) -> bool:
        return not self.argv

    def describe(self) -> str:
        if self.builtin:
            preset = self.drafter_params.get("preset", "auto")
            return f"built-in drafter smoke test (preset {preset})"
        import shlex

        return shlex.join(self.argv)


@dataclass(frozen=True)
class RunSpec:
    """Where and how one run of the smoke command goes (see ``run_once``)."""

    transport: Transport
    python: str
    env: Mapping[str, str] | None  # the run's whole environment; None: this process's
    cwd: Path | None
    timeout_s: float
    log_dir: Path  # <name>.stdout, <name>.stderr, <name>.result.json
    name: str
    argv_map: Callable[[Sequence[str]], list[str]] | None = None  # the state's paths
    samples: int = 1  # timed windows asked of the one process
    pin: tuple[str, ...] = ()  # words put in front of the innermost command (taskset -c N)
    serialize_compiles: bool = False  # the probe compiles one thread at a time (warm-cache run)
    hang_s: float | None = None  # end a local run that used no CPU time this long (--hang-after)
    pinned_env: tuple[str, ...] = ()  # env units' variables, said explicitly on a far target
    profile: ProfileRequest | None = None  # a few steps under torch.profiler (run --profile)
    watch: tuple[str, ...] = ()  # data paths the probe records the opening of (run.dataread)

    @property
    def remote(self) -> bool:
        """Through layers: the local environment and cwd only reach the first hop."""
        return bool(self.transport.layers)


@dataclass(frozen=True)
class Launch:
    """One process of a run as it ended (``started`` False: it never did)."""

    argv: tuple[str, ...]  # as logged (the drafter's shows what went on stdin)
    program: str | None = None  # what a bare name resolved to under the state's PATH
    started: bool = False
    exit_status: int | None = None
    timed_out: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    hung_s: float | None = None  # ended as hung: seconds it used no CPU time
    # Known without reading a metric: the agent's own error, a command that cannot start.
    reading: Measurement | None = None
    probed: bool = False  # ran under the probe (envbisect.run.probed); argv is as typed
    facts: Mapping[str, Any] | None = None  # what the probe delivered (steps timed, ...)
    peak_rss_bytes: int | None = None  # a local run: its processes' most memory at once


@dataclass(frozen=True)
class RunLog:
    """How one run went, as ``trial.json`` lists it under ``runs``."""

    name: str
    cwd: Path | None
    launch: Launch
    wall_s: float
    measurement: Measurement
    contention: Mapping[str, Any] | None = None  # other processes' load during the run

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "cwd": str(self.cwd) if self.cwd is not None else None,
            "argv": list(self.launch.argv),
        }
        if self.launch.program is not None:
            out["program"] = self.launch.program
        if self.launch.started:
            out.update(exit_status=self.launch.exit_status, timed_out=self.launch.timed_out)
        if self.launch.probed:
            out["probe"] = f"ran under the probe; facts in {self.name}{probed.FACTS_SUFFIX}"
        m = self.measurement
        used = m.result.get("samples_from") if m.ok else None
        return {
            **out,
            "wall_s": self.wall_s,
            "tok_per_s": m.tok_per_s,
            "samples": list(m.samples),
            **({"samples_from": used} if used else {}),
            "breakdown": breakdown(self.wall_s, self.launch.facts),
            "failure": m.failure,
            "source": m.source,
            **({"contention": dict(self.contention)} if self.contention is not None else {}),
        }


def run_once(
    smoke: SmokeCommand,
    spec: RunSpec | None = None,
    *,
    record: Callable[[RunLog], None] | None = None,
    **where: Any,
) -> Measurement:
    """Run the smoke command once and read its throughput (never raises for a bad run).

    ``spec`` says where and how; without it, its fields as keywords (``transport=...,
    python=..., env=..., cwd=..., timeout_s=..., log_dir=..., name=...``).
    ``spec.samples`` timed windows are asked of the one process (the built-in drafter
    through its params, any other command through ``$ENVBISECT_SAMPLES``): one start, one
    warm-up. ``record`` receives how the run went: argv, cwd, exit status, wall time, the
    reading.
    """
    spec = spec if spec is not None else RunSpec(**where)
    started = time.monotonic()
    launch, m = _run_once(smoke, spec)
    if record is not None:
        record(RunLog(spec.name, spec.cwd, launch, round(time.monotonic() - started, 3), m))
    return m


def _run_once(smoke: SmokeCommand, spec: RunSpec) -> tuple[Launch, Measurement]:
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    result_file = spec.log_dir / f"{spec.name}.result.json"
    if result_file.exists():
        result_file.unlink()
    run_env = dict(spec.env if spec.env is not None else os.environ)
    run_env[SAMPLES_ENV] = str(spec.samples)
    if not spec.remote:
        run_env[RESULT_ENV] = str(result_file)  # a path on this machine: not for a far side
    if smoke.builtin:
        launch, frame = _launch_drafter(smoke, spec, run_env)
    else:
        launch, frame = _launch_command(smoke, spec, run_env), None
    if launch.reading is not None:
        return launch, launch.reading
    metric = smoke.metric or _log_form(smoke, launch)
    reading = measure(
        stdout=launch.stdout,
        stderr=launch.stderr,
        returncode=launch.exit_status,
        timed_out=launch.timed_out,
        timeout_s=spec.timeout_s,
        result_file=None if spec.remote else result_file,
        frame=frame,
        spec=metric,
    )
    reading = _read_as_chosen(smoke, metric, reading, launch)
    if launch.hung_s is not None:
        reading = replace(reading, failure=Failure.timeout(f"({hung(launch.hung_s)})"))
    if launch.timed_out and launch.probed and probed.left_stacks(launch.stderr):
        note = probed.HUNG_STACKS_NOTE if launch.hung_s is not None else probed.STACKS_NOTE
        reading = replace(reading, failure=Failure(f"{reading.failure}; {note}"))
    elif (
        cmdcheck.no_metric(reading.failure)
        and _quick(launch.facts)
        and FIGURE_SEEN not in str(reading.failure)  # printed, just not read: no exit note
    ):
        reading = replace(reading, failure=Failure(f"{reading.failure}; {QUICK_NOTE}"))
    # Fewer samples than asked (a log with one final figure): the probe's timed steps.
    return launch, with_steps(reading, launch.facts, spec.samples)


def _log_form(smoke: SmokeCommand, launch: Launch) -> MetricSpec | None:
    """A user command with no --metric-regex: the form its runs are read in
    (``model.logforms``), once chosen; before that, the first its output matches."""
    if smoke.builtin or smoke.choice.steps:
        return None
    if smoke.choice.spec is not None:
        return smoke.choice.spec
    text = (
        launch.stdout.decode("utf-8", "replace") + "\n" + launch.stderr.decode("utf-8", "replace")
    )
    return recognize(text)


def _read_as_chosen(
    smoke: SmokeCommand,
    metric: MetricSpec | None,
    reading: Measurement,
    launch: Launch,
) -> Measurement:
    """``reading``, its figure's form said and made the command's (``Choice``); where no
    form matched, the probe's timed steps (steps/s) when it saw them."""
    if smoke.builtin or smoke.metric is not None:
        return reading
    if smoke.choice.steps and (reading.ok or cmdcheck.no_metric(reading.failure)):
        # The first run ended early and was read from its steps: every run is, even one
        # that reached its own ENVBISECT_RESULT (no two states compared across units).
        return from_steps(launch.facts) or reading
    if reading.ok and reading.source in ("file", "line", "frame"):
        smoke.choice.take(None, steps=False, result=True)  # later runs must reach their end
        return reading
    if metric is not None and reading.source == "regex":
        smoke.choice.take(metric, steps=False)
        show_as(metric.unit)
        said = {
            "form": metric.label,
            "unit": metric.unit.name,
            "way": metric.unit.direction(),
            "line": _last_line(metric, launch),
        }
        return replace(reading, result={**reading.result, "metric_from": said})
    if cmdcheck.no_metric(reading.failure) and not smoke.choice.spec:
        stepped = from_steps(launch.facts)
        if stepped is not None:
            smoke.choice.take(None, steps=True)
            show_as(STEPS)
            return stepped
    return reading


def _last_line(metric: MetricSpec, launch: Launch) -> str | None:
    """The last output line ``metric`` read its figure from (stdout, then stderr)."""
    for out in (launch.stdout, launch.stderr):
        text = out.decode("utf-8", "replace").replace("\r", "\n")
        found = list(metric.pattern.finditer(text))
        if found:
            last = found[-1]
            start = text.rfind("\n", 0, last.start()) + 1
            end = text.find("\n", last.end())
            return text[start : end if end >= 0 else None].strip()[:200]
    return None


def form_note(m: Measurement) -> str | None:
    """How a command with no --metric-regex had its figure read (a recognized log form or
    the probe's steps), said once at its first run; None for any other run."""
    said = m.result.get("metric_from") if m.ok else None
    if not isinstance(said, Mapping):
        return None
    where = f"; last read from: {printable(said['line'])}" if said.get("line") else ""
    return f"  figure: {said['form']}, in {said['unit']} ({said['way']}){where}"


def hung(idle_s: float) -> str:
    """What a run ended as hung is said with."""
    return f"hung: no CPU time used in its last {idle_s:.0f}s; --hang-after"


QUICK_NOTE = (
    "the probe ended the program after its main body (no atexit handler ran): a figure "
    "written at exit needs --full-exit"
)


def _quick(facts: Mapping[str, Any] | None) -> bool:
    return bool(facts and facts.get("quick_exit"))


def _launch_drafter(
    smoke: SmokeCommand, spec: RunSpec, run_env: dict[str, str]
) -> tuple[Launch, dict[str, Any] | None]:
    """The drafter shipped on stdin; its result comes back in a frame on stdout."""
    params = {"samples": spec.samples, **dict(smoke.drafter_params)}
    bundle = build_bundle(DRAFTER, params, deadline_s=spec.timeout_s)
    launch = _launch(spec, run_env, [*spec.pin, spec.python, "-"], bundle.source, slack_s=5)
    launch = replace(launch, argv=(spec.python, "-", f"(stdin: {DRAFTER} {params})"))
    frame = find_frame(launch.stdout, bundle.nonce)
    if frame is not None and "__agent_error__" not in frame:
        # The drafter's facts in the probe's schema: the report explains both alike.
        with contextlib.suppress(TypeError, ValueError, OSError):
            facts = from_drafter(frame)
            probed.write_facts(spec.log_dir / f"{spec.name}{probed.FACTS_SUFFIX}", facts)
    if frame is not None and "__agent_error__" in frame:
        failed = Measurement(None, Failure.crash(f"{frame['__agent_error__']}"), "frame")
        return replace(launch, reading=failed), frame
    return launch, frame


def _launch_command(smoke: SmokeCommand, spec: RunSpec, run_env: dict[str, str]) -> Launch:
    """A user command, its paths mapped into the state; through layers it changes into the
    state's cwd on the far side."""
    typed = list(spec.argv_map(smoke.argv) if spec.argv_map else smoke.argv)
    argv, delivery = typed, None
    if smoke.probe:
        wrapped = probed.wrap(typed, spec.python)
        if wrapped.probed:
            argv = list(wrapped.argv)
            delivery = probed.Delivery.for_run(spec.log_dir, spec.name, spec.remote)
            delivery = replace(
                delivery,
                serialize=spec.serialize_compiles,
                step_fn=smoke.step_fn,
                quick_exit=not smoke.full_exit,
                stacks_after=probed.stacks_at(spec.timeout_s),
                watch=spec.watch,
                stop=smoke.stop_rule() if spec.profile is None else None,
            )
            if spec.profile is not None:
                trace = probed.trace_path(spec.log_dir, spec.name, spec.remote)
                delivery = replace(delivery, profile=spec.profile.config(trace))
            run_env.update(delivery.env())
    # Logged as typed (the probe's bootstrap is a detail of how it ran: ``probed``).
    argv, logged = _placed(spec, argv), tuple(_placed(spec, typed))
    program = None
    if not spec.remote:
        program = shutil.which(argv[0], path=run_env.get("PATH")) or argv[0]
    try:
        launch = replace(_launch(spec, run_env, argv), program=program)
    except TransportError as exc:
        # e.g. the state's PATH has no such program: this state cannot run the command.
        failed = Measurement(None, Failure.crash(f"{exc}"), None)
        return Launch(logged, program, reading=failed)
    if delivery is None:
        return launch
    facts, stdout = delivery.collect(launch.stdout, spec.log_dir, spec.name)
    return replace(launch, stdout=stdout, argv=logged, probed=True, facts=facts)


def _placed(spec: RunSpec, argv: list[str]) -> list[str]:
    """``argv`` behind the run's pin words and, through layers, in the state's cwd."""
    argv = [*spec.pin, *argv]
    if spec.remote and spec.cwd is not None:
        argv = ["sh", "-c", 'cd "$0" && exec "$@"', str(spec.cwd), *argv]
    return argv


def _launch(
    spec: RunSpec, run_env: dict[str, str], argv: list[str], stdin: bytes = b"", slack_s: float = 0
) -> Launch:
    # Through layers the local environment only reaches the first hop: the state's
    # variables ride in an innermost env layer instead.
    via = far_transport(spec.transport, run_env, spec.pinned_env) if spec.remote else spec.transport
    hang = None
    if spec.hang_s and not spec.remote:  # the probe writes every thread's stack on SIGUSR2
        hang = HangSpec(spec.hang_s, signal.SIGUSR2 if probed.CONFIG_ENV in run_env else None)
    res = via.run(
        argv,
        stdin=stdin,
        timeout_s=spec.timeout_s + slack_s,
        log_dir=spec.log_dir,
        env=None if spec.remote else run_env,
        cwd=None if spec.remote else spec.cwd,
        name=spec.name,
        hang=hang,
    )
    return Launch(
        tuple(argv),
        started=True,
        exit_status=res.returncode,
        timed_out=res.timed_out,
        stdout=res.stdout(),
        stderr=res.stderr_path.read_bytes(),
        hung_s=res.hung_s,
        peak_rss_bytes=res.peak_rss_bytes,
    )


def far_transport(
    transport: Transport, env: Mapping[str, str], pinned: Collection[str] = ()
) -> Transport:
    """``transport`` plus innermost ``env`` layers that make the far process's environment
    differ from its own as ``env`` differs from ours: changed variables set, removed ones
    unset (``env -u NAME``). A ``pinned`` variable (an env unit's) is set or unset as
    ``env`` has it whatever ours holds: the far machine's own need not match this one's."""
    changed = {k: v for k, v in env.items() if os.environ.get(k) != v or k in pinned}
    gone = {k for k in os.environ if k not in env} | {k for k in pinned if k not in env}
    unset = [w for k in sorted(gone) for w in ("-u", k)]
    if unset:
        transport = Transport((*transport.layers, Layer(("env", *unset), LayerKind.ARGV)))
    return transport.with_env(changed)
