"""The run's last step below a guilty package unit: which part of the torch stack, which
release.

1. **The torch stack, split.** A guilty ``torch-stack`` unit is one block of torch, triton,
   the CUDA runtime wheels and the rest torch pins (``sections.torch_stack.components``).
   Its components are narrowed with the hunks' dd (``narrow.isolate_hunks``): a subset of
   components is a state of the unit (``Actuator.add_package_variant``: those components
   at the bad state's versions, the others at the good state's), on top of the rest of the
   culprit. Overlay venvs are exact ``--no-deps`` package sets, so any mix can be built;
   a mix outside the pins of its torch (read from the state's torch ``METADATA``
   ``Requires-Dist``) is said next to its trial and in the result, and its failure (a crash,
   an ImportError) is unresolved, never taken for the regression.
2. **Releases.** When one package alone is guilty (torch itself or another one-wheel
   component after the split, or a plain package unit), the releases between its two
   versions that the configured sources hold (``releases(name)``: final releases, ascending)
   are bisected to the first bad one (``narrow.first_bad``): at most ⌈log2 (R + 1)⌉ trials
   for R releases in between, within the run's ``--max-trials``. Each release is installed
   from the same sources. For torch, its companions (triton, the CUDA wheels, ... of the
   unit) take the versions that release pins, resolved with ``uv pip compile`` against the
   same sources (``uv_resolver``); where that fails they stay at the versions of the state
   below (the good state's, or the bad state's where torch was measured slow with them),
   said in the result together with any pin that leaves.

Trials go through the run's own test function (``hunkrun.Measure``), so they are numbered,
logged and replayed like the engine's. Nothing here prints: progress goes to a callback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from envbisect.model.errors import EnvBisectError
from envbisect.model.failure import Failure
from envbisect.search.hunkrun import HunkSettings, HunkTrial, Measure
from envbisect.search.narrow import first_bad, isolate_hunks
from envbisect.search.releases import (
    Companions,
    Releases,
    Resolve,
    package_entry,
    releases_between,
    version_of,
)
from envbisect.search.result import SearchOutcome, SearchResult
from envbisect.search.state import Outcome, State
from envbisect.search.verdict import Judge, Noise, Verdict
from envbisect.sections.packages import PackageEntry
from envbisect.sections.torch_stack import CUDA, TORCH, Component, components, outside_pins

SPLIT = "narrow: torch stack"
RELEASES = "narrow: releases of "


@dataclass(frozen=True)
class StackSplit:
    """Which component of a guilty torch stack made it slow.

    ``culprit``: the component, or None with ``candidates`` the ones it is still among;
    ``together``: components it is slow only with; ``warnings``: states measured outside
    torch's pins (``trial N: …``)."""

    unit: str
    components: tuple[Component, ...]
    culprit: Component | None
    candidates: tuple[Component, ...] = ()
    together: tuple[Component, ...] = ()
    warnings: tuple[str, ...] = ()
    trials: int = 0
    cuda_note: str | None = None  # CUDA wheels changed, or stayed beside a +cpu torch

    def sentence(self) -> str:
        """``culprit within the torch stack: torch itself (2.13.0+cpu → 2.14.1)``."""
        if self.culprit is None:
            names = ", ".join(c.describe() for c in self.candidates)
            return f"culprit within the torch stack: one of {names}"
        out = f"culprit within the torch stack: {self.culprit.describe()}"
        if self.together:
            out += " (slow only together with " + ", ".join(c.name for c in self.together) + ")"
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "culprit": self.culprit.as_dict() if self.culprit is not None else None,
            "sentence": self.sentence(),
            "candidates": [c.as_dict() for c in self.candidates],
            "together_with": [c.name for c in self.together],
            "components": [c.as_dict() for c in self.components],
            "outside_pins": list(self.warnings),
            "cuda": self.cuda_note,
            "trials": self.trials,
        }


