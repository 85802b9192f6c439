"""The run's last step for a guilty file inside a repo: which hunk of its first bad version.

After the engine has isolated a file unit and narrowed it over the file's versions (its
content after each commit that touched it, then the uncommitted edit: ``history``), the
change of that first bad version is split into hunks (``hunks.split``) and
``narrow.isolate_hunks`` finds the guilty one. A subset of hunks is realized as one more
content of the file unit (``Actuator.add_variant``: a position of the unit), measured with
the run's own test function, so its trials are numbered, logged and replayed like the
engine's. Verdicts use the search's threshold and pooled noise; a subset that cannot be
built, cannot be realized faithfully or crashes counts as unresolved (unless the
regression itself is a crash, which ``on_crash`` decides as in the engine).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from envbisect.bisect.narrow import HunkIsolation, isolate_hunks
from envbisect.bisect.search import Narrowed, Outcome, SearchOutcome, SearchResult, State
from envbisect.bisect.verdict import Judge, Noise, Verdict, median
from envbisect.failure import Failure
from envbisect.history import HunkCulprit, shown_path
from envbisect.hunks import Hunk, HunkError, apply, decode, split

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


class _Measure:
    """The hunk search's test function: a subset of hunks → a verdict, through the run's."""

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

    def __call__(self, state: State, applied: tuple[int, ...], purpose: str) -> Verdict:
        if state in self.seen:
            return self.seen[state]
        shown = ", ".join(map(str, applied)) or "none"
        self.progress(f"hunk(s) {shown} of {self.of} applied ({purpose})")
        out = self.measure(state, self.s.repeats)
        samples = list(out.samples)
        failure = Failure.of(out.failure) if out.failure else None
        while failure is None and self.judge.needs_more(samples, self.s.max_samples):
            more = self.measure(state, min(2, self.s.max_samples - len(samples)))
            samples += more.samples
            failure = Failure.of(more.failure) if more.failure else None
        if out.untestable:
            verdict = Verdict.UNRESOLVED
        elif failure is not None or not samples:
            verdict = Verdict.BAD if self.s.crash_is_bad else Verdict.UNRESOLVED
        else:
            verdict = self.judge.verdict(samples)
        self.progress(
            f"trial {self.number(state)}: {verdict.value}"
            + (f" (median {median(samples) / 1000:.1f} Ktok/s)" if samples else "")
            + (f" ({failure})" if failure else "")
        )
        self.trials.append(HunkTrial(state, applied, tuple(samples), verdict, failure, purpose))
        self.seen[state] = verdict
        return verdict


def _guilty_file(result: SearchResult, files: Mapping[str, Any]) -> tuple[Narrowed, Any] | None:
    """The first culprit's narrowed file unit with a known first bad version."""
    if result.outcome is not SearchOutcome.FOUND:
        return None
    for iso in result.culprits:
        for n in iso.narrowed:
            if n.unit in files and n.first_bad is not None and n.evidence is not None:
                return n, iso
    return None


def find_hunk(
    result: SearchResult,
    actuator: Any,
    measure: Callable[[State, int], Outcome],
    settings: HunkSettings,
    progress: Callable[[str], None],
    number: Callable[[State], int],
) -> tuple[HunkCulprit | None, tuple[HunkTrial, ...]]:
    """The hunk of the guilty file's first bad version (see the module docstring), and the
    trials it took; (None, ()) when no file unit inside a repo was narrowed to a version.
    ``actuator``: the run's (``file_versions``, ``content``, ``add_variant``); ``number``:
    the session's trial number of a measured state."""
    versions = actuator.file_versions()
    found = _guilty_file(result, versions)
    if found is None:
        return None, ()
    narrowed, iso = found
    unit, p = narrowed.unit, narrowed.first_bad
    assert p is not None and narrowed.evidence is not None
    last = len(versions[unit]) - 1
    key = str(next(u for u in actuator.units if u.id == unit).changes[0].key)
    old = actuator.content(unit, p - 1 if p > 0 else -1)
    new = actuator.content(unit, p if p < last else None)
    text_old, text_new = (decode(c) if c is not None else None for c in (old, new))
    if text_old is None or text_new is None:
        return None, ()
    hunks = split(text_old, text_new)
    if not hunks:
        return None, ()
    core = frozenset(iso.units)
    ev = narrowed.evidence
    good, bad = ev.good.median, ev.bad.median
    repo = _repo_of(actuator, key)
    base = HunkCulprit(
        unit=unit,
        file=key,
        shown=shown_path(repo, key) if repo else key,
        version=versions[unit][p],
        hunks=hunks,
        culprit=hunks[0] if len(hunks) == 1 else None,
        candidates=hunks if len(hunks) > 1 else (),
        good=good,
        bad=bad,
        good_trial=number(ev.good.state),
        bad_trial=number(ev.bad.state),
    )
    if len(hunks) == 1:
        return base, ()
    noise = Noise.from_groups(t.samples for t in result.trials if not t.failure)
    assert result.threshold is not None
    m = _Measure(measure, Judge(result.threshold, noise), settings, progress, number)
    m.of = f"{len(hunks)} in {base.shown}"
    at = f"commit {base.version.item[:12]}" if base.version.committed else "the uncommitted edit"
    progress(f"{base.shown} turned slow at {at}: searching its {len(hunks)} hunks")

    def state_of(subset: frozenset[int]) -> State | None:
        try:
            content = apply(text_old, [hunks[i] for i in sorted(subset)])
        except HunkError:
            return None
        pos = actuator.add_variant(unit, content.encode("utf-8"))
        return State.of(core, {unit: pos})

    def test(subset: frozenset[int]) -> Verdict:
        state = state_of(subset)
        if state is None:
            return Verdict.UNRESOLVED  # does not apply: unresolved, as a skipped commit
        return m(state, tuple(i + 1 for i in sorted(subset)), PURPOSE + unit)

    iso_h = isolate_hunks(len(hunks), test, budget=settings.budget)
    return _culprit(base, iso_h, hunks, m, state_of), tuple(m.trials)


def _culprit(
    base: HunkCulprit,
    iso: HunkIsolation,
    hunks: tuple[Hunk, ...],
    m: _Measure,
    state_of: Callable[[frozenset[int]], State | None],
) -> HunkCulprit:
    """The HunkCulprit of a finished hunk search, with its evidence (medians, trials)."""
    trials = len(m.trials)
    if iso.culprit is None:
        found = tuple(hunks[i] for i in iso.candidates)
        return replace(base, culprit=None, candidates=found, trials=trials)
    slow_alone = iso.alone is None or iso.alone is Verdict.BAD
    with_ = frozenset() if slow_alone else iso.passing
    out = replace(
        base,
        culprit=hunks[iso.culprit],
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


def _trial_of(m: _Measure, state: State | None) -> HunkTrial | None:
    """The hunk search's trial of ``state`` that ran (None: not measured by it)."""
    return next((t for t in m.trials if t.state == state and t.samples), None)


def _repo_of(actuator: Any, key: str) -> str | None:
    from envbisect.sections.git import repo_of

    return repo_of(key, [str(r) for r in actuator.bad.section("git")])
