"""Everything ``envbisect run`` was asked to do (``RunOptions``) and the combinations
refused before anything runs (``validate_options``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from envbisect.model.errors import UsageError
from envbisect.model.kernels import ProfileRequest
from envbisect.model.metric import Threshold
from envbisect.run.launch import SmokeCommand
from envbisect.search import SearchSettings
from envbisect.transport import Transport

if TYPE_CHECKING:
    from envbisect.model.config import Config
    from envbisect.run.workers import Worker


@dataclass(frozen=True)
class RunOptions:
    """Everything ``envbisect run`` was asked to do."""

    good: Path
    bad: Path | None
    smoke: SmokeCommand
    python: str
    # A throughput, a fraction of the measured good state (--until 70%), or the default.
    goal: Threshold = field(default_factory=Threshold)
    transport: Transport = field(default_factory=Transport)
    session_dir: Path = Path(".envbisect/session")
    resume: bool = False
    fresh: bool = False
    repeats: int = 3
    max_samples: int = 9
    max_trials: int | None = None
    timeout_s: float = 600
    on_crash: str = "bad"
    crash_runs: int = 0  # runs of a bad endpoint that is not slow, looking for a crash
    crash_rate_runs: int = 5  # runs of a culprit's state that crashed, for its rate
    # of those, how many run at once (--rate-runs-at-once N; None: auto, run.together)
    rate_together: int | None = None
    hang_after_s: float = 0.0  # end a run that used no CPU time this long (0: off)
    find_all: bool = False  # go on after the first cause while reverting it is not enough
    recheck_loaded: bool = False  # measure again a verdict taken under passing load
    # OMP_NUM_THREADS of a user's command's trials: "auto" (the free cores when the machine
    # is busy at the start), "off" (as the environment has it), or a number.
    cpu_threads: str = "auto"
    config: Config | None = None
    cwd: Path | None = None
    workers: tuple[Worker, ...] = ()  # (): one, the target
    trust: tuple[Path, ...] = ()  # foreign manifests the user accepted (--trust)
    profile: ProfileRequest | None = None  # --profile: the culprit's evidence profiled

    def at_once_one_why(self) -> str | None:
        """Why ``--rate-runs-at-once auto`` runs one at a time here (None: it need not)."""
        if self.workers:
            return "with workers each run takes a worker of its own"
        if self.transport.layers:
            return "a target behind --via/--target keeps its caches out of reach for copies"
        return None

    def search_settings(self, ordered: Mapping[str, Sequence[str]], workers: int) -> SearchSettings:
        """What the engine is asked: these options, the ordered units, ``workers`` at once."""
        return SearchSettings(
            threshold=self.goal.value,
            threshold_fraction=self.goal.fraction,
            repeats=self.repeats,
            max_samples=self.max_samples,
            max_trials=self.max_trials,
            ordered=ordered,
            on_failure=self.on_crash,
            workers=workers,
            crash_runs=self.crash_runs,
            crash_rate_runs=self.crash_rate_runs,
            rate_together=self.rate_together or 1,
            find_all=self.find_all,
            recheck_loaded=self.recheck_loaded,
        )


def validate_options(options: RunOptions) -> None:
    """Bad combinations → UsageError (before anything runs)."""
    argv = options.smoke.argv
    if argv and not options.transport.layers and not _findable(argv[0], options):
        raise UsageError(f"smoke command {argv[0]!r}: no such program (on PATH or as a file)")
    if options.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    if options.on_crash not in ("bad", "skip"):
        raise UsageError("--on-crash must be 'bad' or 'skip'")
    if options.timeout_s <= 0:
        raise UsageError("--timeout must be positive")
    if options.resume and options.fresh:
        raise UsageError("--resume and --fresh exclude each other: continue or replace")
    if options.max_trials is not None and options.max_trials < 2:
        raise UsageError("--max-trials must be at least 2 (the two endpoints come first)")
    if (options.rate_together or 0) > 1 and options.workers:
        raise UsageError(
            "--rate-runs-at-once runs several processes on the one target; with workers "
            "each run takes a worker of its own: leave it at 1"
        )
    if (options.rate_together or 0) > 1 and options.transport.layers:
        raise UsageError(
            "--rate-runs-at-once needs a local target: each process gets its own copy of "
            "the compile caches, which a target behind --via/--target keeps out of reach"
        )
    if options.profile is not None and (options.smoke.builtin or not options.smoke.probe):
        raise UsageError(
            "--profile needs your own Python command under the probe (after --; "
            "not the built-in smoke test, not --no-probe)"
        )


def _findable(program: str, options: RunOptions) -> bool:
    if os.sep in program:
        base = options.cwd or Path.cwd()
        return (base / program).exists()
    path = os.environ.get("PATH", "")
    if os.path.isabs(options.python):
        path = str(Path(options.python).parent) + os.pathsep + path
    return shutil.which(program, path=path) is not None