@dataclass(frozen=True)
class ReleaseSearch:
    """The releases of one guilty package between its good and bad versions.

    ``releases``: the versions in between, ordered from the good version towards the bad
    one; ``first_bad``: the first of them (or the bad version itself) that is slow, None
    when unresolved releases hide it (``candidates``) or when none lies between."""

    package: str
    good: str
    bad: str
    releases: tuple[str, ...]
    first_bad: str | None = None
    candidates: tuple[str, ...] = ()
    trials: int = 0
    note: str | None = None  # why there was no search, or what stayed fixed meanwhile
    spent: bool = False  # --max-trials ended it
    warnings: tuple[str, ...] = ()  # releases measured outside torch's pins (``trial N: …``)

    @property
    def upgrade(self) -> bool:
        return version_of(self.bad) >= version_of(self.good)

    def last_good(self) -> str | None:
        """The release just before the first bad one, from the good side."""
        if self.first_bad is None:
            return None
        order = [*self.releases, self.bad]
        i = order.index(self.first_bad)
        return self.good if i == 0 else order[i - 1]

    def sentence(self) -> str:
        """``first bad release: torch 2.14.0 (2.13.0 is the last fast one)`` for an upgrade;
        a downgrade names the newest slow release and the release that fixed it."""
        name = self.package
        if not self.releases:
            return self.note or f"no release of {name} lies between {self.good} and {self.bad}"
        if self.first_bad is None:
            among = ", ".join(self.candidates)
            why = "--max-trials reached" if self.spent else "unresolved releases hide it"
            return f"first bad release of {name}: one of {among} ({why})"
        fast = self.last_good()
        if self.upgrade:
            return f"first bad release: {name} {self.first_bad} ({fast} is the last fast one)"
        return (
            f"first bad release going down from {self.good}: {name} {self.first_bad} is the "
            f"newest slow release; {name} {fast} fixed it (every release from {fast} up is fast)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "good": self.good,
            "bad": self.bad,
            "direction": "upgrade" if self.upgrade else "downgrade",
            "releases": list(self.releases),
            "first_bad": self.first_bad,
            "last_good": self.last_good(),
            "candidates": list(self.candidates),
            "sentence": self.sentence(),
            "note": self.note,
            "trials": self.trials,
            "budget_spent": self.spent,
            "outside_pins": list(self.warnings),
        }


@dataclass(frozen=True)
class PackageFinding:
    """What the package step found below one culprit unit."""

    unit: str
    split: StackSplit | None = None
    release: ReleaseSearch | None = None
    trials: tuple[HunkTrial, ...] = field(default=(), repr=False)
    labels: tuple[tuple[State, str], ...] = field(default=(), repr=False)  # what a state is

    def lines(self) -> list[str]:
        out = []
        if self.split is not None:
            out.append(self.split.sentence())
            if self.split.cuda_note:
                out.append(self.split.cuda_note)
            out += [f"warning: {w}" for w in self.split.warnings]
        if self.release is not None:
            out.append(self.release.sentence())
            if self.release.note and self.release.releases:
                out.append(self.release.note)
            out += [f"warning: {w}" for w in self.release.warnings]
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "stack": self.split.as_dict() if self.split is not None else None,
            "release": self.release.as_dict() if self.release is not None else None,
        }


