"""The session log's event types write exactly the JSON lines the log has always held."""

from __future__ import annotations

import json
from pathlib import Path

from envbisect.model.events import (
    CalibrationEvent,
    CalibrationRefusedEvent,
    EndEvent,
    InterruptedEvent,
    RemoteEvent,
    ResetEvent,
    ResumedEvent,
    StartEvent,
    TrialRecord,
    VerdictEvent,
    WorktreeEvent,
)
from envbisect.model.session import Session


def test_each_event_writes_the_keys_of_the_log_format_in_order() -> None:
    """The dict literals the writers used before the types existed, key order included."""
    layers = [{"argv": ["ssh", "box"], "kind": "ssh"}]
    trials = [{"index": 1, "verdict": "good"}]
    expected = [
        (StartEvent(1.5, {"good": "g.yaml", "repeats": 3}),
         {"type": "start", "time": 1.5, "good": "g.yaml", "repeats": 3}),
        (ResumedEvent(2.0), {"type": "resumed", "time": 2.0}),
        (ResetEvent(3.0), {"type": "reset", "time": 3.0}),
        (InterruptedEvent(), {"type": "interrupted"}),
        (VerdictEvent(4, "bad", 9.5, "1.80× faster than the good state"),
         {"type": "verdict", "index": 4, "verdict": "bad", "median": 9.5,
          "outlier": "1.80× faster than the good state"}),
        (VerdictEvent(4, "good", None), {"type": "verdict", "index": 4, "verdict": "good",
                                         "median": None, "outlier": None}),
        (VerdictEvent(5, "bad", 1.0, judged_outlier=False),
         {"type": "verdict", "index": 5, "verdict": "bad", "median": 1.0}),
        (EndEvent("error", "boom"), {"type": "end", "outcome": "error", "message": "boom"}),
        (EndEvent("not-reproduced", "why", culprits=[]),
         {"type": "end", "outcome": "not-reproduced", "culprits": [], "message": "why"}),
        (EndEvent("found", "m", culprits=["env:A"], trials=trials),
         {"type": "end", "outcome": "found", "culprits": ["env:A"], "message": "m",
          "trials": trials}),
        (WorktreeEvent("/r", "/w"), {"type": "worktree", "repo": "/r", "path": "/w"}),
        (RemoteEvent("/root", "python3", layers),
         {"type": "remote", "root": "/root", "python": "python3", "layers": layers}),
        (CalibrationEvent("gpu0", (1.0, 2.0), 1.5, 1.0, "reference"),
         {"type": "calibration", "worker": "gpu0", "samples": [1.0, 2.0], "median": 1.5,
          "factor": 1.0, "decision": "reference"}),
        (CalibrationRefusedEvent("gpu1", [3.0], "too slow"),
         {"type": "calibration-refused", "worker": "gpu1", "samples": [3.0],
          "reason": "too slow"}),
    ]  # fmt: skip
    for event, want in expected:
        assert list(event.to_dict().items()) == list(want.items()), event


def test_a_trial_round_trips_and_leaves_out_what_it_does_not_have() -> None:
    plain = TrialRecord(1, "k", ("a",), (("git:/r", 2),), (1.0,), None, "t/001")
    assert plain.to_dict() == {
        "type": "trial", "index": 1, "key": "k", "applied": ["a"],
        "positions": [["git:/r", 2]], "samples": [1.0], "failure": None,
        "log_dir": "t/001", "notes": [], "untestable": False,
    }  # fmt: skip
    full = TrialRecord(
        2, "k", (), (), (1.0, 2.0), "crash", "t/002", ("n",), True, "gpu0", 3, 2, 1, (True, False)
    )
    assert TrialRecord.from_event(json.loads(json.dumps(full.to_dict()))) == full


def test_a_log_written_before_the_types_reads_as_before(tmp_path: Path) -> None:
    """Old lines (dicts written by hand then) read back through the same readers."""
    root = tmp_path / "s"
    root.mkdir()
    lines = [
        {"type": "start", "time": 1.0, "threshold": 10.0, "smoke": ["x"]},
        {"type": "trial", "index": 1, "key": "k1", "applied": [], "positions": [],
         "samples": [12.0], "failure": None, "log_dir": "t/001", "notes": [],
         "untestable": False},
        {"type": "verdict", "index": 1, "verdict": "good", "median": 12.0, "outlier": None},
        {"type": "worktree", "repo": "/r", "path": "/w"},
        {"type": "end", "outcome": "not-reproduced", "culprits": [], "message": "m"},
    ]  # fmt: skip
    (root / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    session = Session.existing(root)
    assert session.header() == lines[0]
    assert [t.samples for t in session.trials()] == [(12.0,)]
    assert session.verdicts()[1]["verdict"] == "good"
    assert session.worktrees() == [(Path("/r"), Path("/w"))]
    assert session.end_event() == lines[-1] and session.finished()
    # And a line written now is the same line.
    session.append(VerdictEvent(1, "good", 12.0, None))
    assert json.loads(session.log_path.read_text().splitlines()[-1]) == lines[2]
