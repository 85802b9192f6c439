"""A user's Python command run under the probe (``agent/probe.py``), host side.

``wrap`` rewrites the argv so the program starts through the probe's bootstrap, given
inline with ``-c`` (nothing is installed or written on the target):

- ``python [opts] train.py ARGS`` → ``python [opts] -c BOOT train.py ARGS``
  (``-m pkg ARGS`` and ``-c CODE ARGS`` alike);
- ``torchrun [opts] train.py ARGS`` (or ``python -m torch.distributed.run``) →
  ``torchrun [opts] --no-python PYTHON -u -c BOOT train.py ARGS``: every worker runs under
  the probe, as torchrun would have run it (``-u``); rank 0's facts are the run's.

Anything else (a shell wrapper, ``python -`` reading its program from stdin, a torchrun
with ``--module``/``--no-python``) runs as typed, with the reason in ``Wrapped.why_not``.

Facts come back through a file (``<log>/<name>.facts.json``, a local run) or a frame on
stdout with the run's nonce (through layers), never through what the program prints.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import zlib
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from envbisect.model.kernels import ProfileRequest
from envbisect.transport.reply import find_frame

CONFIG_ENV = "ENVBISECT_PROBE"
FACTS_SUFFIX = ".facts.json"
TRACE_SUFFIX = ".trace.json"
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?(\.exe)?$")
_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_TORCHRUN_FLAGS = frozenset(
    (
        "--standalone",
        "--virtual-local-rank",
        "--virtual_local_rank",
    )
)
_TORCHRUN_UNSUPPORTED = frozenset(
    ("-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path")
)
_PY_VALUE_OPTS = frozenset(("-W", "-X", "--check-hash-based-pycs"))
_PY_NO_PROGRAM = frozenset(("-h", "-?", "--help", "--help-all", "-V", "--version"))


@lru_cache(maxsize=1)
def bootstrap() -> str:
    """The ``-c`` program: the probe's sources (compressed, base64: no character any layer
    quotes), each registered as a module of its own (``probe_facts``, ``probe_steps`` and
    ``profile`` first: ``probe`` imports them), then ``main()``."""
    agent = Path(__file__).parents[1] / "agent"
    register = []
    for name, file in (
        ("_envbisect_probe_facts", "probe_facts.py"),
        ("_envbisect_probe_profile", "kernel_profile.py"),
        ("_envbisect_probe_steps", "probe_steps.py"),
        ("_envbisect_probe_reads", "probe_reads.py"),
        ("_envbisect_probe_stop", "probe_stop.py"),
        ("_envbisect_probe", "probe.py"),
    ):
        blob = base64.b64encode(zlib.compress((agent / file).read_bytes(), 9)).decode("ascii")
        label = "<envbisect-" + file[:-3].replace("_", "-") + ">"
        register.append(
            f"m=types.ModuleType('{name}');sys.modules[m.__name__]=m;"
            f"exec(compile(zlib.decompress(base64.b64decode('{blob}')),"
            f"'{label}','exec'),m.__dict__);"
        )
    return "import base64,sys,types,zlib;" + "".join(register) + "m.main()"


@dataclass(frozen=True)
class Wrapped:
    """A command as it will run: under the probe (``probed``) or as typed, and why not."""

    argv: tuple[str, ...]
    probed: bool
    why_not: str | None = None


def wrap(argv: list[str] | tuple[str, ...], python: str | None = None) -> Wrapped:
    """``argv`` run under the probe where it is a Python program (see the module doc);
    ``python`` is the state's interpreter (torchrun's workers run it)."""
    words = list(argv)
    if not words:
        return Wrapped((), False, "no command")
    name = os.path.basename(words[0])
    if name == "torchrun":
        return _wrap_torchrun(words, 1, _launcher_python(words[0], python))
    if not (_PYTHON.match(name) or (python and words[0] == python)):
        return Wrapped(tuple(words), False, f"{name} is not a Python interpreter")
    found = _python_program(words)
    if isinstance(found, str):
        return Wrapped(tuple(words), False, found)
    opts, program = found
    if program[0] == "-m" and program[1] in _TORCHRUN_MODULES:
        return _wrap_torchrun(words, len(opts) + 3, python or words[0])
    return Wrapped((words[0], *opts, "-c", bootstrap(), *program), True)


def _launcher_python(launcher: str, python: str | None) -> str | None:
    """The interpreter of a launcher's workers: ``python`` where it is a path (the state's),
    else the one a launcher given by path names in its shebang (``/venv/bin/torchrun``
    runs ``/venv/bin/python``: a bare ``python3`` off PATH may lack torch)."""
    if python and os.path.isabs(python) or os.sep not in launcher:
        return python
    try:
        with open(launcher, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return python
    words = first[2:].decode("utf-8", "replace").split() if first.startswith(b"#!") else []
    if words and _PYTHON.match(os.path.basename(words[0])) and os.path.isabs(words[0]):
        return words[0]
    return python


def _python_program(words: list[str]) -> tuple[list[str], list[str]] | str:
    """(interpreter options, program words: ``script ARGS`` / ``-m mod ARGS`` / ``-c code
    ARGS``), or why there is no program to run under the probe."""
    i = 1
    while i < len(words):
        w = words[i]
        if w == "-":
            return "the program comes from stdin"
        if not w.startswith("-"):
            return words[1:i], words[i:]
        if w in _PY_NO_PROGRAM:
            return "no program to run"
        if w in _PY_VALUE_OPTS:
            i += 2
            continue
        if w.startswith("--"):
            i += 1
            continue
        for j, ch in enumerate(w[1:], start=1):
            rest = w[j + 1 :]
            if ch in "cm":
                value = rest or (words[i + 1] if i + 1 < len(words) else None)
                if value is None:
                    return f"{w} without a value"
                after = i + 1 if rest else i + 2
                opts = words[1:i] + ([w[:j]] if j > 1 else [])
                return opts, [f"-{ch}", value, *words[after:]]
            if ch in "WX":
                i += 0 if rest else 1  # the value is the next word
                break
        i += 1
    return "no program to run"


def _wrap_torchrun(words: list[str], start: int, python: str | None) -> Wrapped:
    """torchrun's workers under the probe: ``--no-python PYTHON -u -c BOOT script ARGS``."""
    if not python:
        return Wrapped(tuple(words), False, "torchrun: no interpreter known for its workers")
    i = start
    while i < len(words):
        w = words[i]
        if w.split("=", 1)[0] in _TORCHRUN_UNSUPPORTED:
            return Wrapped(tuple(words), False, f"torchrun {w}: runs as typed")
        if not w.startswith("-"):
            break
        i += 1 if ("=" in w or w in _TORCHRUN_FLAGS) else 2
    if i >= len(words):
        return Wrapped(tuple(words), False, "torchrun: no training script")
    if words[i] == "--":
        i += 1
    head, program = words[:i], words[i:]
    return Wrapped((*head, "--no-python", python, "-u", "-c", bootstrap(), *program), True)


