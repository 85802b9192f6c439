"""Running a composed command: :class:`Transport` (a layer chain), its process runs and
their results; ``kill_running`` ends every run in flight (Ctrl-C)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from envbisect.model.errors import TransportError
from envbisect.transport import reaper
from envbisect.transport.bundle import Bundle, build_bundle
from envbisect.transport.hang import PEAK_TICK_S, TICK_S, HangSpec, HangWatch, PeakWatch
from envbisect.transport.layers import Layer, LayerKind, parse_layer, shell_join
from envbisect.transport.reply import BlobSink, read_reply

# Linux refuses a single exec argument longer than this (MAX_ARG_STRLEN, 32 pages, incl. NUL).
MAX_ARG_BYTES = 131072 - 1


def _private_log(path: Path) -> IO[bytes]:
    """A run's output file, readable by its owner only (a smoke command's output may hold
    what the user's own training prints: tokens, paths); never written through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "wb")


@dataclass(frozen=True)
class ProcessResult:
    """What one process run returned; stdout/stderr are kept in full under ``log_dir``.

    ``killed``: the processes it left behind that had to be ended (``pid command``), also
    listed in ``<name>.killed`` next to the logs.
    """

    argv: tuple[str, ...]
    returncode: int
    timed_out: bool
    elapsed_s: float
    stdout_path: Path
    stderr_path: Path
    killed: tuple[str, ...] = ()
    hung_s: float | None = None  # ended as hung (``hang``): seconds it used no CPU time
    peak_rss_bytes: int | None = None  # a local run: its process group's most memory at once

    def stdout(self) -> bytes:
        return self.stdout_path.read_bytes()

    def stderr_tail(self, lines: int = 20) -> str:
        data = self.stderr_path.read_bytes()[-65536:]
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


