"""The run's last step below a guilty unit: which hunk of its first bad change.

Two kinds of unit get there. A file unit inside a repo, narrowed by the engine over the
file's versions (its content after each commit that touched it, then the uncommitted edit:
``history``): the change of its first bad version, in that file. A git unit narrowed to its
first bad commit, when that commit touched a file listed under ``files:``: the commit's
change in the text files it modified. The change is split into hunks (``hunks.split``) and
``narrow.isolate_hunks`` finds the guilty one. A subset of hunks is realized as one more
position of the unit (``Actuator.add_variant``: a content of the file;
``Actuator.add_commit_variant``: the worktree at the commit before, with the subset's
contents written in), measured with the run's own test function, so its trials are
numbered, logged and replayed like the engine's. Verdicts use the search's threshold and
pooled noise; a subset that cannot be built, cannot be realized faithfully or crashes
counts as unresolved (unless the regression itself is a crash, which ``on_crash`` decides
as in the engine).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from envbisect.model.failure import Failure
from envbisect.model.gitcli import changed_files, show_file
from envbisect.model.history import FileVersion, HunkCulprit, commit_facts, shown_path
from envbisect.model.hunks import Hunk, HunkError, apply, decode, split
from envbisect.model.metric import figure_unit, format_ktok
from envbisect.search.narrow import HunkIsolation, isolate_hunks
from envbisect.search.result import Narrowed, SearchOutcome, SearchResult
from envbisect.search.state import Outcome, State
from envbisect.search.verdict import Judge, Noise, Verdict, median, more_wanted, sample_cap
from envbisect.sections.git import GitEntry

PURPOSE = "narrow: hunks of "


@dataclass(frozen=True)
class HunkTrial:
    """One state the hunk search measured (``applied``: the hunk numbers)."""

    state: State
    applied: tuple[int, ...]
    samples: tuple[float, ...]
    verdict: Verdict
    failure: Failure | None
    purpose: str


@dataclass(frozen=True)
class HunkSettings:
    """How the hunk search measures: as the engine did (samples, budget, crashes)."""

    repeats: int = 3
    max_samples: int = 9
    budget: int | None = None  # trials left in the run's budget (None: no limit)
    crash_is_bad: bool = False  # the regression is a crash (``on_crash=bad``, bad failed)


class Measure:
    """The hunk search's test function: a subset of hunks → a verdict, through the run's
    (the package step's too: ``shown`` names what a state applies in its progress line;
    ``excuse`` says why a failed state says nothing about the regression: unresolved)."""

    def __init__(
        self,
        measure: Callable[[State, int], Outcome],
        judge: Judge,
        settings: HunkSettings,
        progress: Callable[[str], None],
        number: Callable[[State], int],
    ) -> None:
        self.number = number
        self.of = ""  # "4 in repo/model.py": the hunks, for progress lines
        self.measure = measure
        self.judge = judge
        self.s = settings
        self.progress = progress
        self.trials: list[HunkTrial] = []
        self.seen: dict[State, Verdict] = {}
        self.excuse: Callable[[State, Failure], str | None] | None = None

    def __call__(
        self, state: State, applied: tuple[int, ...], purpose: str, shown: str | None = None
    ) -> Verdict:
        if state in self.seen:
            return self.seen[state]
        if shown is None:
            shown = f"hunk(s) {', '.join(map(str, applied)) or 'none'} of {self.of} applied"
        self.progress(f"{shown} ({purpose})")
        out = self.measure(state, self.s.repeats)
        samples, runs = list(out.samples), max(1, out.runs)
        failure = Failure.of(out.failure) if out.failure else None
        while failure is None and self.judge.needs_more(
            samples, sample_cap(len(samples), runs, self.s.max_samples)
        ):
            more = self.measure(state, more_wanted(len(samples), self.s.max_samples))
            samples += more.samples
            runs += max(1, more.runs)
            failure = Failure.of(more.failure) if more.failure else None
        excuse = self.excuse(state, failure) if failure and self.excuse is not None else None
        if out.untestable:
            verdict = Verdict.UNRESOLVED
        elif failure is not None and excuse:
            verdict, failure = Verdict.UNRESOLVED, Failure(f"{failure} ({excuse})")
        elif failure is not None or not samples:
            verdict = Verdict.BAD if self.s.crash_is_bad else Verdict.UNRESOLVED
        else:
            verdict = self.judge.verdict(samples)
        how = "no samples"
        if samples:
            how = f"median {format_ktok(median(samples))} {figure_unit()} of {len(samples)} samples"
        self.progress(f"trial {self.number(state)}: {verdict.value} ({failure or how})")
        self.trials.append(HunkTrial(state, applied, tuple(samples), verdict, failure, purpose))
        self.seen[state] = verdict
        return verdict


@dataclass(frozen=True)
class _Change:
    """The first bad change below a guilty unit: what its hunks are and how a subset of
    them becomes a state (``state_of``; None when the subset does not apply)."""

    unit: str
    version: FileVersion
    repo: str
    hunks: tuple[Hunk, ...]
    state_of: Callable[[frozenset[int]], State | None]


def _narrowed(result: SearchResult, units: Mapping[str, Any]) -> list[tuple[Narrowed, Any]]:
    """The culprits' narrowed units among ``units`` with a known first bad item."""
    if result.outcome is not SearchOutcome.FOUND:
        return []
    return [
        (n, iso)
        for iso in result.culprits
        for n in iso.narrowed
        if n.unit in units and n.first_bad is not None and n.evidence is not None
    ]


