"""Whether the user's command can run at all, said in the command's own words.

A bisection over states that all fail the same way measures nothing: every "culprit" it
names is an accident of envbisect's own set-up or of the command line. So the endpoints
are judged first (``runner`` calls :func:`good_stops` after the good endpoint and
:func:`same_failure` once both are measured): a command that cannot start in the good state
(its program or a file it names is missing, an import fails at start, it exits 2 or
126/127) or gives no throughput there, or that fails the same way in both endpoints, ends the
run with its first error line plus the argv, cwd and interpreter it ran with
(``EndpointGuard``, which ``trial`` feeds each endpoint's runs).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from envbisect.model.errors import CommandFailed
from envbisect.model.failure import CRASH_KINDS, Failure, FailureKind
from envbisect.search.crashes import GOOD_TRIES

# Exit statuses that mean "did not start": usage error (python: can't open file; argparse),
# not executable, not found.
CANNOT_START_STATUS = (2, 126, 127)
CANNOT_START_TEXT = re.compile(
    r"ModuleNotFoundError|ImportError|FileNotFoundError|No such file or directory|"
    r"can't open file|command not found|Permission denied"
)
_ERRORISH = re.compile(r"error|can't|cannot|not found|no such|denied|fatal", re.IGNORECASE)


@dataclass(frozen=True)
class RunFacts:
    """What one run of the command left: how it was started and what it said."""

    argv: tuple[str, ...]
    cwd: Path | None
    interpreter: str
    started: bool
    exit_status: int | None
    stdout: str
    stderr: str
    failure: Failure
    log_dir: Path | None = None
    origin: str | None = None  # where the user ran it, when the state moved the cwd

    @property
    def line(self) -> str:
        """The command's own first error line (else how it ended); for a run ended by a
        timeout or as hung, how it ended: its stderr then ends with every thread's stack,
        whose first line ("Thread 0x7fa5… (most recent call first):") tells nothing."""
        if self.failure.kind is FailureKind.TIMEOUT:
            return str(self.failure)
        return first_error_line(self.stderr, self.stdout) or str(self.failure)


def first_error_line(stderr: str, stdout: str = "") -> str:
    """The line a user would quote: a traceback's exception line, else the first stderr
    line that reads like an error, else the first stderr line, else stdout's last."""
    lines = _without_warnings(ln.rstrip() for ln in stderr.splitlines() if ln.strip())
    if "Traceback (most recent call last):" in lines:
        last = len(lines) - 1 - lines[::-1].index("Traceback (most recent call last):")
        for ln in lines[last + 1 :]:
            if not ln.startswith((" ", "\t")):
                return ln[:300]
    for ln in lines:
        if _ERRORISH.search(ln):
            return ln[:300]
    if lines:
        return lines[0][:300]
    out = [ln.rstrip() for ln in stdout.splitlines() if ln.strip()]
    return out[-1][:300] if out else ""


_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")


def _without_warnings(lines: Iterable[str]) -> list[str]:
    """Lines with Python's warnings left out (``file:line: XWarning: text`` and the source
    line shown under it): a warning is never the line a failure is told by."""
    kept: list[str] = []
    after_warning = False
    for ln in lines:
        if _WARNING.match(ln):
            after_warning = True
            continue
        if after_warning and ln.startswith((" ", "\t")):
            continue
        after_warning = False
        kept.append(ln)
    return kept


def no_metric(failure: Failure | None) -> bool:
    """True when the run ended but no throughput could be read from it."""
    return failure is not None and str(failure).startswith("no metric")


def good_stops(run: RunFacts) -> bool:
    """True when the good endpoint's run shows the command cannot run at all."""
    if run.failure.kind is FailureKind.BUILD:
        return False  # the state, not the command: said as unfaithful, with its reason
    if not run.started or run.exit_status in CANNOT_START_STATUS or no_metric(run.failure):
        return True
    return bool(CANNOT_START_TEXT.search(run.line))


