"""Two manifests -> Changes -> Units that bisection moves as one.

A **Change** is one fact that differs: ``section``, ``key``, ``old``, ``new`` and a
:class:`ChangeKind`. ``old``/``new`` hold the *compared* value in readable form (the full
entries stay in ``DiffResult.good`` / ``DiffResult.bad``):

- ``packages``: the version string; versions are compared with ``packaging.version``, and a
  change of the local label (``2.10.0+cu128`` -> ``2.11.0+cu130``) is an upgrade whose
  ``note`` says ``CUDA variant cu128 → cu130``;
- ``files``: the sha256; ``git``: ``head (branch)`` plus ``+uncommitted <hash>`` when dirty;
  ``data``: records and size; ``caches``: ``N files, SIZE`` / ``empty`` / ``missing``;
- ``env``: the value, or ``{"redacted": hex}``: redacted values compare by their hash only
  (a plain value on one side is hashed and compared to the other side's prefix). A plain
  value that a snapshot would redact today (an older or hand-written manifest) is shown
  redacted too, by the same rules (``envbisect.agent.redact``), and treated as redacted;
- ``probes``: the status (``original`` / ``patched`` / ``missing``);
- ``system`` / ``python`` / ``torch`` / ``gpu``: the scalar value (GPU devices as a summary).

A **Unit** is what bisection toggles. The *torch stack* (torch, triton, pytorch-triton,
torchvision, torchaudio, every ``nvidia-*`` and ``cuda-*`` wheel, and the ``torch`` section's
CUDA/cuDNN/NCCL facts) is one unit, because these wheels pin each other; torchvision and
torchaudio are in it since each pins one exact torch. Every other package, env var, file, git
repo, data entry, cache and probe is its own unit.

Bisectable or not (``reason`` says why, in plain words):

- ``system``, ``gpu``, ``python`` facts: never; a kernel, driver, GPU model or interpreter is
  not re-created by swapping software in a sandbox. They are reported.
- ``files``: when the file was added, or when either manifest stored its content (``blob``).
- ``git``: unless the good side had uncommitted changes (known by hash only).
- ``env``: unless the good value is redacted (it cannot be set again).
- ``data``: marked bisectable with a ``reason`` note: it is realizable only where
  envbisect.yaml's ``data_map`` says where the old dataset lives, which ``run`` checks; diff
  does not read the config.
- ``probes``: never on their own. A probe shows the *effect* of code (a monkeypatch, an edited
  module); the cause is a file, package or repo unit, which bisection moves instead, and the
  probe is re-observed in each trial. When the probe's module file is itself a changed file,
  the reason names that unit.

A fact present on one side and missing on the other *because collecting it failed there*
(an entry in that side's ``meta.errors``, e.g. a hung ``nvidia-smi``) is no change: its note
says so and its unit is never bisectable.

A manifest rebuilt for an earlier time (``snapshot --as-of``) carries a ``reconstructed:``
block; a change whose good or bad fact was reconstructed says so in its note, with the
fact's confidence and method, and each side names the time it was rebuilt for.

Volatile facts (``meta``: created time, elapsed, host; mtimes; the package ``installer``;
cache digests when files, sizes and subdirectories are unchanged, i.e. only mtimes moved) are
left out unless ``include_volatile=True``; ``DiffResult.hidden`` counts them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from envbisect import sections as registry
from envbisect.model.changes import (
    VOLATILE_KEYS,
    VOLATILE_REASON,
    Change,
    ChangeKind,
    Found,
    Unit,
    compare_versions,
)
from envbisect.model.errors import UsageError
from envbisect.model.manifest import Manifest
from envbisect.sections import DiffContext
from envbisect.sections.git import COMMITTED_NOTE, repo_of
from envbisect.sections.torch_stack import is_torch_stack

__all__ = [
    "CHANGE_SECTIONS",
    "COMMITTED_NOTE",
    "DIFF_SCHEMA",
    "SECTION_ORDER",
    "VOLATILE_KEYS",
    "Change",
    "ChangeKind",
    "DiffResult",
    "Unit",
    "compare_versions",
    "diff_manifests",
    "is_torch_stack",
    "repo_of",
]

# The --format json/yaml document of ``diff``; bump the number when a field changes meaning.
DIFF_SCHEMA = "envbisect/diff@1"

# Unit sections, most regression-relevant first; unknown sections follow, then meta.
SECTION_ORDER: tuple[str, ...] = registry.unit_sections()

# Names users may pass to --section besides unit sections (a change section).
CHANGE_SECTIONS: tuple[str, ...] = ("torch", "meta")


@dataclass(frozen=True)
class DiffResult:
    """Everything ``diff`` found. ``volatile`` holds the volatile changes left out of
    ``changes`` (empty with ``include_volatile=True``, where they are units of their own)."""

    good: Manifest
    bad: Manifest
    changes: tuple[Change, ...]
    units: tuple[Unit, ...]
    volatile: tuple[Change, ...] = ()
    sections_filter: tuple[str, ...] = field(default=())

    @property
    def hidden(self) -> int:
        """How many volatile changes were left out."""
        return len(self.volatile)

    @property
    def identical(self) -> bool:
        return not self.changes

    @property
    def bisectable(self) -> tuple[Unit, ...]:
        return tuple(u for u in self.units if u.bisectable)

    def unit(self, unit_id: str) -> Unit:
        for u in self.units:
            if u.id == unit_id:
                return u
        raise KeyError(unit_id)

    def summary(self, *, cli: bool = True) -> str:
        """E.g. ``14 changes in 6 sections → 9 bisectable units, 1 not bisectable``;
        ``cli=False`` leaves out the hint at a flag (for markdown pasted elsewhere)."""
        hint = "; --all shows them" if cli else ""
        hidden = f" ({self.hidden} volatile hidden{hint})" if self.hidden else ""
        if self.identical:
            return f"identical: no changes{hidden}"
        sections = len({c.section for c in self.changes})
        n_bis = len(self.bisectable)
        n_not = len(self.units) - n_bis
        return (
            f"{_plural(len(self.changes), 'change')} in {_plural(sections, 'section')} → "
            f"{_plural(n_bis, 'bisectable unit')}, {n_not} not bisectable{hidden}"
        )

    def select(self, sections: Iterable[str]) -> DiffResult:
        """Only the units of ``sections`` (unit sections, or change sections like ``torch``).

        Raises UsageError for a name that is no section of either manifest nor a known one.
        """
        wanted = tuple(dict.fromkeys(sections))
        if not wanted:
            return self
        known = set(SECTION_ORDER) | set(CHANGE_SECTIONS)
        known |= set(self.good.sections) | set(self.bad.sections)
        unknown = [s for s in wanted if s not in known]
        if unknown:
            raise UsageError(
                f"--section {unknown[0]!r} is not a section; choose from: "
                + ", ".join(sorted(known))
            )
        units = tuple(
            u
            for u in self.units
            if u.section in wanted or any(c.section in wanted for c in u.changes)
        )
        changes = tuple(c for u in units for c in u.changes)
        kept = {c.section for c in changes} | set(wanted)
        volatile = tuple(c for c in self.volatile if c.section in kept)
        return replace(
            self, changes=changes, units=units, volatile=volatile, sections_filter=wanted
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": DIFF_SCHEMA,
            "good": _side(self.good),
            "bad": _side(self.bad),
            "identical": self.identical,
            "summary": self.summary(),
            "hidden_volatile": self.hidden,
            "units": [u.as_dict() for u in self.units],
        }


def _side(m: Manifest) -> dict[str, Any]:
    meta = m.section("meta")
    side = {
        "path": str(m.path) if m.path else None,
        "label": m.label,
        "created": meta.get("created"),
        "host": meta.get("host"),
    }
    if m.reconstructed:
        side["reconstructed_as_of"] = m.section("reconstructed").get("as_of")
    return side


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# --------------------------------------------------------------------------- units


def _unit_of(found: Found, ctx: DiffContext) -> Unit:
    section = registry.get(found.change.section)
    unit = section.refine(section.unit(found.change), ctx)
    if found.volatile:
        return replace(unit, bisectable=False, reason=VOLATILE_REASON)
    if found.uncollected is not None:
        return replace(unit, bisectable=False, reason=found.uncollected)
    return unit


def _build_units(kept: list[Found], ctx: DiffContext) -> list[Unit]:
    """Units of the kept changes: sections claim what groups across changes (the torch
    stack), every other change is a unit of its own, then each section may regroup (a
    committed file joins its repo, a mapped dataset says where)."""
    units: list[Unit] = []
    rest = kept
    for section in registry.known():
        claimed, rest = section.claim(rest)
        units += claimed
    units += [_unit_of(found, ctx) for found in rest]
    for section in registry.known():
        units = section.regroup(units, ctx)
    # Stable sort: section rank, then the order the changes were found in.
    units.sort(key=lambda u: registry.rank_of(u.section))
    return units


# --------------------------------------------------------------------------- entry point


def diff_manifests(
    good: Manifest,
    bad: Manifest,
    *,
    include_volatile: bool = False,
    data_map: Mapping[str, str] | None = None,
) -> DiffResult:
    """Compare two manifests; group what differs into units bisection can move.

    ``data_map`` (envbisect.yaml's): where old datasets live, for the data units' notes.

    Raises ManifestError (naming file and field) for an entry of the wrong type.
    """
    src = (_source(good), _source(bad))
    names = list(good.sections) + [n for n in bad.sections if n not in good.sections]
    found: list[Found] = []
    for name in names:
        if name == "reconstructed":  # how facts were found, not facts: marked below
            continue
        g, b = good.sections.get(name), bad.sections.get(name)
        if g != b:
            found.extend(registry.get(name).diff(src, g, b))
    found = _mark_uncollected(found, good, bad)
    found = _mark_reconstructed(found, good, bad)
    kept = [f for f in found if include_volatile or not f.volatile]
    left_out = tuple(f.change for f in found if f.volatile and not include_volatile)
    ctx = DiffContext(good, bad, tuple(f.change for f in kept), data_map or {})
    units = _build_units(kept, ctx)
    return DiffResult(
        good=good,
        bad=bad,
        changes=tuple(c for u in units for c in u.changes),
        units=tuple(units),
        volatile=left_out,
    )


def _collect_errors(m: Manifest) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    errors = m.section("meta").get("errors") or []
    for err in errors if isinstance(errors, list) else []:
        if isinstance(err, dict) and err.get("section"):
            out.setdefault(str(err["section"]), []).append(str(err.get("error", "")))
    return out


def _error_for(errors: dict[str, list[str]], section: str, key: str) -> str | None:
    """The collection error behind a missing fact: one naming the key, else a section-wide one."""
    messages = errors.get(section) or []
    for message in messages:
        if message.startswith(f"{key}:"):
            return message
    if messages and registry.get(section).fails_whole:
        return messages[0]
    return None


def _mark_uncollected(found: list[Found], good: Manifest, bad: Manifest) -> list[Found]:
    """An entry missing on one side because collecting it failed there is no change.

    Its note and its unit's reason say so (from ``meta.errors``); it is never bisectable.
    """
    errors = {"good": _collect_errors(good), "bad": _collect_errors(bad)}
    if not errors["good"] and not errors["bad"]:
        return found
    out: list[Found] = []
    for item in found:
        change = item.change
        side = {ChangeKind.REMOVED: "bad", ChangeKind.ADDED: "good"}.get(change.kind)
        message = _error_for(errors[side], change.section, change.key) if side else None
        if message is not None:
            note = f"not collected in the {side} snapshot: {message}"
            why = (
                f"the {side} snapshot could not collect it ({message}); "
                "snapshot again once it can be read"
            )
            item = Found(replace(change, note=note), item.volatile, why)
        out.append(item)
    return out


def _reconstructed_facts(m: Manifest) -> dict[tuple[str, str], str]:
    """(section, key) -> ``confidence, method`` of each reconstructed fact (key ``*``: the
    whole section)."""
    out = {}
    facts = m.section("reconstructed").get("facts") or {}
    for section, entries in facts.items():
        for key, fact in (entries or {}).items():
            out[(section, key)] = f"{fact.get('confidence')}, {fact.get('method')}"
    return out


def _mark_reconstructed(found: list[Found], good: Manifest, bad: Manifest) -> list[Found]:
    """A change whose fact was reconstructed for a past time says so, and how sure it is."""
    sides = [(name, _reconstructed_facts(m)) for name, m in (("good", good), ("bad", bad))]
    if not any(facts for _, facts in sides):
        return found
    out: list[Found] = []
    for item in found:
        change = item.change
        marks = []
        for name, facts in sides:
            how = facts.get((change.section, change.key)) or facts.get((change.section, "*"))
            if how is not None:
                marks.append(f"{name} reconstructed ({how})")
        if marks:
            note = "; ".join(([change.note] if change.note else []) + marks)
            item = item._replace(change=replace(change, note=note))
        out.append(item)
    return out


def _source(m: Manifest) -> str:
    return str(m.path) if m.path else f"manifest {m.label!r}"
