"""bisect.hunkrun: the hunk step over a simulated file (injected measuring), and how a
hunk culprit is worded (report: sentence, section, JSON)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from envbisect.model.history import UNCOMMITTED, FileVersion, HunkCulprit
from envbisect.model.hunks import split
from envbisect.render.culprit import hunk_section, hunk_sentence
from envbisect.search import Outcome, State, search
from envbisect.search.hunkrun import PURPOSE, HunkSettings, find_hunk
from envbisect.search.verdict import Verdict

FILE = "/w/repo/model.py"
UNIT = f"files:{FILE}"
GOOD = "".join(f"line {i}\n" for i in range(12))


@dataclass
class _Change:
    key: str
    section: str = "files"


@dataclass
class _Unit:
    id: str
    changes: tuple[_Change, ...]
    section: str = "files"


class _Manifest:
    def section(self, name: str) -> dict[str, Any]:
        return {"/w/repo": {}} if name == "git" else {}


class FakeFile:
    """What the hunk step asks an actuator: the file's versions and contents, variants."""

    def __init__(self, versions: list[str], items: list[str]) -> None:
        self.contents = versions
        self.items = items
        self.variants = list(versions)
        self.units = [_Unit(UNIT, (_Change(FILE),))]
        self.good = self.bad = _Manifest()
        self.remote = False

    def file_versions(self) -> dict[str, tuple[FileVersion, ...]]:
        return {
            UNIT: tuple(FileVersion(i, "", 0, f"subject {i}", "2026-12-01") for i in self.items)
        }

    def ordered(self) -> dict[str, list[str]]:
        return {UNIT: self.items}

    def content(self, unit_id: str, pos: int | None) -> bytes:
        if pos == -1:
            return GOOD.encode()
        return (self.contents[-1] if pos is None else self.variants[pos]).encode()

    def add_variant(self, unit_id: str, content: bytes) -> int:
        if content.decode() not in self.variants:
            self.variants.append(content.decode())
        return self.variants.index(content.decode())

    def text(self, state: State) -> str:
        if UNIT not in state.applied:
            return GOOD
        pos = state.position(UNIT)
        return self.contents[-1] if pos is None else self.variants[pos]