@dataclass(frozen=True)
class Delivery:
    """Where one run's facts come back: a file here, or a frame with a nonce on stdout;
    ``serialize``: the probe keeps the program's compiles and FX traces one thread at a time
    (the run that makes a warm cache: threads compiling at once is the field's race);
    ``profile``: the profiler's part of the probe config (``agent/kernel_profile.py``), if asked."""

    file: Path | None = None
    nonce: str | None = None
    serialize: bool = False
    profile: dict[str, Any] | None = None
    step_fn: str | None = None  # MODULE:QUALNAME whose returns end a step (else optimizer steps)
    stacks_after: float | None = None  # every thread's stack to stderr then (a hang's where)
    quick_exit: bool = False  # end the process after the program (agent/probe.py QUICK)
    watch: tuple[str, ...] = ()  # data paths whose opening is recorded (agent/probe_reads.py)
    stop: dict[str, Any] | None = None  # when to end a long run early (agent/probe_stop.py)

    @classmethod
    def for_run(cls, log_dir: Path, name: str, remote: bool) -> Delivery:
        if remote:
            return cls(nonce="probe-" + secrets.token_hex(8))
        path = log_dir / f"{name}{FACTS_SUFFIX}"
        path.unlink(missing_ok=True)
        return cls(file=path)

    def env(self) -> dict[str, str]:
        """The variable that tells the probe where to deliver."""
        config: dict[str, Any] = {"result": str(self.file)} if self.file else {"nonce": self.nonce}
        if self.serialize:
            config["serialize_compiles"] = True
        if self.profile:
            config["profile"] = dict(self.profile)
        if self.step_fn:
            config["step_fn"] = self.step_fn
        if self.quick_exit:
            config["quick_exit"] = True
        if self.stacks_after:
            config["stacks_after"] = round(self.stacks_after, 1)
        if self.watch:
            config["watch"] = list(self.watch)
        if self.stop:
            config["stop"] = dict(self.stop)
        return {CONFIG_ENV: json.dumps(config)}

    def collect(
        self, stdout: bytes, log_dir: Path, name: str
    ) -> tuple[dict[str, Any] | None, bytes]:
        """The facts (also kept as ``<name>.facts.json``) and stdout without the frame."""
        if self.nonce is None:
            return read_facts(self.file) if self.file else None, stdout
        data = find_frame(stdout, self.nonce)
        marker = re.compile(
            rb"\r?\n?<<ENVBISECT "
            + re.escape(self.nonce.encode())
            + rb" BEGIN>>.*?<<ENVBISECT "
            + re.escape(self.nonce.encode())
            + rb" END>>\r?\n?",
            re.DOTALL,
        )
        stdout = marker.sub(b"\n", stdout)
        if data is not None:
            write_facts(log_dir / f"{name}{FACTS_SUFFIX}", data)
        return data, stdout


