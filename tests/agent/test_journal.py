"""The swap journal's safety rules (envbisect.agent.journal), with real files and processes.

Unit tests use ``FileJournal`` (the host's wrapper); the end-to-end ones run ``envbisect run``
as real processes on a loose file: two sessions racing for it, an edit made while a run is
going, and a ``kill -9`` followed by an edit and ``reset``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envbisect.agent import journal
from envbisect.model.errors import SessionError
from envbisect.model.session import FileJournal, Session
from tests.helpers_run import manifest, store_blob


def _journal(tmp_path: Path, name: str = "s") -> FileJournal:
    (tmp_path / name).mkdir(exist_ok=True)
    return FileJournal(tmp_path / name / "journal.jsonl", tmp_path / name / "backups")


# ---- restore keeps what the user changed ------------------------------------------------------


def test_restore_keeps_an_edit_made_after_the_swap_and_writes_the_original_beside(
    tmp_path: Path,
) -> None:
    f = tmp_path / "cfg.ini"
    f.write_bytes(b"original\n")
    j = _journal(tmp_path)
    j.swap(f, b"swapped in\n")
    f.write_bytes(b"the user's edit\n")
    assert j.restore() == []
    assert f.read_bytes() == b"the user's edit\n"
    beside = tmp_path / "cfg.ini.envbisect-original"
    assert beside.read_bytes() == b"original\n"
    [kept] = j.kept
    assert (kept.path, kept.original) == (f, beside)
    assert str(f) in kept.describe() and str(beside) in kept.describe()
    assert j.restore() == []  # closed: a second restore touches nothing
    assert f.read_bytes() == b"the user's edit\n"


def test_a_file_the_user_recreated_after_envbisect_removed_it_is_kept(tmp_path: Path) -> None:
    f = tmp_path / "cfg.ini"
    f.write_bytes(b"original\n")
    j = _journal(tmp_path)
    j.swap(f, None)
    f.write_bytes(b"new by the user\n")
    j.restore()
    assert f.read_bytes() == b"new by the user\n"
    assert (tmp_path / "cfg.ini.envbisect-original").read_bytes() == b"original\n"


def test_an_original_beside_never_overwrites_an_older_one(tmp_path: Path) -> None:
    f = tmp_path / "cfg.ini"
    (tmp_path / "cfg.ini.envbisect-original").write_bytes(b"older\n")
    f.write_bytes(b"original\n")
    j = _journal(tmp_path)
    j.swap(f, b"swapped\n")
    f.write_bytes(b"edit\n")
    j.restore()
    assert (tmp_path / "cfg.ini.envbisect-original").read_bytes() == b"older\n"
    assert (tmp_path / "cfg.ini.envbisect-original.2").read_bytes() == b"original\n"


def test_a_swap_cut_off_before_the_write_is_closed_without_touching_the_file(
    tmp_path: Path,
) -> None:
    f = tmp_path / "cfg.ini"
    f.write_bytes(b"original\n")
    j = _journal(tmp_path)
    # The journal line is written first; a kill before the rename leaves the original.
    journal.append_line(
        j.path,
        {
            "op": "swap",
            "id": 1,
            "path": str(f),
            "existed": True,
            "backup": "1",
            "sha256": hashlib.sha256(b"original\n").hexdigest(),
            "put": hashlib.sha256(b"x").hexdigest(),
        },
    )
    assert j.restore() == [f]
    assert f.read_bytes() == b"original\n" and j.kept == []


# ---- hard links ------------------------------------------------------------------------------


def test_swap_and_restore_of_a_hard_linked_file_keep_the_inode(tmp_path: Path) -> None:
    f = tmp_path / "cfg.ini"
    other = tmp_path / "elsewhere.ini"
    f.write_bytes(b"original\n")
    os.link(f, other)
    inode = f.stat().st_ino
    j = _journal(tmp_path)
    j.swap(f, b"swapped\n")
    assert f.stat().st_ino == inode and other.read_bytes() == b"swapped\n"
    assert j.restore() == [f]
    assert f.stat().st_ino == inode == other.stat().st_ino
    assert f.stat().st_nlink == 2
    assert other.read_bytes() == b"original\n"


def test_removal_of_a_hard_linked_file_links_the_same_inode_back(tmp_path: Path) -> None:
    f = tmp_path / "cfg.ini"
    other = tmp_path / "elsewhere.ini"
    f.write_bytes(b"original\n")
    os.link(f, other)
    inode = f.stat().st_ino
    j = _journal(tmp_path)
    j.swap(f, None)
    assert not f.exists()
    j.restore()
    assert f.stat().st_ino == inode and f.stat().st_nlink == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.ini", "elsewhere.ini", "s"]


def test_an_in_place_write_cut_off_mid_way_is_restored(tmp_path: Path) -> None:
    f = tmp_path / "cfg.ini"
    f.write_bytes(b"original\n")
    os.link(f, tmp_path / "other")
    j = _journal(tmp_path)
    j.swap(f, b"swapped\n")
    # As if killed mid-write: the 'written' line is missing and the bytes are torn.
    lines = [ln for ln in j.path.read_text().splitlines() if '"written"' not in ln]
    j.path.write_text("\n".join(lines) + "\n")
    f.write_bytes(b"swa")
    assert j.restore() == [f]
    assert f.read_bytes() == b"original\n" and j.kept == []


# ---- the machine-wide lock -------------------------------------------------------------------

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from envbisect.model.session import Session
    s = Session.start(Path(sys.argv[1]), {})
    s.journal.swap(Path(sys.argv[2]), b"swapped by the holder\\n")
    print("swapped", flush=True)
    sys.stdin.read()  # hold until the test closes stdin
    s.journal.restore()
    s.unlock()
    """
)