class _Step:
    """One culprit's package step: its unit, the run's actuator and measuring function."""

    def __init__(
        self,
        unit: Any,
        core: frozenset[str],
        actuator: Any,
        m: Measure,
        settings: HunkSettings,
    ) -> None:
        self.unit = unit
        self.core = core
        self.a = actuator
        self.m = m
        self.s = settings
        self.warned: dict[State, list[str]] = {}
        self.labels: dict[State, str] = {}
        m.excuse = self._excuse

    def bad_value(self, key: str) -> Any:
        return self.a.bad.section("packages").get(key)

    def state(self, values: Mapping[str, Any]) -> State:
        """The core with the unit at ``values`` (the good state's unit when empty)."""
        if not values:
            return State.of(self.core - {self.unit.id})
        return State.of(self.core, {self.unit.id: self.a.add_package_variant(self.unit.id, values)})

    def budget(self) -> int | None:
        if self.s.budget is None:
            return None
        return max(0, self.s.budget - len(self.m.trials))

    def pins(self, state: State) -> list[str]:
        """What in ``state`` lies outside the pins of its torch (read from the torch
        METADATA of the state's venv; nothing when it cannot be read)."""
        if state in self.warned:
            return self.warned[state]
        found = _torch_metadata(self.a, state)
        out: list[str] = []
        if found is not None:
            torch, requires = found
            versions = self.versions(state)
            out = outside_pins(torch, requires, versions)
        self.warned[state] = out
        return out

    def versions(self, state: State) -> dict[str, str | None]:
        """The state's version of each package of the unit (None: absent)."""
        values = self.a.state_values(frozenset(state.applied), dict(state.positions))
        out: dict[str, str | None] = {}
        for c in self.unit.changes:
            if c.section != "packages":
                continue
            entry = PackageEntry.of(values.get(("packages", str(c.key)), (None, None))[1])
            out[str(c.key)] = entry.version if entry is not None else None
        return out

    def _excuse(self, state: State, failure: Failure) -> str | None:
        """A failed state that says nothing about the regression: outside torch's pins, or
        a wheel that does not import."""
        if "ImportError" in failure or "ModuleNotFoundError" in failure:
            return "a wheel of this mix does not import: unresolved, not counted as slow"
        if self.pins(state):
            return "outside torch's pins: unresolved, not counted as slow"
        return None

    def measure(self, state: State, purpose: str, shown: str, label: str) -> Verdict:
        self.labels.setdefault(state, label)
        known = state in self.m.seen
        verdict = self.m(state, (), purpose, shown)
        if not known:
            for line in self.pins(state):
                self.m.progress(f"  warning: {line}")
        return verdict


def _torch_metadata(actuator: Any, state: State) -> tuple[str, list[str]] | None:
    """(version, Requires-Dist) of the torch a state runs: from its overlay venv (the wheel
    installed there, else the link farm of the target's), else the target's own; on a
    remote target read there by the agent (its files are not here)."""
    venv = actuator.venv_of(frozenset(state.applied), dict(state.positions))
    location = None
    if venv is None:
        with contextlib.suppress(Exception):  # a target that cannot be probed: no pins
            torch = actuator.target().dists.get("torch")
            location = str(torch["location"]) if torch is not None else None
    if actuator.remote:
        return _far_torch_metadata(actuator, venv, location)
    paths: list[str] = []
    if venv is not None:
        paths += [str(p) for p in sorted((venv / "lib").glob("python*/site-packages"))]
        paths.append(str(venv / "base-site"))
    elif location is not None:
        paths.append(location)
    paths = [p for p in paths if Path(p).is_dir()]
    if not paths:
        return None
    for dist in metadata.distributions(path=paths):
        if canonicalize_name(dist.metadata["Name"] or "") == "torch":
            return dist.version, list(dist.requires or ())
    return None


def _far_torch_metadata(
    actuator: Any, venv: Path | None, location: str | None
) -> tuple[str, list[str]] | None:
    """The same, asked of the agent on the target; None when it cannot say."""
    params = {"venv": str(venv) if venv is not None else None, "location": location}
    log = actuator.session.root / "remote"
    try:
        got = actuator.agent("torch_requires", params, log, "pins", timeout_s=60)
    except EnvBisectError:
        return None
    version = got.get("version")
    return (str(version), [str(r) for r in got.get("requires") or ()]) if version else None


def _cuda_note(comps: Sequence[Component], bad: Any) -> str | None:
    """Said whenever the CUDA wheels changed, or stayed installed beside a +cpu torch."""
    cuda = next((c for c in comps if c.name == CUDA), None)
    torch = PackageEntry.of(bad.section("packages").get("torch"))
    kept = sorted(
        str(k)
        for k in bad.section("packages")
        if str(k).startswith(("nvidia-", "cuda-")) and str(k) not in (cuda.keys if cuda else ())
    )
    out = []
    if cuda is not None:
        shown = [f"{c.key} {c.old or 'absent'} → {c.new or 'absent'}" for c in cuda.changes]
        more = f", … {len(shown) - 3} more" if len(shown) > 3 else ""
        out.append(f"the CUDA runtime wheels changed ({', '.join(shown[:3])}{more})")
    if torch is not None and torch.version and "+cpu" in torch.version and kept:
        out.append(
            f"{len(kept)} CUDA wheel(s) stayed installed beside torch {torch.version} "
            f"({', '.join(kept[:3])}{', …' if len(kept) > 3 else ''}): a +cpu torch does not "
            "use them"
        )
    return "; ".join(out) or None


