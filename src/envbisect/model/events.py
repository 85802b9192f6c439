"""The session log's events: one frozen dataclass per ``type`` of ``log.jsonl`` line.

Writers build these and hand them to ``Session.append``; ``to_dict`` gives exactly the JSON
object the log has always held (keys, their order, which keys are left out), so logs written
before these types existed read as they always did. Readers still take the log's dicts
(``Session.events``); ``TrialRecord.from_event`` reads a trial back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar


@dataclass(frozen=True)
class SessionEvent:
    """One line of the session log; ``TYPE`` is its ``type``."""

    TYPE: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """The line as JSON-ready data, ``type`` first."""
        return {"type": self.TYPE}


@dataclass(frozen=True)
class StartEvent(SessionEvent):
    """A run started a session: when, and the run's header (endpoints, threshold, smoke)."""

    TYPE: ClassVar[str] = "start"
    time: float
    header: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "time": self.time, **self.header}


@dataclass(frozen=True)
class ResumedEvent(SessionEvent):
    """A run continued the session (``--resume``)."""

    TYPE: ClassVar[str] = "resumed"
    time: float

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "time": self.time}


@dataclass(frozen=True)
class ResetEvent(SessionEvent):
    """``envbisect reset`` put the session's files back and removed what it made."""

    TYPE: ClassVar[str] = "reset"
    time: float

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "time": self.time}


@dataclass(frozen=True)
class InterruptedEvent(SessionEvent):
    """The run was interrupted (Ctrl-C, SIGTERM): the session can be resumed."""

    TYPE: ClassVar[str] = "interrupted"


@dataclass(frozen=True)
class VerdictEvent(SessionEvent):
    """How a trial was judged, as ``run`` printed it (``envbisect log`` prints it again)."""

    TYPE: ClassVar[str] = "verdict"
    index: int
    verdict: str
    median: float | None
    outlier: str | None = None
    # The engine's verdicts say whether the state is an outlier (null: it is not); the
    # steps below the engine (hunks, packages) do not judge that and log no ``outlier``.
    judged_outlier: bool = True

    def to_dict(self) -> dict[str, Any]:
        out = {
            "type": self.TYPE,
            "index": self.index,
            "verdict": self.verdict,
            "median": self.median,
        }
        return {**out, "outlier": self.outlier} if self.judged_outlier else out


@dataclass(frozen=True)
class EndEvent(SessionEvent):
    """The run ended: its outcome (``found``, ``error``, ``refused``, ...) and message; a run
    that got as far as a search also names its culprits, and a finished one its trials."""

    TYPE: ClassVar[str] = "end"
    outcome: str
    message: str
    culprits: Sequence[str] | None = None
    trials: Sequence[Mapping[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE, "outcome": self.outcome}
        if self.culprits is not None:
            out["culprits"] = list(self.culprits)
        out["message"] = self.message
        if self.trials is not None:
            out["trials"] = [dict(t) for t in self.trials]
        return out


@dataclass(frozen=True)
class WorktreeEvent(SessionEvent):
    """A git worktree the run made (``reset`` removes it)."""

    TYPE: ClassVar[str] = "worktree"
    repo: str
    path: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, "repo": self.repo, "path": self.path}


@dataclass(frozen=True)
class RemoteEvent(SessionEvent):
    """The session dir on a remote target, and how to reach it (``reset`` cleans it)."""

    TYPE: ClassVar[str] = "remote"
    root: str
    python: str
    layers: Sequence[Mapping[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "root": self.root,
            "python": self.python,
            "layers": [dict(layer) for layer in self.layers],
        }


@dataclass(frozen=True)
class CalibrationEvent(SessionEvent):
    """A worker measured on the good state: its median, scale factor and the decision."""

    TYPE: ClassVar[str] = "calibration"
    worker: str
    samples: Sequence[float]
    median: float
    factor: float
    decision: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "worker": self.worker,
            "samples": list(self.samples),
            "median": self.median,
            "factor": self.factor,
            "decision": self.decision,
        }


@dataclass(frozen=True)
class CalibrationRefusedEvent(SessionEvent):
    """A worker left out by calibration: too far off the reference worker."""

    TYPE: ClassVar[str] = "calibration-refused"
    worker: str | None
    samples: Sequence[float]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "worker": self.worker,
            "samples": list(self.samples),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class TrialRecord(SessionEvent):
    """One measured trial as logged (``trial``; a state's later sample batches are further
    ``trial`` events with the same index: ``Session.trials`` merges them)."""

    TYPE: ClassVar[str] = "trial"

    index: int
    key: str
    applied: tuple[str, ...]
    positions: tuple[tuple[str, int], ...]
    samples: tuple[float, ...]
    failure: str | None
    log_dir: str
    notes: tuple[str, ...] = ()
    untestable: bool = False  # not realized as asked (e.g. "state not faithful: ...")
    worker: str | None = None  # the worker that measured it, when several ran
    round: int | None = None  # the search's round, when known
    runs: int = 0  # processes run (a crash ends one)
    crashes: int = 0
    contended: tuple[bool, ...] = ()  # per sample: other processes loaded the machine

    @classmethod
    def from_event(cls, ev: dict[str, Any]) -> TrialRecord:
        return cls(
            index=int(ev["index"]),
            key=str(ev["key"]),
            applied=tuple(ev.get("applied") or ()),
            positions=tuple((str(u), int(i)) for u, i in ev.get("positions") or ()),
            samples=tuple(float(s) for s in ev.get("samples") or ()),
            failure=ev.get("failure"),
            log_dir=str(ev.get("log_dir") or ""),
            notes=tuple(ev.get("notes") or ()),
            untestable=bool(ev.get("untestable")),
            worker=ev.get("worker"),
            round=ev.get("round"),
            runs=int(ev.get("runs") or 0),
            crashes=int(ev.get("crashes") or 0),
            contended=tuple(bool(x) for x in ev.get("contended") or ()),
        )

    def merged(self, more: TrialRecord) -> TrialRecord:
        """This trial with a later batch of samples of the same state appended."""
        return replace(
            self,
            samples=self.samples + more.samples,
            failure=more.failure or self.failure,
            notes=tuple(dict.fromkeys(self.notes + more.notes)),
            untestable=self.untestable or more.untestable,
            worker=self.worker or more.worker,
            round=self.round if self.round is not None else more.round,
            runs=self.runs + more.runs,
            crashes=self.crashes + more.crashes,
            contended=self.contended + more.contended,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "index": self.index,
            "key": self.key,
            "applied": list(self.applied),
            "positions": [list(p) for p in self.positions],
            "samples": list(self.samples),
            "failure": self.failure,
            "log_dir": self.log_dir,
            "notes": list(self.notes),
            "untestable": self.untestable,
            **({"worker": self.worker} if self.worker is not None else {}),
            **({"round": self.round} if self.round is not None else {}),
            **({"runs": self.runs, "crashes": self.crashes} if self.runs else {}),
            **({"contended": list(self.contended)} if any(self.contended) else {}),
        }