def test_a_second_session_is_refused_by_a_live_holder_in_another_process(tmp_path: Path) -> None:
    f = tmp_path / "cfg.ini"
    f.write_bytes(b"original\n")
    link = tmp_path / "via-symlink.ini"
    link.symlink_to(f)  # the lock is keyed by the real path
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / "a"), str(f)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "swapped\n"
        other = Session.start(tmp_path / "b", {})
        with pytest.raises(SessionError) as err:
            other.journal.swap(link, b"second run\n")
        assert f"in use by envbisect process {holder.pid}" in str(err.value)
        assert f"session {tmp_path / 'a'}" in str(err.value)
        assert f.read_bytes() == b"swapped by the holder\n"  # untouched by the second run
        assert other.journal.open_swaps() == []
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert f.read_bytes() == b"original\n"
    other.journal.swap(f, b"now it may\n")  # the holder has gone and released it
    other.journal.restore()
    other.unlock()
    assert f.read_bytes() == b"original\n"


def test_a_holder_killed_with_the_file_swapped_blocks_others_until_reset(tmp_path: Path) -> None:
    f = tmp_path / "cfg.ini"
    f.write_bytes(b"original\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / "a"), str(f)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "swapped\n"
    holder.kill()
    holder.wait()
    other = Session.start(tmp_path / "b", {})
    with pytest.raises(SessionError, match="still swapped by envbisect process .* which is gone"):
        other.journal.claim(f)
    assert f.read_bytes() == b"swapped by the holder\n"
    Session.existing(tmp_path / "a").reset()
    assert f.read_bytes() == b"original\n"
    other.journal.claim(f)  # stale lock taken over once nothing is left swapped
    other.unlock()


def test_the_same_session_resumed_by_a_new_process_takes_its_lock_back(tmp_path: Path) -> None:
    f = tmp_path / "cfg.ini"
    f.write_bytes(b"original\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / "a"), str(f)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "swapped\n"
    holder.kill()
    holder.wait()
    resumed = Session.resume(tmp_path / "a")  # restores what the dead process left
    assert f.read_bytes() == b"original\n"
    resumed.journal.swap(f, b"again\n")
    resumed.journal.restore()
    resumed.unlock()
    assert not Path(journal.lock_path(str(f))).exists()  # released: nothing left behind


# ---- end to end: real `envbisect run` processes on one loose file ------------------------------

# A smoke command that reads the loose file, says it started (with its pid), then waits for a
# "go" file: the test decides when the trial ends. Good content is fast, anything else slow.
_SMOKE = textwrap.dedent(
    """
    import json, os, sys, time
    cfg, flags = sys.argv[1], sys.argv[2]
    fast = open(cfg, "rb").read() == b"lr = 0.1\\n"
    n = len([p for p in os.listdir(flags) if p.startswith("started")])
    with open(os.path.join(flags, "started-%d" % n), "w") as fh:
        fh.write(str(os.getpid()))
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(flags, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)
    rate = 2000.0 if fast else 100.0
    print("ENVBISECT_RESULT " + json.dumps({"ok": True, "tok_per_s": rate}))
    """
)


class _World:
    """A loose config file in its bad content, manifests of a good and a bad state that
    differ only in it, and the smoke command above."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cfg = tmp / "etc" / "cfg.ini"
        self.cfg.parent.mkdir()
        self.cfg.write_bytes(b"lr = 0.2\n")
        mdir = tmp / "manifests"
        self.good = manifest(
            mdir / "good.yaml", files={str(self.cfg): store_blob(mdir, b"lr = 0.1\n")}
        )
        self.bad = manifest(
            mdir / "bad.yaml", files={str(self.cfg): store_blob(mdir, b"lr = 0.2\n")}
        )
        self.flags = tmp / "flags"
        self.flags.mkdir()
        self.smoke = tmp / "smoke.py"
        self.smoke.write_text(_SMOKE)
        # No config of a parent dir is found; the one here names the file a run may swap.
        (tmp / "envbisect.yaml").write_text(f"files: [{str(self.cfg)!r}]\n")

    def spawn(self, session: str, *extra: str) -> subprocess.Popen[str]:
        argv = [
            sys.executable,
            "-m",
            "envbisect",
            "run",
            "--good",
            str(self.good),
            "--bad",
            str(self.bad),
            "--python",
            sys.executable,
            "--session",
            str(self.tmp / session),
            "--until-ktoks",
            "1k",
            "--repeats",
            "1",
            "--timeout",
            "120",
            *extra,
            "--",
            sys.executable,
            str(self.smoke),
            str(self.cfg),
            str(self.flags),
        ]
        return subprocess.Popen(
            argv,
            cwd=self.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_started(self, proc: subprocess.Popen[str], n: int = 0) -> int:
        flag = self.flags / f"started-{n}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if flag.exists() and flag.read_text():
                return int(flag.read_text())
            if proc.poll() is not None:
                raise AssertionError(f"run ended early: {proc.communicate()}")
            time.sleep(0.02)
        raise AssertionError("the trial never started")

    def go(self) -> None:
        (self.flags / "go").write_text("")


pytestmark_slow = pytest.mark.slow


@pytestmark_slow
def test_two_runs_with_different_sessions_cannot_swap_the_same_file(tmp_path: Path) -> None:
    w = _World(tmp_path)
    first = w.spawn("session-a")
    w.wait_started(first)
    assert w.cfg.read_bytes() == b"lr = 0.1\n"  # the first run's good state is in place
    second = w.spawn("session-b")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("envbisect: error:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert f"in use by envbisect process {first.pid}" in lines[0]
    assert f"session {tmp_path / 'session-a'}" in lines[0]
    assert w.cfg.read_bytes() == b"lr = 0.1\n"  # the second run touched nothing
    w.go()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert "not reproduced" not in out
    assert w.cfg.read_bytes() == b"lr = 0.2\n"  # the user's file, as it was


@pytestmark_slow
def test_an_edit_made_while_run_is_going_is_kept_and_said(tmp_path: Path) -> None:
    w = _World(tmp_path)
    run = w.spawn("session", "--json", str(tmp_path / "result.json"))
    w.wait_started(run)
    w.cfg.write_bytes(b"lr = 0.3  # my edit\n")
    w.go()
    out, err = run.communicate(timeout=120)
    assert w.cfg.read_bytes() == b"lr = 0.3  # my edit\n"
    beside = Path(str(w.cfg) + ".envbisect-original")
    assert beside.read_bytes() == b"lr = 0.2\n"
    assert f"kept {w.cfg}" in err and str(beside) in err
    notes = json.loads((tmp_path / "result.json").read_text())["notes"]
    assert any(n.startswith(f"kept {w.cfg}") for n in notes)  # said again in the result


@pytestmark_slow
def test_an_edit_after_kill_9_is_kept_by_reset(tmp_path: Path) -> None:
    w = _World(tmp_path)
    run = w.spawn("session")
    smoke_pid = w.wait_started(run)
    run.send_signal(signal.SIGKILL)
    run.wait()
    os.kill(smoke_pid, signal.SIGKILL)
    assert w.cfg.read_bytes() == b"lr = 0.1\n"  # left swapped by the dead run
    w.cfg.write_bytes(b"lr = 0.3  # my edit\n")
    res = subprocess.run(
        [sys.executable, "-m", "envbisect", "reset", "--session", str(tmp_path / "session")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    beside = Path(str(w.cfg) + ".envbisect-original")
    assert w.cfg.read_bytes() == b"lr = 0.3  # my edit\n"
    assert beside.read_bytes() == b"lr = 0.2\n"
    assert f"kept {w.cfg}" in res.stdout and str(beside) in res.stdout
    events = [json.loads(ln) for ln in (tmp_path / "session" / "journal.jsonl").open()]
    assert events[-1]["outcome"] == "kept"


def test_a_remote_target_follows_the_same_rules_through_the_shipped_agent(
    tmp_path: Path,
) -> None:
    import base64

    from envbisect.transport import Transport

    f = tmp_path / "far" / "cfg.ini"
    f.parent.mkdir()
    f.write_bytes(b"original\n")
    os.link(f, tmp_path / "far" / "other.ini")
    inode = f.stat().st_ino
    root = str(tmp_path / "remote-session")
    chain = Transport.from_specs(["sh -c"])

    def op(name: str, **params: object) -> dict[str, object]:
        return chain.run_agent(
            sys.executable,
            "envbisect.agent.actuate_remote",
            {"op": name, "root": root, **params},
            timeout_s=60,
            log_dir=tmp_path / "logs",
            name=name,
        )

    content = base64.b64encode(b"swapped\n").decode()
    sha = hashlib.sha256(b"swapped\n").hexdigest()
    out = op(
        "realize", pid=os.getpid(), swaps=[{"path": str(f), "sha256": sha, "content": content}]
    )
    assert out["failure"] is None
    assert f.read_bytes() == b"swapped\n" and f.stat().st_ino == inode
    # Another session on the same machine is refused while this one holds the file.
    other = Session.start(tmp_path / "host-session", {})
    with pytest.raises(SessionError, match=f"in use by envbisect process {os.getpid()}"):
        other.journal.claim(f)
    f.write_bytes(b"edited on the target\n")  # through the same inode, as editors may
    out = op("restore")
    assert out["restored"] == []
    assert f.read_bytes() == b"edited on the target\n"
    assert [str(f) in line and "envbisect-original" in line for line in out["kept"]] == [True]
    op("cleanup", all=True)
    other.journal.claim(f)  # released by the cleanup
    other.unlock()


def test_reset_of_a_remote_session_leaves_nothing_of_it_on_the_target(tmp_path: Path) -> None:
    import base64

    from envbisect.transport import Transport

    f = tmp_path / "app.conf"
    f.write_bytes(b"the user's\n")
    home = tmp_path / "home"
    home.mkdir()
    root = home / ".envbisect" / "session-abc"
    chain = Transport.from_specs(["sh -c"])

    def op(name: str, **params: object) -> dict[str, object]:
        return chain.run_agent(
            sys.executable,
            "envbisect.agent.actuate_remote",
            {"op": name, "root": str(root), **params},
            timeout_s=60,
            log_dir=tmp_path / "logs",
            name=name,
        )

    content = base64.b64encode(b"swapped\n").decode()
    sha = hashlib.sha256(b"swapped\n").hexdigest()
    swaps = [{"path": str(f), "sha256": sha, "content": content}]
    out = op("realize", pid=os.getpid(), swaps=swaps)
    assert out["failure"] is None and root.is_dir()
    (root / "venvs" / "v").mkdir(parents=True)
    out = op("cleanup", all=True)
    assert f.read_bytes() == b"the user's\n"
    assert str(root) in out["removed"] and not (home / ".envbisect").exists()
    assert sorted(p.name for p in home.iterdir()) == []


def test_a_child_forked_by_a_killed_holder_delays_reset_only_until_it_goes(
    tmp_path: Path,
) -> None:
    # Killed while forking (the smoke command starts right after the swap), a holder leaves
    # a child that shares the lock's open file until it execs: reset waits for it, briefly.
    f = tmp_path / "cfg.ini"
    f.write_bytes(b"original\n")
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from pathlib import Path
        from envbisect.model.session import Session
        s = Session.start(Path(sys.argv[1]), {})
        s.journal.swap(Path(sys.argv[2]), b"swapped\\n")
        if os.fork() == 0:  # the child between fork and exec, holding every fd
            time.sleep(1.0)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a"), str(f)], check=False)
    assert proc.returncode == -signal.SIGKILL
    report = Session.existing(tmp_path / "a").reset()
    assert report.restored == (f,) and f.read_bytes() == b"original\n"


# ---- nothing private left behind; lines envbisect never wrote ------------------------------


def test_the_copy_of_a_private_file_is_gone_once_it_is_restored(tmp_path: Path) -> None:
    secret = tmp_path / "credentials"
    secret.write_bytes(b"token = x\n")
    os.chmod(secret, 0o600)
    j = _journal(tmp_path)
    j.swap(secret, b"swapped in\n")
    backups = tmp_path / "s" / "backups"
    assert [p.read_bytes() for p in backups.iterdir()] == [b"token = x\n"]
    j.restore()
    assert secret.read_bytes() == b"token = x\n"
    assert list(backups.iterdir()) == []


@pytest.mark.parametrize(
    "line",
    [
        {"op": "swap", "path": "/x"},
        {"op": "restored", "id": "1"},
        {"op": "swap", "id": 1},
    ],
    ids=["no-id", "string-id", "no-path"],
)
def test_a_journal_line_envbisect_never_wrote_is_named_by_reset(
    tmp_path: Path, line: dict[str, object]
) -> None:
    session = tmp_path / "session"
    session.mkdir()
    (session / "journal.jsonl").write_text(json.dumps(line) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "reset", "--session", str(session)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    [said] = proc.stderr.strip().splitlines()
    assert said.startswith("envbisect: error: ") and "journal.jsonl" in said
    assert "it was not written by envbisect" in said


@pytest.mark.parametrize(
    ("text", "said"),
    [("[" * 100_000 + "\n", "nested too deep"), (None, "not a regular file")],
    ids=["deep-line", "fifo"],
)
def test_a_journal_that_is_deep_or_not_a_file_is_named_by_reset(
    tmp_path: Path, text: str | None, said: str
) -> None:
    session = tmp_path / "session"
    session.mkdir()
    if text is None:
        os.mkfifo(session / "journal.jsonl")
    else:
        (session / "journal.jsonl").write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "reset", "--session", str(session)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert said in line and "Traceback" not in proc.stderr, line