def _kept(comps: Sequence[Component], culprit: Component, base: Mapping[str, Any]) -> str:
    """Where torch's companions stay while its releases are tried when they are not
    resolved for each release (the pin warnings say what that leaves outside the pins)."""
    good = [c.name for c in comps if c is not culprit and c.keys[0] not in base]
    bad = [c.name for c in comps if c is not culprit and c.keys[0] in base]
    parts = [f"{', '.join(good)} stayed at the good state's versions"] if good else []
    if bad:
        parts.append(
            f"{', '.join(bad)} stayed at the bad state's versions (torch itself was measured "
            "slow with them)"
        )
    return "; ".join(parts)


def split_stack(step: _Step) -> tuple[StackSplit, frozenset[int], Component | None]:
    """Narrow the guilty stack to a component; the split, the components it is slow with
    (indices) and the culprit component."""
    comps = components(step.unit)
    cuda = _cuda_note(comps, step.a.bad)
    if len(comps) < 2:
        only = comps[0] if comps else None
        return StackSplit(step.unit.id, comps, only, cuda_note=cuda), frozenset(), only
    step.m.progress(
        f"{step.unit.id} is guilty: splitting it into {len(comps)} components "
        f"({', '.join(c.name for c in comps)})"
    )
    values = {i: {k: step.bad_value(k) for k in c.keys} for i, c in enumerate(comps)}

    def test(subset: frozenset[int]) -> Verdict:
        chosen = {k: v for i in sorted(subset) for k, v in values[i].items()}
        shown = " + ".join(comps[i].name for i in sorted(subset))
        what = f"torch stack: {shown} as in the bad state"
        return step.measure(step.state(chosen), SPLIT, what, shown)

    iso = isolate_hunks(len(comps), test, budget=step.budget())
    warnings = tuple(
        f"trial {step.m.number(t.state)}: {w}" for t in step.m.trials for w in step.pins(t.state)
    )
    culprit = comps[iso.culprit] if iso.culprit is not None else None
    # alone GOOD: slow only with the others; UNRESOLVED (it does not run without them, e.g.
    # an ImportError): still the culprit, measured with them.
    slow_alone = iso.alone is not Verdict.GOOD
    together = () if slow_alone else tuple(comps[i] for i in sorted(iso.passing))
    split = StackSplit(
        step.unit.id,
        comps,
        culprit,
        candidates=() if culprit is not None else tuple(comps[i] for i in iso.candidates),
        together=together,
        warnings=warnings,
        trials=len(step.m.trials),
        cuda_note=cuda,
    )
    base = frozenset() if iso.alone in (None, Verdict.BAD) else iso.passing
    return split, base, culprit


def search_releases(
    step: _Step,
    key: str,
    base: Mapping[str, Any],
    releases: Releases,
    companions: Companions | None,
) -> ReleaseSearch | None:
    """Bisect the releases of package ``key`` between its good and bad versions, the unit's
    other packages at ``base`` (their values below the culprit). None when the package is
    absent on one side (added or removed: there is nothing between)."""
    good = PackageEntry.of(step.a.good.section("packages").get(key))
    bad = PackageEntry.of(step.bad_value(key))
    if good is None or bad is None or not good.version or not bad.version:
        return None
    if step.budget() == 0:
        note = f"--max-trials reached: the releases of {key} were not searched"
        return ReleaseSearch(key, good.version, bad.version, (), note=note, spent=True)
    if good.direct_url or bad.direct_url:
        note = f"{key} was installed from a direct URL: no release search"
        return ReleaseSearch(key, good.version, bad.version, (), note=note)
    try:
        available = releases(key)
    except (EnvBisectError, OSError, ValueError) as exc:
        note = f"cannot list the releases of {key} ({exc}): no release search"
        return ReleaseSearch(key, good.version, bad.version, (), note=note)
    between = releases_between(good.version, bad.version, available)
    if not between:
        note = (
            f"no release of {key} lies between {good.version} and {bad.version} in the "
            "configured sources: no release search"
        )
        return ReleaseSearch(key, good.version, bad.version, (), note=note)
    step.m.progress(
        f"{key} alone is guilty: bisecting the {len(between)} release(s) between "
        f"{good.version} and {bad.version} ({', '.join(between)})"
    )
    spent_before = len(step.m.trials)

    def test(p: int) -> Verdict:
        v = between[p]
        values = {
            **base,
            **(companions.values(key, v) if companions else {}),
            key: package_entry(v),
        }
        shown = f"{key} {v} (a release between the endpoints)"
        return step.measure(step.state(values), RELEASES + key, shown, f"{key}=={v}")

    found = first_bad(len(between) + 1, test, budget=step.budget())
    order = [*between, bad.version]
    warnings = tuple(
        f"trial {step.m.number(t.state)}: {w}"
        for t in step.m.trials[spent_before:]
        for w in step.pins(t.state)
    )
    return ReleaseSearch(
        key,
        good.version,
        bad.version,
        tuple(between),
        first_bad=order[found.first_bad] if found.first_bad is not None else None,
        candidates=tuple(order[p] for p in found.candidates),
        trials=len(step.m.trials) - spent_before,
        note=companions.note() if companions else None,
        spent=found.spent,
        warnings=warnings,
    )


