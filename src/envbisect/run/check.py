"""``envbisect check`` as a core function: the current state measured against a
threshold (``check`` → ``CheckResult``); logs kept only when something failed."""

from __future__ import annotations

import shutil
import statistics
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from envbisect.model.argvmap import PathMapper
from envbisect.model.failure import Failure
from envbisect.run import cmdcheck
from envbisect.run.launch import RunLog, RunSpec, SmokeCommand, run_once
from envbisect.search.verdict import Judge, Noise, Verdict
from envbisect.transport import Transport


class CheckVerdict(str, Enum):
    """What one ``check`` says: at or above the threshold, below it, or no number (exit
    0, 1, 125: ``git bisect run``'s codes)."""

    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CheckResult:
    """One measurement of the current state against a threshold."""

    threshold: float
    samples: tuple[float, ...]
    failure: Failure | None
    log_dir: Path | None
    # When it failed: the command's own first error line and how it ran (cmdcheck).
    detail: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def verdict(self) -> CheckVerdict:
        if self.failure is not None or self.median is None:
            return CheckVerdict.SKIP
        return CheckVerdict.GOOD if self.median >= self.threshold else CheckVerdict.BAD

    @property
    def noise(self) -> float:
        """Per-sample spread (log scale) of these samples, with the engine's prior."""
        return Noise.from_groups([self.samples]).sigma

    @property
    def within_noise(self) -> bool:
        """The median sits inside the noise band of the threshold: the verdict may flip."""
        if self.verdict is CheckVerdict.SKIP:
            return False
        judge = Judge(self.threshold, Noise.from_groups([self.samples]))
        return judge.verdict(self.samples) is Verdict.UNRESOLVED

    @property
    def exit_code(self) -> int:
        return {CheckVerdict.GOOD: 0, CheckVerdict.BAD: 1}.get(self.verdict, 125)


def check(
    smoke: SmokeCommand,
    *,
    threshold: float,
    transport: Transport,
    python: str,
    repeats: int = 3,
    timeout_s: float = 600,
    log_root: Path | None = None,
) -> CheckResult:
    """Measure the current state ``repeats`` times; logs kept only when something failed.
    A bare ``python…`` program in the command runs ``python``, never the PATH's first."""
    log_dir = Path(tempfile.mkdtemp(prefix="envbisect-check-", dir=log_root))
    samples: list[float] = []
    failure: Failure | None = None
    k = 0
    while len(samples) < repeats:
        k += 1
        spec = RunSpec(
            transport=transport,
            python=python,
            env=None,
            cwd=None,
            timeout_s=timeout_s,
            log_dir=log_dir,
            name=f"run-{k}",
            samples=repeats - len(samples),
            # A bare ``python`` in the command is this state's interpreter, as in ``run``.
            argv_map=lambda argv: PathMapper().argv(argv, python),
        )
        runs: list[RunLog] = []
        m = run_once(smoke, spec, record=runs.append)
        if not m.ok:
            failure = m.failure
            break
        samples.extend(m.samples)
    if failure is None:
        shutil.rmtree(log_dir, ignore_errors=True)
        return CheckResult(threshold, tuple(samples), None, None)
    detail = None
    if runs and not smoke.builtin:
        last = runs[-1]
        facts = cmdcheck.RunFacts(
            argv=last.launch.argv,
            cwd=Path.cwd(),
            interpreter=last.launch.program or python,
            started=last.launch.started,
            exit_status=last.launch.exit_status,
            stdout=last.launch.stdout.decode("utf-8", "replace"),
            stderr=last.launch.stderr.decode("utf-8", "replace"),
            failure=failure or Failure.crash("?"),
        )
        detail = cmdcheck.message("current", facts)
    return CheckResult(threshold, tuple(samples), failure, log_dir, detail)
