from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envbisect.model.errors import SessionError
from envbisect.model.events import EndEvent, TrialRecord, VerdictEvent
from envbisect.model.session import FileJournal, Session, state_key


def test_swap_then_restore_puts_bytes_mode_and_mtime_back(tmp_path: Path) -> None:
    f = tmp_path / "cfg.txt"
    f.write_bytes(b"original\n")
    os.chmod(f, 0o640)
    os.utime(f, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    journal = FileJournal(tmp_path / "s" / "journal.jsonl", tmp_path / "s" / "backups")
    (tmp_path / "s").mkdir()
    journal.swap(f, b"patched\n")
    journal.swap(f, b"patched twice\n")  # the first original stays the one to restore
    assert f.read_bytes() == b"patched twice\n"
    assert journal.restore() == [f]
    assert f.read_bytes() == b"original\n"
    assert f.stat().st_mode & 0o777 == 0o640
    assert f.stat().st_mtime_ns == 1_600_000_000_000_000_000
    assert journal.restore() == []  # idempotent


def test_swap_of_absent_file_and_removal(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    journal = FileJournal(tmp_path / "s" / "journal.jsonl", tmp_path / "s" / "backups")
    new = tmp_path / "new.txt"
    gone = tmp_path / "gone.txt"
    gone.write_text("keep me")
    journal.swap(new, b"created")
    journal.swap(gone, None)
    assert new.read_bytes() == b"created" and not gone.exists()
    journal.restore()
    assert not new.exists()
    assert gone.read_text() == "keep me"


def test_journal_restores_after_kill_9_of_the_swapping_process(tmp_path: Path) -> None:
    f = tmp_path / "loose.py"
    f.write_text("FAST = True\n")
    session_dir = tmp_path / "session"
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from envbisect.model.session import Session
        s = Session.start(Path({str(session_dir)!r}), {{"good": "g", "bad": "b"}})
        s.journal.swap(Path({str(f)!r}), b"FAST = False\\n")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], check=False)
    assert proc.returncode == -signal.SIGKILL
    assert f.read_text() == "FAST = False\n"
    session = Session.existing(session_dir)
    assert not session.finished()
    with pytest.raises(SessionError, match=r"\(0 trials, unfinished\); continue it with --resume"):
        Session.start(session_dir, {})
    report = session.reset()
    assert report.restored == (f,)
    assert f.read_text() == "FAST = True\n"
    assert session.finished()


def test_reset_removes_every_trials_cache_dir_and_keeps_the_logs(tmp_path: Path) -> None:
    """A run killed mid-trial never removed that trial's cache copy: reset does."""
    s = Session.start(tmp_path / "s", {"good": "g", "bad": "b"})
    for n in (1, 2):
        (s.trial_dir(n) / "caches" / "inductor" / "fx").mkdir(parents=True)
        (s.trial_dir(n) / "caches" / "inductor" / "fx" / "graph").write_bytes(b"x" * 4096)
        (s.trial_dir(n) / "run-1.stdout").write_text("12 tok/s\n")
    report = s.reset()
    assert not list(s.root.glob("trials/*/caches"))
    assert {p.name for p in report.removed} == {"caches"}
    assert (s.trial_dir(1) / "run-1.stdout").read_text() == "12 tok/s\n"


def test_torn_last_line_is_ignored_and_trials_round_trip(tmp_path: Path) -> None:
    s = Session.start(tmp_path / "s", {"threshold": 1000.0})
    rec = TrialRecord(
        index=1,
        key=state_key(["env:A"]),
        applied=("env:A",),
        positions=(),
        samples=(1.0, 2.0),
        failure=None,
        log_dir="trials/001",
    )
    s.append(rec)
    with open(s.log_path, "a") as fh:
        fh.write('{"type": "trial", "index": 2, "ke')  # kill -9 mid-write
    assert s.trials() == [rec]
    assert s.next_trial_index() == 2
    assert s.header()["threshold"] == 1000.0


def test_lock_refuses_a_live_owner(tmp_path: Path) -> None:
    s = Session.start(tmp_path / "s", {})
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (s.root / "lock").write_text(f"{sleeper.pid}\n")
        with pytest.raises(SessionError, match=f"in use by envbisect process {sleeper.pid}"):
            Session.resume(s.root)
    finally:
        sleeper.kill()
        sleeper.wait()
    resumed = Session.resume(s.root)  # the owner is dead now
    assert resumed.header() is not None