def _guilty(result: SearchResult, units: Mapping[str, Any]) -> list[tuple[Any, frozenset[str]]]:
    """The culprit units the package step can narrow (torch stacks, single packages), each
    with the units it was isolated with, in the order the search found them."""
    if result.outcome is not SearchOutcome.FOUND:
        return []
    out = []
    for iso in result.culprits:
        for unit_id in iso.units:
            unit = units.get(unit_id)
            if unit is None:
                continue
            plain = unit.section == "packages" and len(unit.changes) == 1
            if unit.section == "torch-stack" or plain:
                out.append((unit, frozenset(iso.units)))
    return out


def find_within(
    result: SearchResult,
    actuator: Any,
    measure: Callable[[State, int], Outcome],
    settings: HunkSettings,
    progress: Callable[[str], None],
    number: Callable[[State], int],
    releases: Releases,
    resolve: Resolve | None = None,
) -> tuple[PackageFinding, ...]:
    """Below each guilty package unit of ``result`` (several with ``--find-all``), within
    one budget: the stack's component, then the first bad release (see the module
    docstring). () when no culprit is a package unit."""
    noise = Noise.from_groups(t.samples for t in result.trials if not t.failure)
    out: list[PackageFinding] = []
    for unit, core in _guilty(result, {u.id: u for u in actuator.units}):
        spent = sum(len(f.trials) for f in out)
        left = None if settings.budget is None else settings.budget - spent
        if left is not None and left <= 0:
            break
        assert result.threshold is not None
        mine = replace(settings, budget=left)
        m = Measure(measure, Judge(result.threshold, noise), mine, progress, number)
        out.append(_below(_Step(unit, core, actuator, m, mine), releases, resolve))
    return tuple(out)


def _below(step: _Step, releases: Releases, resolve: Resolve | None) -> PackageFinding:
    """One guilty package unit: its component (a torch stack), then its first bad release."""
    unit, progress = step.unit, step.m.progress
    split = None
    key: str | None = str(unit.changes[0].key)
    base: dict[str, Any] = {}
    companions: Companions | None = None
    if unit.section == "torch-stack":
        split, passing, culprit = split_stack(step)
        progress(split.sentence())
        if split.cuda_note:
            progress(split.cuda_note)
        comps = split.components
        base = {k: step.bad_value(k) for i in passing for k in comps[i].keys}
        key = culprit.keys[0] if culprit is not None and len(culprit.keys) == 1 else None
        if culprit is not None and culprit.name == TORCH:
            keys = tuple(k for c in comps if c is not culprit for k in c.keys)
            companions = Companions(keys, _kept(comps, culprit, base), resolve)
    release = None if key is None else search_releases(step, key, base, releases, companions)
    if release is not None:
        progress(release.sentence())
    labels = tuple(step.labels.items())
    return PackageFinding(unit.id, split, release, tuple(step.m.trials), labels)
