"""Progress as text: the callback type every part of a run reports through, and the
engine's events as lines (``ProgressLines``), each verdict logged and outliers flagged."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from envbisect.model.events import VerdictEvent
from envbisect.model.session import Session
from envbisect.run.result import trial_number, trial_outlier
from envbisect.search import Event, EventKind, Trial
from envbisect.search.verdict import Noise
from envbisect.search.wording import Say

Progress = Callable[[str], None]
# What ``runs`` more crash-counting runs, ``width`` at a time, may take (None: not known yet).
RunCost = Callable[[int, int], float | None]


def quiet(_line: str) -> None:
    """The progress callback that says nothing."""
    return None


def both_handlers(
    first: Callable[[Event], None], then: Callable[[Event], None]
) -> Callable[[Event], None]:
    """One engine progress handler that feeds ``first``, then ``then``."""

    def both(event: Event) -> None:
        first(event)
        then(event)

    return both


class ProgressLines:
    """The engine's progress events as lines, numbered as the session numbers trials; every
    verdict is logged (``envbisect log`` prints what ``run`` printed) and outliers flagged."""

    def __init__(
        self,
        out: Progress,
        session: Session,
        numbers: Mapping[str, int],
        cost: RunCost | None = None,
    ) -> None:
        self.out = out
        self.cost = cost  # a crash-counting phase's lines say their expected time
        self.session = session
        self.numbers = numbers  # the session's trial numbers (filled as trials are claimed)
        self.states: dict[frozenset[str], Trial] = {}  # the last trial of each whole state
        self.all: frozenset[str] | None = None
        self.groups: dict[int, tuple[float, ...]] = {}

    def number(self, trial: Trial) -> int:
        return trial_number(trial, self.numbers)

    def __call__(self, event: Event) -> None:
        message = event.message
        trial = event.trial
        if trial is not None:
            number = self.number(trial)
            prefix = f"trial {trial.index}"
            if message.startswith(prefix):
                message = f"trial {number}" + message[len(prefix) :]
            if event.kind is EventKind.TRIAL_FINISHED:
                flag = self._finished(trial, number)
                if flag:
                    message += f" — outlier: {flag}; see its trial.json"
        reason = event.reason
        if reason is not None and reason.code is Say.RATE_COST and self.cost is not None:
            seconds = self.cost(reason.data["left"], reason.data["width"])
            if seconds is not None:
                message += f"; about {_duration(seconds)} at the pace so far"
        left = f" (about {event.trials_left} trials left)" if event.trials_left is not None else ""
        self.out(f"{message}{left}")

    def _finished(self, trial: Trial, number: int) -> str | None:
        """Log the trial's verdict; its outlier flag, if any."""
        if trial.index == 2 and not trial.state.positions:
            self.all = trial.state.applied
        if not trial.failure:
            self.groups[number] = tuple(trial.samples)
        if not trial.state.positions:
            self.states[trial.state.applied] = trial
        endpoint = not trial.state.applied or trial.state.applied == self.all
        flag = None
        if not endpoint and not trial.failure:
            sigma = Noise.from_groups(self.groups.values()).sigma
            good = self.states.get(frozenset())
            bad = self.states.get(self.all) if self.all is not None else None
            flag = trial_outlier(trial, good, bad, sigma) if good is not None else None
        self.session.append(VerdictEvent(number, trial.verdict.value, trial.median, flag))
        return flag


def _duration(seconds: float) -> str:
    """``under 1 s``, ``40 s``, ``3.5 min``, ``1.2 h``."""
    if seconds < 1:
        return "under 1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