@dataclass(frozen=True)
class Transport:
    """A layer chain, outermost first. The empty chain runs locally."""

    layers: tuple[Layer, ...] = field(default_factory=tuple)

    @classmethod
    def from_specs(cls, via: Sequence[str]) -> Transport:
        """A chain from ``--via`` values (outermost first), each checked by :func:`parse_layer`."""
        if isinstance(via, str):
            raise TypeError("from_specs takes a sequence of layer strings, not one string")
        return cls(tuple(parse_layer(text) for text in via))

    def with_env(self, env: Mapping[str, str]) -> Transport:
        """This chain plus an innermost ``env NAME=value ...`` layer, so the variables reach
        the far process (``run(env=...)`` only sets the environment of the first hop)."""
        if not env:
            return self
        bad = [name for name in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
        if bad:
            raise TransportError(f"environment variable name {bad[0]!r} cannot be passed on")
        words = ("env", *(f"{name}={value}" for name, value in sorted(env.items())))
        return Transport((*self.layers, Layer(words, LayerKind.ARGV)))

    def compose(self, argv: Sequence[str]) -> list[str]:
        """Fold from the innermost layer outwards; the result runs with no local shell."""
        out = list(argv)
        for layer in reversed(self.layers):
            out = layer.wrap(out)
        return out

    def command_line(self, argv: Sequence[str]) -> str:
        """The composed command as one line, safe to paste into bash or zsh."""
        return shell_join(self.compose(argv))

    def describe(self) -> str:
        return " → ".join(layer.describe() for layer in self.layers) or "local"

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        timeout_s: float | None = None,
        log_dir: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        name: str = "run",
        hang: HangSpec | None = None,
    ) -> ProcessResult:
        """Run the composed argv; kill its whole process group at the timeout, or (``hang``,
        a local run only) once it used no CPU time for ``hang.idle_s``.

        ``env`` and ``cwd`` apply to the first, local process only; through layers use
        :meth:`with_env` (and absolute paths). Raises TransportError before starting anything
        when an argument is longer than Linux allows.
        """
        full = self.compose(argv)
        self._check_fits(full)
        log_dir.mkdir(parents=True, exist_ok=True)
        out_path = log_dir / f"{name}.stdout"
        err_path = log_dir / f"{name}.stderr"
        start = time.monotonic()
        tag = secrets.token_hex(8)
        run_env = dict(os.environ if env is None else env)
        run_env[reaper.RUN_TAG_ENV] = tag  # inherited by everything the run starts: found after it
        reaper.become_subreaper()
        reaper.run_starting()
        with _private_log(out_path) as out, _private_log(err_path) as err:
            proc = self._start(full, out, err, run_env, cwd)
            watch = HangWatch(proc.pid, hang) if hang is not None and not self.layers else None
            peak = PeakWatch(proc.pid) if not self.layers else None
            timed_out, killed = _wait_and_end_leftovers(
                proc, stdin, timeout_s, tag, log_dir / f"{name}.killed", watch, peak
            )
        return ProcessResult(
            argv=tuple(full),
            returncode=proc.returncode,
            timed_out=timed_out,
            elapsed_s=time.monotonic() - start,
            stdout_path=out_path,
            stderr_path=err_path,
            killed=tuple(killed),
            hung_s=None if watch is None or watch.hung_for is None else round(watch.hung_for, 1),
            peak_rss_bytes=(peak.peak_bytes or None) if peak is not None else None,
        )

    def _start(
        self,
        full: list[str],
        out: IO[bytes],
        err: IO[bytes],
        env: dict[str, str],
        cwd: Path | None,
    ) -> subprocess.Popen[bytes]:
        """Start ``full`` in a session of its own; a start that fails ends the in-flight count."""
        try:
            return subprocess.Popen(
                full,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            reaper.run_ended()
            raise TransportError(
                f"cannot start {full[0]!r} (via {self.describe()}): {exc.strerror}"
            ) from None

    def run_agent(
        self,
        python: str,
        module: str,
        params: dict[str, Any],
        *,
        timeout_s: float,
        log_dir: Path,
        env: dict[str, str] | None = None,
        name: str = "agent",
        blobs: BlobSink | None = None,
    ) -> dict[str, Any]:
        """Ship ``module`` to ``python -`` through the chain and return its framed result;
        the content it sends back in blob frames is written into ``blobs`` as it is read."""
        bundle: Bundle = build_bundle(module, params, deadline_s=timeout_s)
        result = self.run(
            [python, "-"],
            stdin=bundle.source,
            timeout_s=timeout_s + 5,
            log_dir=log_dir,
            env=env,
            name=name,
        )
        payload = read_reply(
            result.stdout_path, bundle.nonce, blobs, f"{python} via {self.describe()}"
        )
        if payload is None:
            why = "timed out" if result.timed_out else f"exit code {result.returncode}"
            if result.returncode == 255 and self.layers and self.layers[0].tool == "ssh":
                why += " (ssh itself failed)"
            tail = result.stderr_tail(5).replace("\n", " | ")
            raise TransportError(
                f"no result from {python} via {self.describe()}: {why}; "
                f"stderr tail: {tail or '(empty)'}; full log: {result.stderr_path}"
            )
        if "__agent_error__" in payload:
            raise TransportError(
                f"agent {module} failed in {python} via {self.describe()}: "
                f"{payload['__agent_error__']}; full log: {result.stderr_path}"
            )
        return payload

    def _check_fits(self, full: Sequence[str]) -> None:
        longest = max(full, key=lambda w: len(os.fsencode(w)), default="")
        size = len(os.fsencode(longest))
        if size > MAX_ARG_BYTES:
            raise TransportError(
                f"the command composed via {self.describe()} has an argument of {size} bytes; "
                f"Linux allows {MAX_ARG_BYTES} per argument (shell layers quote the whole "
                "inner command into one): pass large data on stdin or in a file"
            )


def _wait_and_end_leftovers(
    proc: subprocess.Popen[bytes],
    stdin: bytes,
    timeout_s: float | None,
    tag: str,
    killed_path: Path,
    watch: HangWatch | None = None,
    peak: PeakWatch | None = None,
) -> tuple[bool, list[str]]:
    """Feed and wait for ``proc`` (killing its group at the timeout or on any exception),
    then end what it left behind, listed in ``killed_path``; whether it timed out, and the
    ``pid command`` of each process ended."""
    with _LIVE_LOCK:
        _LIVE[proc.pid] = proc
    since = reaper.run_started(proc.pid, tag)
    killed: list[str] = []
    try:
        timed_out = not _feed_and_wait(proc, stdin, timeout_s, watch, peak)
        if timed_out:
            if watch is not None and watch.hung_for is not None:
                _ask_for_stacks(proc, watch.spec.stack_signal)
            _kill_group(proc)
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.pop(proc.pid, None)
        killed = reaper.end_leftovers(proc.pid, tag, since)
        reaper.run_ended(proc.pid)
        if killed:
            with contextlib.suppress(OSError):
                killed_path.write_text("".join(f"{line}\n" for line in killed), encoding="utf-8")
    return timed_out, killed


def _feed_and_wait(
    proc: subprocess.Popen[bytes],
    data: bytes,
    timeout_s: float | None,
    watch: HangWatch | None = None,
    peak: PeakWatch | None = None,
) -> bool:
    """Feed stdin and wait for the exit; False when ``timeout_s`` passed first, or ``watch``
    saw the run hang (``watch.hung_for``). ``peak`` reads the group's memory meanwhile.

    Both happen in threads: the write must not block past the timeout (a hop that hangs
    before reading must not hold a large program's write forever; a reader that went away
    is ignored), and a blocking ``waitpid`` returns the moment the child exits, where
    ``Popen.wait(timeout=...)`` polls with sleeps of up to 50 ms.
    """

    def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            proc.stdin.write(data)
        with contextlib.suppress(OSError):
            proc.stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    waiter = threading.Thread(target=proc.wait, daemon=True)
    feeder.start()
    waiter.start()
    if watch is None and peak is None:
        waiter.join(timeout_s)
        return not waiter.is_alive()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    tick = PEAK_TICK_S if peak is not None else TICK_S
    next_hang_read = time.monotonic() + TICK_S
    while True:
        if peak is not None:
            peak.read()
        wait = tick if deadline is None else min(tick, deadline - time.monotonic())
        waiter.join(max(0.0, wait))
        if not waiter.is_alive():
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if watch is not None and time.monotonic() >= next_hang_read:
            next_hang_read = time.monotonic() + TICK_S
            if watch.hung():
                return False


def _ask_for_stacks(proc: subprocess.Popen[bytes], sig: int | None) -> None:
    """Before a hung run is killed: ``sig`` to its first process (the probe writes every
    thread's stack to stderr on it), and a moment to write them."""
    if sig is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STACKS_WAIT_S)


STACKS_WAIT_S = 2.0


# Processes started by Transport.run that have not been reaped yet (several at once when the
# trials of one round run in threads): kill_running() ends them all, e.g. on Ctrl-C.
_LIVE: dict[int, subprocess.Popen[bytes]] = {}
_LIVE_LOCK = threading.Lock()


def kill_running() -> int:
    """Kill the process group of every program Transport.run is waiting for (in any thread);
    returns how many. The waiting calls then return as killed."""
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return len(procs)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
