"""Every subprocess envbisect starts goes through here.

A Transport is a chain of layers (outermost first) in front of a target command.
``run_agent`` ships an agent bundle on stdin and reads its framed result back.
Tests replace ``Transport`` or point layers at faithful fakes on PATH.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbisect.agent.bundle import Bundle, build_bundle, find_frame
from envbisect.errors import TransportError


@dataclass(frozen=True)
class Layer:
    """One hop of a chain: an argv prefix; a ``shell`` layer takes the rest as one string."""

    argv: tuple[str, ...]
    kind: str = "argv"  # "argv" | "shell"

    def wrap(self, inner: Sequence[str]) -> list[str]:
        if self.kind == "shell":
            return [*self.argv, shlex.join(inner)]
        return [*self.argv, *inner]

    def describe(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class RunResult:
    """What one process run returned; stdout/stderr are kept in full under ``log_dir``."""

    argv: tuple[str, ...]
    returncode: int
    timed_out: bool
    elapsed_s: float
    stdout_path: Path
    stderr_path: Path

    def stdout(self) -> bytes:
        return self.stdout_path.read_bytes()

    def stderr_tail(self, lines: int = 20) -> str:
        data = self.stderr_path.read_bytes()[-65536:]
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


@dataclass(frozen=True)
class Transport:
    """A layer chain, outermost first. The empty chain runs locally."""

    layers: tuple[Layer, ...] = field(default_factory=tuple)

    def compose(self, argv: Sequence[str]) -> list[str]:
        """Fold from the innermost layer outwards; the result runs with no local shell."""
        out = list(argv)
        for layer in reversed(self.layers):
            out = layer.wrap(out)
        return out

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
    ) -> RunResult:
        """Run the composed argv; kill its whole process group at the timeout."""
        full = self.compose(argv)
        log_dir.mkdir(parents=True, exist_ok=True)
        out_path = log_dir / f"{name}.stdout"
        err_path = log_dir / f"{name}.stderr"
        start = time.monotonic()
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(
                    full,
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise TransportError(
                    f"cannot start {full[0]!r} (via {self.describe()}): {exc.strerror}"
                ) from None
            try:
                try:
                    if proc.stdin is not None:
                        proc.stdin.write(stdin)
                        proc.stdin.close()
                except BrokenPipeError:
                    pass
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            except BaseException:
                _kill_group(proc)
                raise
        return RunResult(
            argv=tuple(full),
            returncode=proc.returncode,
            timed_out=timed_out,
            elapsed_s=time.monotonic() - start,
            stdout_path=out_path,
            stderr_path=err_path,
        )

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
    ) -> dict[str, Any]:
        """Ship ``module`` to ``python -`` through the chain and return its framed result."""
        bundle: Bundle = build_bundle(module, params, deadline_s=timeout_s)
        result = self.run(
            [python, "-"],
            stdin=bundle.source,
            timeout_s=timeout_s + 5,
            log_dir=log_dir,
            env=env,
            name=name,
        )
        payload = find_frame(result.stdout(), bundle.nonce)
        if payload is None:
            why = "timed out" if result.timed_out else f"exit code {result.returncode}"
            if result.returncode == 255 and self.layers and self.layers[0].argv[0] == "ssh":
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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