def _file_change(actuator: Any, narrowed: Narrowed, core: frozenset[str]) -> _Change | None:
    """A file unit inside a repo narrowed to a version: that version's hunks in the file."""
    unit, p = narrowed.unit, int(narrowed.first_bad or 0)
    versions = actuator.file_versions()[unit]
    key = str(next(u for u in actuator.units if u.id == unit).changes[0].key)
    old = actuator.content(unit, p - 1 if p > 0 else -1)
    new = actuator.content(unit, p if p < len(versions) - 1 else None)
    text_old, text_new = (decode(c) if c is not None else None for c in (old, new))
    repo = _repo_of(actuator, key)
    if text_old is None or text_new is None or repo is None:
        return None
    hunks = split(text_old, text_new, path=key)

    def state_of(subset: frozenset[int]) -> State | None:
        try:
            content = apply(text_old, [hunks[i] for i in sorted(subset)])
        except HunkError:
            return None
        return State.of(core, {unit: actuator.add_variant(unit, content.encode("utf-8"))})

    return _Change(unit, versions[p], repo, hunks, state_of)


def _commit_change(actuator: Any, narrowed: Narrowed, core: frozenset[str]) -> _Change | None:
    """A git unit narrowed to its first bad commit that touched a file listed under
    ``files:`` (folded into the unit): the hunks of that commit in the text files it
    modified (files bisected as units of their own are left to them)."""
    unit, p = narrowed.unit, int(narrowed.first_bad or 0)
    git_unit = next(u for u in actuator.units if u.id == unit)
    repo = str(git_unit.changes[0].key)
    listed = {str(c.key) for c in git_unit.changes if c.section == "files"}
    commits = actuator.ordered()[unit]
    before = commits[p - 1] if p > 0 else GitEntry.of(actuator.good.section("git").get(repo)).head
    if not before or not listed:
        return None
    via = actuator.git_via  # the repo is read where it is: here, or on the target
    changed = changed_files(repo, before, commits[p], via)
    if not any(os.path.join(repo, rel) in listed for rel in changed):
        return None
    own = {str(u.changes[0].key) for u in actuator.units if u.section == "files"}
    texts: dict[str, str] = {}
    hunks: list[Hunk] = []
    for rel in changed:
        key = os.path.join(repo, rel)
        old, new = (show_file(repo, c, rel, via=via) for c in (before, commits[p]))
        text_old, text_new = (decode(c) if c is not None else None for c in (old, new))
        if key in own or text_old is None or text_new is None:
            continue
        texts[key] = text_old
        hunks += split(text_old, text_new, path=key, first=len(hunks) + 1)

    def state_of(subset: frozenset[int]) -> State | None:
        contents = {}
        for key, text in texts.items():
            mine = [hunks[i] for i in sorted(subset) if hunks[i].path == key]
            try:
                contents[key] = apply(text, mine).encode("utf-8") if mine else None
            except HunkError:
                return None
        chosen = {k: c for k, c in contents.items() if c is not None}
        return State.of(core, {unit: actuator.add_commit_variant(unit, p - 1, chosen)})

    subject, date = commit_facts(repo, commits[p], via)
    return _Change(
        unit, FileVersion(commits[p], "", 0, subject, date), repo, tuple(hunks), state_of
    )


def _guilty_change(result: SearchResult, actuator: Any) -> tuple[_Change, Narrowed] | None:
    """The first bad change of the first culprit narrowed below its unit, if any."""
    for narrowed, iso in _narrowed(result, actuator.file_versions()):
        change = _file_change(actuator, narrowed, frozenset(iso.units))
        if change is not None and change.hunks:
            return change, narrowed
    gits = {u.id: u for u in actuator.units if u.section == "git"}
    for narrowed, iso in _narrowed(result, gits):
        change = _commit_change(actuator, narrowed, frozenset(iso.units))
        if change is not None and change.hunks:
            return change, narrowed
    return None