def trace_path(log_dir: Path, name: str, remote: bool) -> str:
    """Where a profiled run keeps its Chrome trace: beside its logs, or in the target's
    temporary directory when it runs through layers (the log directory is here)."""
    if remote:
        return f"/tmp/envbisect-{name}-{secrets.token_hex(4)}{TRACE_SUFFIX}"
    return str(log_dir.resolve() / f"{name}{TRACE_SUFFIX}")


def read_facts(path: Path | None) -> dict[str, Any] | None:
    """The facts a run left in ``path``, or None."""
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_facts(path: Path, data: dict[str, Any]) -> None:
    """Keep one run's facts beside its logs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, sort_keys=True, indent=1, default=str))
    os.replace(tmp, path)


def trial_facts(trial_dir: Path | str | None) -> dict[str, Any] | None:
    """A trial's facts: those of its last run that left any."""
    if trial_dir is None:
        return None
    found = sorted(
        Path(trial_dir).glob(f"run-*{FACTS_SUFFIX}"),
        key=lambda p: int(re.sub(r"\D", "", p.name.split(".")[0]) or 0),
    )
    for path in reversed(found):
        data = read_facts(path)
        if data is not None:
            return data
    return None


def shown(argv: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``argv`` as logs show it: the bootstrap's long word named, not spelled out."""
    boot = bootstrap()
    return tuple("<envbisect probe bootstrap>" if w == boot else w for w in argv)


@dataclass(frozen=True)
class ProbeRun:
    """One command run under the probe (``envbisect probe``): its facts and how it ended."""

    argv: tuple[str, ...]
    facts: dict[str, Any] | None
    exit_status: int | None
    timed_out: bool
    log_dir: Path

    def as_dict(self) -> dict[str, Any]:
        return {
            "argv": list(shown(self.argv)),
            "exit_status": self.exit_status,
            "timed_out": self.timed_out,
            "log_dir": str(self.log_dir),
            "facts": self.facts,
        }


def probe_command(
    argv: tuple[str, ...] | list[str],
    *,
    transport: Any,
    python: str,
    timeout_s: float,
    log_dir: Path,
    profile: ProfileRequest | None = None,
) -> ProbeRun:
    """Run ``argv`` once under the probe through ``transport``; the program's output goes
    to ``log_dir`` (``probe.stdout``, ``probe.stderr``), its facts come back; ``profile``:
    a few steps under torch.profiler, the trace kept as ``probe.trace.json`` (on the target,
    through layers)."""
    from envbisect.model.errors import UsageError

    wrapped = wrap(argv, python)
    if not wrapped.probed:
        raise UsageError(f"cannot run {shlex_join(argv)} under the probe: {wrapped.why_not}")
    remote = bool(transport.layers)
    delivery = replace(
        Delivery.for_run(log_dir, "probe", remote), stacks_after=stacks_at(timeout_s)
    )
    if profile is not None:
        delivery = replace(delivery, profile=profile.config(trace_path(log_dir, "probe", remote)))
    env = None
    if remote:
        transport = transport.with_env(delivery.env())
    else:
        env = {**os.environ, **delivery.env()}
    res = transport.run(
        list(wrapped.argv), timeout_s=timeout_s, log_dir=log_dir, env=env, name="probe"
    )
    facts, _stdout = delivery.collect(res.stdout(), log_dir, "probe")
    return ProbeRun(wrapped.argv, facts, res.returncode, res.timed_out, log_dir)


def stacks_at(timeout_s: float) -> float | None:
    """When the probe writes every thread's stack to the program's stderr: shortly before
    the run's timeout, so that a program killed for hanging leaves where it hung (None:
    too short a timeout to leave room)."""
    if timeout_s < 20:
        return None
    return timeout_s - min(10.0, 0.05 * timeout_s)


STACKS_NOTE = "every thread's stack, written just before the timeout, ends its stderr log"
HUNG_STACKS_NOTE = "every thread's stack, written when it was ended, ends its stderr log"


def left_stacks(stderr: bytes) -> bool:
    """Whether a run's stderr holds the stacks the probe wrote before its timeout
    (faulthandler heads each thread's stack so)."""
    return b"(most recent call first)" in stderr


def shlex_join(argv: tuple[str, ...] | list[str]) -> str:
    import shlex

    return shlex.join(list(argv))