def _edit(text: str, line: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[line] = new
    return "".join(lines)


def _world(slow_at: int = 6) -> tuple[FakeFile, Any]:
    """Three versions after the good one; the second changes lines 3, 6 and 9 (three
    hunks), ``slow_at`` to the slow line."""
    v1 = _edit(GOOD, 0, "docs\n")
    v2 = v1
    for line in (3, 6, 9):
        v2 = _edit(v2, line, "SLOW\n" if line == slow_at else f"edit {line}\n")
    v3 = _edit(v2, 11, "patched\n")  # the uncommitted edit
    fake = FakeFile([v1, v2, v3], ["c1", "c2", UNCOMMITTED])

    def measure(state: State, n: int) -> Outcome:
        text = fake.text(state)
        if "BROKEN" in text and "FIX" not in text:
            return Outcome(failure="crash: NameError")
        return Outcome((1000.0 if "SLOW" in text else 9000.0,) * n)

    return fake, measure


def _run(fake: FakeFile, measure: Any, **settings: Any) -> tuple[HunkCulprit | None, Any, Any]:
    result = search([UNIT, "env:A"], measure, ordered={UNIT: fake.items})
    numbers = {t.state: t.index for t in result.trials}
    lines: list[str] = []

    def number(s: State) -> int:
        return numbers.setdefault(s, len(numbers) + 1)

    hunk, trials = find_hunk(result, fake, measure, HunkSettings(**settings), lines.append, number)
    return hunk, trials, lines


def test_the_slow_hunk_of_the_first_bad_version_is_found_with_its_evidence() -> None:
    fake, measure = _world()
    hunk, trials, lines = _run(fake, measure)
    assert hunk is not None and hunk.version.item == "c2"
    assert hunk.culprit is not None and hunk.culprit.header == "@@ -7,1 +7,1 @@"
    assert [h.header for h in hunk.cleared] == ["@@ -4,1 +4,1 @@", "@@ -10,1 +10,1 @@"]
    assert hunk.good == 9000.0 and hunk.bad == 1000.0 and hunk.trials == len(trials)
    assert len(trials) <= math.ceil(math.log2(3)) + 1
    assert all(t.purpose == PURPOSE + UNIT for t in trials)
    assert lines[0] == "repo/model.py turned slow at commit c2: searching its 3 hunks"
    assert any(line.startswith("trial ") and "good (median 9.0 Ktok/s" in line for line in lines)
    d = hunk.as_dict()
    assert d["commit"] == "c2" and d["hunk_text"] == "@@ -7,1 +7,1 @@\n-line 6\n+SLOW\n"
    assert d["files"] == ["repo/model.py"]


def test_a_crashing_subset_is_unresolved_and_the_budget_is_kept() -> None:
    # The slow hunk calls what another hunk defines: alone it crashes.
    fake, measure = _world()
    fake.contents[1] = _edit(_edit(fake.contents[1], 6, "SLOW BROKEN\n"), 9, "FIX\n")
    fake.contents[2] = _edit(fake.contents[1], 11, "patched\n")
    fake.variants = list(fake.contents)
    hunk, trials, _ = _run(fake, measure)
    assert hunk is not None
    assert any(t.verdict is Verdict.UNRESOLVED and t.failure for t in trials)
    culprit = hunk.culprit
    assert culprit is None or culprit.header in ("@@ -7,1 +7,1 @@", "@@ -10,1 +10,1 @@")
    fake, measure = _world(slow_at=9)
    hunk, trials, _ = _run(fake, measure, budget=1)
    assert len(trials) == 1 and hunk is not None and hunk.culprit is None
    assert [h.header for h in hunk.candidates] == ["@@ -7,1 +7,1 @@", "@@ -10,1 +10,1 @@"]


def test_no_narrowed_file_means_no_hunk_step() -> None:
    fake, measure = _world()
    result = search(
        ["env:A", "env:B"], lambda s, n: Outcome((1000.0 if "env:B" in s.applied else 9000.0,) * n)
    )
    assert find_hunk(result, fake, measure, HunkSettings(), print, lambda s: 0) == (None, ())


def _culprit(**kw: Any) -> HunkCulprit:
    hunks = split("a\nb\nc\nd\n", "A\nb\nC\nd\n", path="/w/repo/model.py")
    base = HunkCulprit(
        unit=UNIT,
        file=FILE,
        shown="repo/model.py",
        version=FileVersion(
            "e4c6327" + "0" * 33,
            "",
            0,
            "model: call flex_attention directly",
            "2026-12-01T10:00:00+00:00",
        ),
        hunks=hunks,
        culprit=hunks[1],
        good=218_900.0,
        bad=52_400.0,
        good_trial=5,
        bad_trial=9,
        trials=2,
        repo="/w/repo",
    )
    return replace(base, **kw)


def test_the_sentence_names_commit_file_and_hunk_or_the_uncommitted_edit() -> None:
    assert hunk_sentence(_culprit()) == (
        'Culprit: commit e4c6327 "model: call flex_attention directly" — repo/model.py hunk '
        "@@ -3,1 +3,1 @@ — 218.9 → 52.4 Ktok/s"
    )
    uncommitted = _culprit(version=FileVersion(UNCOMMITTED, "", 0))
    assert hunk_sentence(uncommitted) == (
        "Culprit: uncommitted hunk @@ -3,1 +3,1 @@ in repo/model.py — 218.9 → 52.4 Ktok/s"
    )
    c = _culprit()
    assert hunk_sentence(replace(c, culprit=None, candidates=c.hunks)).startswith(
        'Culprit: commit e4c6327 "model: call flex_attention directly" — repo/model.py, one '
        "of hunks @@ -1,1 +1,1 @@, @@ -3,1 +3,1 @@"
    )
    together = replace(c, together=c.hunks[:1])
    assert "(slow together with @@ -1,1 +1,1 @@)" in hunk_sentence(together)
    # Each alone crashed (or was not judged): not "one of", but the two together.
    apart = replace(c, culprit=None, candidates=c.hunks, apart_unjudged=True)
    assert hunk_sentence(apart).startswith(
        'Culprit: commit e4c6327 "model: call flex_attention directly" — repo/model.py, hunks '
        "@@ -1,1 +1,1 @@ and @@ -3,1 +3,1 @@ together (none of them alone could be judged)"
    )


def test_the_report_section_shows_the_hunk_and_marks_the_others_cleared() -> None:
    text = "\n".join(hunk_section(_culprit()))
    assert (
        '### The hunk: commit `e4c632700000` "model: call flex_attention directly" '
        "(2026-12-01T10:00:00+00:00)"
    ) in text
    assert "```diff\n@@ -3,1 +3,1 @@\n-c\n+C\n```" in text
    assert "@@ -1,1 +1,1 @@ cleared\n-a\n+A" in text
    assert "trials 5 (without it) and 9 (with it)" in text


def test_a_hunk_state_whose_process_gives_every_sample_at_once_gets_more_processes() -> None:
    """As the engine's trials (``verdict.sample_cap``): a process giving 20 samples passes
    the cap of 9 at once, and a state inside the noise band takes up to 3 processes."""
    from envbisect.search.hunkrun import Measure
    from envbisect.search.verdict import Judge, Noise

    asked: list[int] = []

    def bulk(state: State, n: int) -> Outcome:
        asked.append(n)
        return Outcome(tuple(5000.0 * (0.5 + i / 19) for i in range(20)))

    lines: list[str] = []
    judge = Judge(threshold=5000.0, noise=Noise(sigma=0.3, dof=20))
    measure = Measure(bulk, judge, HunkSettings(), lines.append, lambda s: 1)
    assert measure(State.of((UNIT,)), (1,), PURPOSE) is Verdict.UNRESOLVED
    assert asked == [3, 2, 2]  # two asked past the cap: a process asked for one gives its figure
    assert lines[-1] == "trial 1: unresolved (median 5.0 Ktok/s of 60 samples)"