def find_hunk(
    result: SearchResult,
    actuator: Any,
    measure: Callable[[State, int], Outcome],
    settings: HunkSettings,
    progress: Callable[[str], None],
    number: Callable[[State], int],
) -> tuple[HunkCulprit | None, tuple[HunkTrial, ...]]:
    """The hunk of the guilty file's first bad version, or of the guilty repo's first bad
    commit (see the module docstring), and the trials it took; (None, ()) when no such unit
    was narrowed. ``actuator``: the run's (``file_versions``, ``ordered``, ``content``,
    ``add_variant``, ``add_commit_variant``); ``number``: the session's trial number of a
    measured state."""
    found = _guilty_change(result, actuator)
    if found is None:
        return None, ()
    change, narrowed = found
    hunks = change.hunks
    ev = narrowed.evidence
    assert ev is not None
    first = hunks[0].path
    base = HunkCulprit(
        unit=change.unit,
        file=first,
        shown=shown_path(change.repo, first),
        version=change.version,
        hunks=hunks,
        culprit=hunks[0] if len(hunks) == 1 else None,
        candidates=hunks if len(hunks) > 1 else (),
        good=ev.good.median,
        bad=ev.bad.median,
        good_trial=number(ev.good.state),
        bad_trial=number(ev.bad.state),
        repo=change.repo,
    )
    if len(hunks) == 1:
        return base, ()
    noise = Noise.from_groups(t.samples for t in result.trials if not t.failure)
    assert result.threshold is not None
    m = Measure(measure, Judge(result.threshold, noise), settings, progress, number)
    files = sorted({shown_path(change.repo, h.path) for h in hunks})
    m.of = f"{len(hunks)} in {', '.join(files)}"
    v = change.version
    at = f"commit {v.item[:12]}" if v.committed else "the uncommitted edit"
    progress(f"{', '.join(files)} turned slow at {at}: searching its {len(hunks)} hunks")

    def test(subset: frozenset[int]) -> Verdict:
        state = change.state_of(subset)
        if state is None:
            return Verdict.UNRESOLVED  # does not apply: unresolved, as a skipped commit
        return m(state, tuple(i + 1 for i in sorted(subset)), PURPOSE + change.unit)

    iso_h = isolate_hunks(len(hunks), test, budget=settings.budget)
    return _culprit(base, iso_h, hunks, m, change), tuple(m.trials)


def _culprit(
    base: HunkCulprit,
    iso: HunkIsolation,
    hunks: tuple[Hunk, ...],
    m: Measure,
    change: _Change,
) -> HunkCulprit:
    """The HunkCulprit of a finished hunk search, with its evidence (medians, trials)."""
    trials = len(m.trials)
    if iso.culprit is None:
        found = tuple(hunks[i] for i in iso.candidates)
        alone = {next(iter(s)): v for s, v in iso.tested if len(s) == 1}
        unjudged = len(found) > 1 and all(
            alone.get(i) not in (None, Verdict.BAD, Verdict.GOOD) for i in iso.candidates
        )
        return replace(
            base,
            culprit=None,
            candidates=found,
            apart_unjudged=unjudged,
            trials=trials,
            file=found[0].path,
            shown=shown_path(change.repo, found[0].path),
        )
    slow_alone = iso.alone is None or iso.alone is Verdict.BAD
    with_ = frozenset() if slow_alone else iso.passing
    state_of = change.state_of
    culprit = hunks[iso.culprit]
    out = replace(
        base,
        file=culprit.path,
        shown=shown_path(change.repo, culprit.path),
        culprit=culprit,
        candidates=(),
        together=tuple(hunks[i] for i in sorted(with_)),
        trials=trials,
    )
    good = _trial_of(m, state_of(with_) if with_ else None)
    if good is not None:
        out = replace(out, good=median(good.samples), good_trial=m.number(good.state))
    bad = _trial_of(m, state_of(with_ | {iso.culprit}))
    if bad is not None:
        out = replace(out, bad=median(bad.samples), bad_trial=m.number(bad.state))
    return out


def _trial_of(m: Measure, state: State | None) -> HunkTrial | None:
    """The hunk search's trial of ``state`` that ran (None: not measured by it)."""
    return next((t for t in m.trials if t.state == state and t.samples), None)


def _repo_of(actuator: Any, key: str) -> str | None:
    from envbisect.sections.git import repo_of

    return repo_of(key, [str(r) for r in actuator.bad.section("git")])
