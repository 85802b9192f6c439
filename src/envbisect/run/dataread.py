"""Did the program read the state's version of each dataset? The probe's proof, judged.

A dataset unit is realized where the program may open it (``sections.data``: argv mapped,
its place in the state's worktree linked, or the old version swapped in); the probe records
which of those places the program opened and the fingerprint of what it found
(``agent/probe_reads.py``). After each run: a dataset opened in another version than the
state's makes the trial unfaithful, naming the file (never a verdict on the wrong data); a
dataset none of whose places was opened is said as not verified (a read from C code, or data
the program does not read), never as faithful.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envbisect.model.failure import Failure
from envbisect.model.manifest import Manifest
from envbisect.model.metric import Measurement
from envbisect.realize.actuate import Realized


@dataclass(frozen=True)
class DataExpect:
    """One dataset of a state: the version the state has, and every place it may be read."""

    key: str  # the path as recorded
    fingerprint: str | None  # the state's version
    other: str | None  # the other manifest's version
    places: tuple[str, ...]


UNFAITHFUL = "state not faithful: the program read data "


def expected(
    values: Mapping[tuple[str, str], tuple[Any, Any]],
    good: Manifest,
    bad: Manifest,
    realized: Realized,
) -> tuple[DataExpect, ...]:
    """The datasets of a state (``values``: the actuator's ``state_values``, each from the
    good or the bad manifest; the other one holds the version it did not take)."""
    out = []
    for (section, key), (src, value) in sorted(values.items(), key=lambda kv: kv[0]):
        other = (bad if src is good else good).section("data")
        if section != "data" or not isinstance(value, Mapping):
            continue
        places = {key, realized.map_argv([key])[0]}
        for old, new in realized.path_map:
            if key.startswith(old.rstrip("/") + "/") and old != key:
                places.add(new.rstrip("/") + "/" + key[len(old.rstrip("/")) + 1 :])
        theirs = other.get(key)
        out.append(
            DataExpect(
                key,
                value.get("fingerprint"),
                theirs.get("fingerprint") if isinstance(theirs, Mapping) else None,
                tuple(sorted(places)),
            )
        )
    return tuple(out)


def watch(expects: Sequence[DataExpect]) -> tuple[str, ...]:
    """Every place the probe watches."""
    return tuple(sorted({p for e in expects for p in e.places}))


def judge(
    expects: Sequence[DataExpect], facts: Mapping[str, Any] | None
) -> tuple[str | None, tuple[str, ...]]:
    """(why the run is unfaithful, or None; notes) from the probe's ``data_reads``."""
    reads = (facts or {}).get("data_reads")
    if not expects or not isinstance(reads, list):
        return None, ()
    notes = []
    for e in expects:
        reals = {os.path.realpath(p) for p in e.places}
        mine = [
            r
            for r in reads
            if isinstance(r, Mapping) and (r.get("real") in reals or r.get("path") in e.places)
        ]
        wrong = [r for r in mine if e.fingerprint and r.get("fingerprint") != e.fingerprint]
        if wrong:
            got = wrong[0]
            which = "the other state's" if got.get("fingerprint") == e.other else "a"
            return (
                f"{UNFAITHFUL}{e.key} as {got.get('path')} "
                f"({which} version {str(got.get('fingerprint'))[7:19]}), not this state's "
                f"({str(e.fingerprint)[7:19]})"
            ), ()
        if not mine:
            notes.append(
                f"data {e.key}: read not verified (the probe saw no version of it opened: "
                "not read, or read by code that raises no audit event)"
            )
        else:
            notes.append(f"data {e.key}: the program read this state's version ({mine[0]['path']})")
    return None, tuple(notes)


def judged(
    m: Measurement, expects: Sequence[DataExpect], facts: Mapping[str, Any] | None
) -> tuple[Measurement, tuple[str, ...]]:
    """``m`` failed as unfaithful when the program read another version of a dataset than
    the state's; the notes on each dataset's read."""
    why, notes = judge(expects, facts)
    if why is None:
        return m, notes
    return Measurement(None, Failure(why), m.source, m.result), notes
