"""The section registry: every manifest section has a module, lookups, ranks, typed entries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from envbisect import sections
from envbisect.diff import SECTION_ORDER, diff_manifests
from envbisect.model.changes import Change, ChangeKind, Found, read_fields
from envbisect.model.manifest import SECTIONS, Manifest
from envbisect.sections.caches import CacheEntry
from envbisect.sections.data import DataEntry
from envbisect.sections.files import FileEntry
from envbisect.sections.git import GitEntry
from envbisect.sections.packages import PackageEntry
from envbisect.sections.probes import ProbeEntry


def test_every_manifest_section_has_a_module() -> None:
    names = {s.name for s in sections.known()}
    assert set(SECTIONS) <= names


def test_unit_sections_keep_their_order() -> None:
    assert SECTION_ORDER == (
        "torch-stack",
        "packages",
        "files",
        "git",
        "env",
        "data",
        "caches",
        "probes",
        "python",
        "system",
        "gpu",
    )
    assert sections.rank_of("packages") < sections.rank_of("nonesuch") < sections.rank_of("meta")


def test_an_unknown_section_is_reported_not_bisected() -> None:
    good = Manifest({"tpu": {"runtime": "1.0"}}, None)
    bad = Manifest({"tpu": {"runtime": "2.0"}}, None)
    (unit,) = diff_manifests(good, bad).units
    assert unit.id == "tpu:runtime"
    assert not unit.bisectable
    assert unit.reason == "envbisect has no way to re-create facts of section 'tpu'"


def test_a_registered_section_is_used_by_diff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a section is one module with a registered class: diff needs no other edit."""

    class Gauges(sections.Section):
        name = "gauges"
        word = "gauge"
        rank = 11
        bisectable = True

        def compare(self, src, g, b) -> Iterator[Found]:  # type: ignore[no-untyped-def]
            for key in sorted(set(g) | set(b)):
                if g.get(key) != b.get(key):
                    change = Change("gauges", key, g.get(key), b.get(key), ChangeKind.CHANGED)
                    yield Found(change, volatile=key.startswith("t_"))

    monkeypatch.setitem(sections._REGISTRY, "gauges", Gauges())
    monkeypatch.setattr(sections, "_ranks", lambda: {"gauges": 11})
    good = Manifest({"gauges": {"fan": 1, "t_read": 5}}, None)
    bad = Manifest({"gauges": {"fan": 2, "t_read": 6}}, None)
    result = diff_manifests(good, bad)
    assert [u.title for u in result.units] == ["gauge fan"]
    assert result.units[0].bisectable
    assert result.hidden == 1


@pytest.mark.parametrize("entry_type", [FileEntry, GitEntry, CacheEntry, PackageEntry])
def test_entries_tolerate_missing_fields(entry_type: type) -> None:
    assert entry_type.of({}) is not None


def test_plain_records_read_by_field_name() -> None:
    probe = read_fields(ProbeEntry, {"status": "patched", "other": 1})
    assert probe == ProbeEntry(status="patched")


def test_entry_descriptions() -> None:
    assert GitEntry.of({"head": "a" * 40, "branch": "main"}).describe() == ("aaaaaaaaaaaa (main)")
    dirty = GitEntry.of({"head": "b" * 40, "dirty": True, "diff_sha256": "c" * 64})
    assert dirty.describe() == "bbbbbbbbbbbb +uncommitted cccccccc"
    assert CacheEntry.of({"exists": False}).describe() == "missing"
    assert CacheEntry.of({"files": 0}).describe() == "empty"
    assert CacheEntry.of({"files": 1200, "bytes": 3_500_000}).describe() == ("1,200 files, 3.5 MB")
    assert read_fields(DataEntry, {"records": 1000, "size": 2000}).describe() == (
        "1,000 records, 2.0 KB"
    )
    assert FileEntry.of(None) is None
    assert GitEntry.of(None) == GitEntry()