def test_state_key_ignores_order() -> None:
    assert state_key(["b", "a"]) == state_key(["a", "b"])
    assert state_key(["a"]) != state_key(["a"], [("git:/r", 2)])


def test_resume_without_session_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="no session to resume"):
        Session.resume(tmp_path / "nothing")


def test_later_sample_batches_of_a_state_are_one_trial(tmp_path: Path) -> None:
    """Found 3: every sample batch was its own numbered trial in the log."""
    s = Session.start(tmp_path / "s", {})
    first = TrialRecord(1, "k1", ("a",), (), (10.0, 11.0), None, "t/001")
    s.append(first)
    s.append(TrialRecord(2, "k2", (), (), (5.0,), None, "t/002"))
    s.append(TrialRecord(1, "k1", ("a",), (), (12.0,), "timeout", "t/001"))
    trials = s.trials()
    assert [t.index for t in trials] == [1, 2]
    assert trials[0].samples == (10.0, 11.0, 12.0) and trials[0].failure == "timeout"
    s.append(VerdictEvent(1, "bad", 11.0, None))
    assert s.verdicts()[1]["verdict"] == "bad"


def test_the_log_never_holds_a_secret_from_a_command_line_or_a_message(tmp_path: Path) -> None:
    token = "sk-proj-" + "SessionSecret0" * 3
    session = Session.start(tmp_path / "s", {"smoke": ["train.py", "--api-key", "pw-9!x"]})
    session.append(EndEvent("error", f"auth failed for {token}"))
    text = session.log_path.read_text()
    assert token not in text and "pw-9!x" not in text
    assert session.header()["smoke"] == ["train.py", "--api-key", "<redacted>"]


def test_starting_over_a_live_unfinished_session_names_its_process(tmp_path: Path) -> None:
    s = Session.start(tmp_path / "s", {})
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (s.root / "lock").write_text(f"{sleeper.pid}\n")
        with pytest.raises(SessionError, match=f"in use by envbisect process {sleeper.pid}$"):
            Session.start(s.root, {})
    finally:
        sleeper.kill()
        sleeper.wait()
    with pytest.raises(SessionError, match="continue it with --resume"):
        Session.start(s.root, {})  # its process is gone: now it is only unfinished


def test_the_default_session_folder_is_never_listed_by_git(tmp_path: Path) -> None:
    """Run from inside a repo, ``.envbisect/session`` sits in the user's worktree: ``git
    status`` stays as it was. A ``--session`` folder of another name gets no file."""

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    s = Session.start(repo / ".envbisect" / "session", {"good": "g", "bad": "b"})
    s.unlock()
    status = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert status.stdout == ""
    other = Session.start(tmp_path / "elsewhere" / "s", {"good": "g", "bad": "b"})
    other.unlock()
    assert not (tmp_path / "elsewhere" / ".gitignore").exists()


def test_a_run_that_ended_in_error_before_measuring_anything_is_replaced_without_fresh(
    tmp_path: Path,
) -> None:
    """Found 8: a run that stopped on a usage mistake (the printed figure not read, no
    --metric-regex) blocked the corrected run: "continue it with --resume or replace it
    with --fresh", for a session that held no measurement at all."""
    s = Session.start(tmp_path / "s", {"threshold": 1.0})
    s.append(TrialRecord(1, "k1", (), (), (), "no metric", "trials/001", runs=1))
    s.append(EndEvent("error", "trial 1: no metric in the output\nits output has ..."))
    s.unlock()
    again = Session.start(tmp_path / "s", {"threshold": 2.0})
    assert again.replaced == (
        f"{again.root}: the earlier run ended in error before measuring anything "
        "(trial 1: no metric in the output); replaced"
    )
    assert again.trials() == [] and again.header()["threshold"] == 2.0
    # one sample, or one crash, is a measurement: kept, and asked about
    again.append(TrialRecord(1, "k1", (), (), (), "crash", "trials/001", runs=1, crashes=1))
    again.append(EndEvent("error", "stopped"))
    again.unlock()
    with pytest.raises(SessionError, match=r"\(1 trials, ended error\); continue it with"):
        Session.start(tmp_path / "s", {})
    fresh = Session.start(tmp_path / "s", {}, fresh=True)
    assert fresh.replaced is None and fresh.trials() == []
