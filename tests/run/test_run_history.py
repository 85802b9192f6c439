"""A file inside a repo, named down to its commit and hunk: a user-style training repo with
real git history (four commits to model.py, one of them slow, and an uncommitted patch),
snapshots taken by ``envbisect snapshot``, ``envbisect run`` as a real process."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from envbisect.model.history import UNCOMMITTED, file_history
from envbisect.model.session import Session
from tests.helpers_history import CULPRIT, History, make_history
from tests.helpers_run import commit_all, git, init_repo

pytestmark = pytest.mark.slow


def _run(h: History) -> tuple[Any, dict[str, Any], str]:
    out, report = h.work / "out.json", h.work / "report.md"
    res = h.envbisect(*h.run_argv("--json", str(out), "--report", str(report)))
    assert res.returncode == 0, res.stdout + res.stderr
    return res, json.loads(out.read_text()), report.read_text()


def _extra_trials(doc: dict[str, Any]) -> int:
    """Trials spent below the file unit: its versions, then its hunks."""
    return sum(1 for t in doc["trials"] if t["purpose"].startswith("narrow: "))


def _goal(commits: int, hunks: int) -> int:
    return math.ceil(math.log2(commits)) + math.ceil(math.log2(hunks)) + 2


def test_the_culprit_is_named_down_to_its_commit_and_hunk(tmp_path: Path) -> None:
    h = make_history(tmp_path)
    before = h.model.read_bytes()
    res, doc, report = _run(h)
    sha = h.commits[CULPRIT]
    line = next(x for x in res.stdout.splitlines() if x.startswith("Culprit: "))
    assert line.startswith(
        f'Culprit: commit {sha[:7]} "{CULPRIT}" — repo/model.py hunk @@ -5,1 +5,1 @@ — '
    )
    assert line.endswith(" Ktok/s")
    (culprit,) = doc["culprits"]
    assert culprit["unit"] == f"files:{h.model}" and culprit["commit"] == sha
    hunk = culprit["hunk"]
    assert hunk["commit"] == sha and hunk["file"] == str(h.model) and not hunk["uncommitted"]
    assert hunk["subject"] == CULPRIT
    assert hunk["hunk"] == "@@ -5,1 +5,1 @@"
    assert hunk["hunk_text"] == "@@ -5,1 +5,1 @@\n-REPEAT = 1\n+REPEAT = 1 if False else 8\n"
    assert hunk["hunks"] == 3 and hunk["cleared"] == ["@@ -1,1 +1,1 @@", "@@ -11,0 +12,1 @@"]
    assert hunk["bad_median_tok_per_s"] < hunk["good_median_tok_per_s"]
    date = git(h.repo, "show", "-s", "--format=%aI", sha)
    assert hunk["author_date"] == date
    # The report shows the hunk with the commit's subject and date, the others cleared.
    assert f'### The hunk: commit `{sha[:12]}` "{CULPRIT}" ({date})' in report
    assert "```diff\n@@ -5,1 +5,1 @@\n-REPEAT = 1\n+REPEAT = 1 if False else 8\n```" in report
    assert "@@ -1,1 +1,1 @@ cleared" in report and "@@ -11,0 +12,1 @@ cleared" in report
    assert line in report
    # Four commits touched model.py (plus the uncommitted edit), three hunks in the culprit.
    assert _extra_trials(doc) <= _goal(4, 3)
    # The evidence trials exist and are the hunk's: without it fast, with it slow.
    rows = {t["index"]: t for t in doc["trials"]}
    assert rows[hunk["evidence"]["good_trial"]]["verdict"] == "good"
    assert rows[hunk["evidence"]["bad_trial"]]["verdict"] == "bad"
    # The user's files are as they were; the session left nothing behind.
    assert h.model.read_bytes() == before
    assert git(h.repo, "status", "--porcelain") == "M model.py"
    session = Session.existing(h.work / "session")
    assert session.finished() and not any((session.root / "worktrees").glob("*"))
    log = h.envbisect("log", "--session", str(h.work / "session"))
    assert log.returncode == 0 and "narrow" not in log.stderr
    assert len([x for x in log.stdout.splitlines() if x[:1].isdigit()]) == len(doc["trials"])
    # --resume replays every trial, the hunk search's too (its states come out the same).
    again = h.envbisect(*h.run_argv("--resume", "--json", str(h.work / "again.json")))
    assert again.returncode == 0, again.stderr
    assert line in again.stdout
    assert again.stderr.count("replayed from the session log") == len(doc["trials"])
    assert len(Session.existing(h.work / "session").trials()) == len(doc["trials"])


def test_an_uncommitted_hunk_is_named_as_such(tmp_path: Path) -> None:
    h = make_history(tmp_path, culprit_uncommitted=True)
    res, doc, report = _run(h)
    line = next(x for x in res.stdout.splitlines() if x.startswith("Culprit: "))
    assert line.startswith("Culprit: uncommitted hunk @@ -4,1 +4,1 @@ in repo/model.py — ")
    hunk = doc["culprits"][0]["hunk"]
    assert hunk["uncommitted"] and hunk["commit"] is None and doc["culprits"][0]["commit"] is None
    assert hunk["hunk_text"] == "@@ -4,1 +4,1 @@\n-DEPTH = 2\n+DEPTH = 16\n"
    assert hunk["cleared"] == ["@@ -7,1 +7,1 @@"]
    assert "### The hunk: the uncommitted edit on top of the bad commit" in report
    assert _extra_trials(doc) <= _goal(4, 2)


def test_file_history_lists_the_commits_that_touched_the_file_then_the_edit(
    tmp_path: Path,
) -> None:
    repo = init_repo(tmp_path / "repo")
    f = repo / "m.py"
    f.write_text("a\n")
    (repo / "other.py").write_text("x\n")
    good = commit_all(repo, "start")
    f.write_text("a\nb\n")
    first = commit_all(repo, "add b")
    (repo / "other.py").write_text("y\n")
    commit_all(repo, "other only")
    f.write_text("a\nb\nc\n")
    bad = commit_all(repo, "add c")
    sha = hashlib.sha256

    def shas(good_text: bytes, bad_text: bytes) -> tuple[str, str]:
        return sha(good_text).hexdigest(), sha(bad_text).hexdigest()

    blobs = tmp_path / "blobs"
    versions = file_history(str(repo), str(f), (good, bad), shas(b"a\n", b"a\nb\nc\nd\n"), blobs)
    assert [v.item for v in versions] == [first, bad, UNCOMMITTED]
    assert [v.subject for v in versions[:2]] == ["add b", "add c"]
    assert (blobs / versions[0].sha256).read_bytes() == b"a\nb\n"
    assert versions[1].value() == {
        "sha256": sha(b"a\nb\nc\n").hexdigest(),
        "size": 6,
        "blob": sha(b"a\nb\nc\n").hexdigest(),
    }
    # No uncommitted edit: the last commit's content is the bad content.
    clean = file_history(str(repo), str(f), (good, bad), shas(b"a\n", b"a\nb\nc\n"), blobs)
    assert [v.item for v in clean] == [first, bad]
    # A good side edited by hand does not start at the good commit: no history to bisect.
    assert file_history(str(repo), str(f), (good, bad), shas(b"z\n", b"a\n"), blobs) == ()
    # A file outside the repo, or git failing (an unknown commit), gives none either.
    assert (
        file_history(str(repo), str(tmp_path / "x.py"), (good, bad), shas(b"a\n", b""), blobs) == ()
    )
    assert file_history(str(repo), str(f), ("0" * 40, bad), shas(b"a\n", b""), blobs) == ()


def test_a_clean_repo_is_narrowed_to_its_commit_then_the_commits_hunk(tmp_path: Path) -> None:
    """Without an uncommitted patch model.py moves with the repo's unit: the repo is
    bisected over its five commits (one touches train.py only), then the first bad
    commit's change is searched hunk by hunk."""
    h = make_history(tmp_path, uncommitted=False)
    res, doc, report = _run(h)
    sha = h.commits[CULPRIT]
    line = next(x for x in res.stdout.splitlines() if x.startswith("Culprit: "))
    assert line.startswith(
        f'Culprit: commit {sha[:7]} "{CULPRIT}" — repo/model.py hunk @@ -5,1 +5,1 @@ — '
    )
    (culprit,) = doc["culprits"]
    assert culprit["unit"] == f"git:{h.repo}" and culprit["commit"] == sha
    hunk = culprit["hunk"]
    assert hunk["file"] == str(h.model) and hunk["files"] == ["repo/model.py"]
    assert hunk["hunk_text"] == "@@ -5,1 +5,1 @@\n-REPEAT = 1\n+REPEAT = 1 if False else 8\n"
    assert hunk["cleared"] == ["@@ -1,1 +1,1 @@", "@@ -11,0 +12,1 @@"]
    assert f'### The hunk: commit `{sha[:12]}` "{CULPRIT}"' in report
    # Five commits in the range, three hunks in the culprit.
    assert _extra_trials(doc) <= _goal(5, 3)
    assert git(h.repo, "status", "--porcelain") == ""