def same_failure(good: RunFacts, bad: RunFacts) -> bool:
    """True when both endpoints failed the same way: the same kind of failure (a crash is
    not a timeout) with the same first error line."""
    if FailureKind.BUILD in (good.failure.kind, bad.failure.kind):
        return False
    if good.failure.kind is not bad.failure.kind:
        return False
    return _shape(good.line) == _shape(bad.line)


class EndpointGuard:
    """The endpoints' runs as they come (``runner`` measures them first): stops the run
    when the good endpoint cannot run the command, or both endpoints fail the same way.

    A crash of the good state is only "the same way" once it crashed in every one of
    ``GOOD_TRIES`` runs: the field's race crashes a warm cache now and then, with the very
    error the bad state crashes with every time (the search's crash regime judges that,
    ``search.crashes``). Found on the H100: a good state that crashed once and a bad state
    that hung ended "fails the same way in both endpoints"."""

    def __init__(self) -> None:
        self.failed: dict[str, RunFacts] = {}  # "good"/"bad" → its last failed run
        self.good = [0, 0]  # the good endpoint's processes: failed, clean

    def saw(self, side: str, processes: int, failed: RunFacts | None) -> None:
        """``processes`` more runs of endpoint ``side``; ``failed``: the last, when the call
        failed. Raises CommandFailed to stop the run."""
        if side == "good":
            self.good[0 if failed is not None else 1] += processes
        if failed is None:
            return
        self.failed[side] = failed
        if side == "good" and good_stops(failed):
            raise CommandFailed(message("good", failed))
        if side == "bad" and no_metric(failed.failure) and "good" not in self.failed:
            raise CommandFailed(message("bad", failed))
        good, bad = self.failed.get("good"), self.failed.get("bad")
        if good is None or bad is None or not same_failure(good, bad):
            return
        crashes, clean = self.good
        if clean or (good.failure.kind in CRASH_KINDS and crashes < GOOD_TRIES):
            return  # a crash now and then: the search's crash regime judges it
        raise CommandFailed(message("good", good, both=True))


def _shape(line: str) -> str:
    # Paths of two worktrees and numbers (pids, addresses) differ between the endpoints.
    line = re.sub(r"/\S*worktrees/[^/\s'\"]+", "<worktree>", line)
    return re.sub(r"0x[0-9a-f]+|\d+", "N", line)


def message(state: str, run: RunFacts, *, both: bool = False) -> str:
    """``the smoke command fails in the good state: <line>`` and how it was run."""
    how = "fails the same way in both endpoints" if both else f"fails in the {state} state"
    if no_metric(run.failure) and run.started and run.exit_status == 0:
        how = (
            "gives no throughput in both endpoints"
            if both
            else f"gives no throughput in the {state} state"
        )
        line = f"{run.failure}; its last line: {first_error_line('', run.stdout) or '(no output)'}"
    else:
        line = run.line
    parts = [
        f"the smoke command {how}: {line}",
        f"  argv: {shlex.join(run.argv)}",
        f"  cwd: {run.cwd if run.cwd is not None else '(the target default)'}"
        + (
            f" (where you ran it, {run.origin}, in the state's worktree)"
            if run.origin and run.cwd is not None and str(run.cwd) != run.origin
            else ""
        ),
        f"  interpreter: {run.interpreter}",
        "  exit: " + (f"{run.exit_status}" if run.started else "did not start"),
    ]
    if run.log_dir is not None:
        parts.append(f"  logs: {run.log_dir}")
    if _remote_in_worktree(run):
        parts.append(
            "  hint: through --via/--target the command runs in the repo's worktree on the "
            "target, not where you typed it (this machine's cwd names nothing there): type "
            "its paths relative to the repo (python train.py) or absolute"
        )
    return "\n".join(parts)


def _remote_in_worktree(run: RunFacts) -> bool:
    """A remote run (no local origin) placed in a worktree that could not find a path."""
    if run.origin is not None or run.cwd is None or "/worktrees/" not in f"{run.cwd}/":
        return False
    return bool(re.search(r"can't open file|No such file or directory", run.line))
