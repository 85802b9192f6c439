"""diff.py: manifests -> changes -> units, on the fixture pairs and on hand-built manifests."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envbisect.diff import (
    ChangeKind,
    DiffResult,
    compare_versions,
    diff_manifests,
    is_torch_stack,
)
from envbisect.model import manifest
from envbisect.model.errors import ManifestError, UsageError
from envbisect.model.manifest import Manifest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "diff"


def load_pair(name: str) -> tuple[Manifest, Manifest]:
    return manifest.load(FIXTURES / name / "good.yaml"), manifest.load(FIXTURES / name / "bad.yaml")


def make(**sections: Any) -> Manifest:
    return Manifest(sections={"meta": {"label": "t"}, **sections})


def pkg(version: str, **extra: Any) -> dict[str, Any]:
    return {"version": version, "installer": "uv", "editable": False, "direct_url": None, **extra}


@pytest.fixture(scope="module")
def seed() -> DiffResult:
    return diff_manifests(*load_pair("seed"))


@pytest.fixture(scope="module")
def kinds() -> DiffResult:
    return diff_manifests(*load_pair("kinds"))


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("old", "new", "kind", "note"),
    [
        ("2.10.0+cu128", "2.11.0+cu130", ChangeKind.UPGRADED, "CUDA variant cu128 → cu130"),
        ("2.11.0+cu130", "2.10.0+cu128", ChangeKind.DOWNGRADED, "CUDA variant cu130 → cu128"),
        ("2.11.0+cu128", "2.11.0+cu130", ChangeKind.CHANGED, "CUDA variant cu128 → cu130"),
        ("2.11.0+cpu", "2.11.0+cu130", ChangeKind.CHANGED, "build variant cpu → cu130"),
        ("2.11.0", "2.11.0+rocm6.4", ChangeKind.CHANGED, "build variant (none) → rocm6.4"),
        ("1.0", "1.0+mine", ChangeKind.CHANGED, "local label (none) → mine"),
        ("3.5.1", "3.6.0", ChangeKind.UPGRADED, None),
        ("1.10.0", "1.9.9", ChangeKind.DOWNGRADED, None),
        ("2.0.0rc1", "2.0.0", ChangeKind.UPGRADED, None),  # numeric, not string, order
        ("2.0.0", "2.0.0.post1", ChangeKind.UPGRADED, None),
        ("not a version", "1.0", ChangeKind.CHANGED, None),
    ],
)
def test_compare_versions(old: str, new: str, kind: ChangeKind, note: str | None) -> None:
    assert compare_versions(old, new) == (kind, note)


version_parts = st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=4)


@given(version_parts, version_parts)
def test_version_order_is_antisymmetric(a: list[int], b: list[int]) -> None:
    va, vb = ".".join(map(str, a)), ".".join(map(str, b))
    forward, _ = compare_versions(va, vb)
    backward, _ = compare_versions(vb, va)
    flipped = {
        ChangeKind.UPGRADED: ChangeKind.DOWNGRADED,
        ChangeKind.DOWNGRADED: ChangeKind.UPGRADED,
        ChangeKind.CHANGED: ChangeKind.CHANGED,
    }
    assert flipped[forward] is backward


# --------------------------------------------------------------------------- the seed pair


def test_seed_pair_units(seed: DiffResult) -> None:
    assert [u.id for u in seed.units] == [
        "torch-stack",
        "packages:transformers",
        "files:/root/models/dflash-drafter/modeling_dflash.py",
        "git:/root/dflash",
        "env:PYTORCH_CUDA_ALLOC_CONF",
        "data:/root/data/prompts-v2.jsonl",
        "caches:inductor",
    ]
    assert all(u.bisectable for u in seed.units)
    assert not seed.identical


def test_torch_stack_holds_torch_triton_every_nvidia_wheel_and_build_facts(
    seed: DiffResult,
) -> None:
    stack = seed.unit("torch-stack")
    keys = {(c.section, c.key) for c in stack.changes}
    assert ("packages", "torch") in keys and ("packages", "triton") in keys
    assert ("torch", "cuda") in keys and ("torch", "cudnn") in keys and ("torch", "nccl") in keys
    good, bad = load_pair("seed")
    nvidia = {n for m in (good, bad) for n in m.section("packages") if n.startswith("nvidia-")}
    changed_nvidia = {
        n for n in nvidia if good.section("packages").get(n) != bad.section("packages").get(n)
    }
    assert changed_nvidia and changed_nvidia <= {k for s, k in keys if s == "packages"}
    # nvidia-ml-py did not change: it is not listed just for its name.
    assert ("packages", "nvidia-ml-py") not in keys
    torch = next(c for c in stack.changes if c.key == "torch")
    assert (torch.old, torch.new, torch.kind) == (
        "2.10.0+cu128",
        "2.11.0+cu130",
        ChangeKind.UPGRADED,
    )
    assert torch.note == "CUDA variant cu128 → cu130"
    assert stack.changes[0] is torch  # headline first
    assert stack.title == "torch stack (torch 2.10.0+cu128 → 2.11.0+cu130)"
    removed = {c.key for c in stack.changes if c.kind is ChangeKind.REMOVED}
    added = {c.key for c in stack.changes if c.kind is ChangeKind.ADDED}
    assert "nvidia-nccl-cu12" in removed and "nvidia-nccl-cu13" in added


def test_no_torch_stack_package_outside_the_stack(seed: DiffResult, kinds: DiffResult) -> None:
    for result in (seed, kinds):
        for unit in result.units:
            if unit.id != "torch-stack":
                assert not any(
                    c.section == "packages" and is_torch_stack(c.key) for c in unit.changes
                )


def test_seed_facts_read_plainly(seed: DiffResult) -> None:
    data = seed.unit("data:/root/data/prompts-v2.jsonl").changes[0]
    assert (data.old, data.new) == ("800,000 records, 1.7 GB", "1,100,000 records, 2.3 GB")
    cache = seed.unit("caches:inductor").changes[0]
    assert (cache.old, cache.new) == ("1,834 files, 412.0 MB", "empty")
    assert cache.note is not None and "emptied" in cache.note
    env = seed.unit("env:PYTORCH_CUDA_ALLOC_CONF").changes[0]
    assert (env.old, env.new, env.kind) == (None, "expandable_segments:True", ChangeKind.ADDED)
    data_unit = seed.unit("data:/root/data/prompts-v2.jsonl")
    assert data_unit.bisectable and data_unit.reason and "data_map" in data_unit.reason


def test_seed_summary(seed: DiffResult) -> None:
    assert seed.summary() == (
        "48 changes in 7 sections → 7 bisectable units, 0 not bisectable "
        "(4 volatile hidden; --all shows them)"
    )


def test_volatile_facts_hidden_unless_asked(seed: DiffResult) -> None:
    hidden = {(c.section, c.key) for c in seed.volatile}
    assert hidden == {
        ("meta", "label"),
        ("meta", "created"),
        ("meta", "elapsed_s"),
        ("caches", "triton"),
    }
    assert not any(c.section == "meta" for c in seed.changes)
    full = diff_manifests(*load_pair("seed"), include_volatile=True)
    assert full.hidden == 0
    triton = full.unit("caches:triton")
    assert not triton.bisectable and triton.reason and triton.reason.startswith("volatile")
    assert [u.id for u in full.units if u.bisectable] == [u.id for u in seed.units]


def test_identical_manifests() -> None:
    good, _ = load_pair("seed")
    result = diff_manifests(good, manifest.load(FIXTURES / "seed" / "good.yaml"))
    assert result.identical and result.units == () and result.summary() == "identical: no changes"


def test_only_volatile_differences_are_identical() -> None:
    good, _ = load_pair("seed")
    other = copy.deepcopy(good.sections)
    other["meta"]["created"] = "2030-01-01T00:00:00Z"
    other["meta"]["host"] = "elsewhere"
    result = diff_manifests(good, Manifest(other))
    assert result.identical and result.hidden == 2


# --------------------------------------------------------------------------- the kinds pair


def test_every_change_kind_appears(kinds: DiffResult) -> None:
    assert {c.kind for c in kinds.changes} == set(ChangeKind)


def test_package_kinds(kinds: DiffResult) -> None:
    by_key = {c.key: c for c in kinds.changes if c.section == "packages"}
    assert by_key["numpy"].kind is ChangeKind.DOWNGRADED
    assert by_key["accelerate"].kind is ChangeKind.UPGRADED
    assert (by_key["einops"].kind, by_key["einops"].new) == (ChangeKind.REMOVED, None)
    assert (by_key["flash-attn"].kind, by_key["flash-attn"].old) == (ChangeKind.ADDED, None)
    peft = by_key["peft"]
    assert peft.kind is ChangeKind.CHANGED and peft.note and "editable" in peft.note
    assert "regex" not in by_key  # installer only: volatile
    assert ("packages", "regex") in {(c.section, c.key) for c in kinds.volatile}


def test_not_bisectable_reasons(kinds: DiffResult) -> None:
    reasons = {u.id: u.reason for u in kinds.units if not u.bisectable}
    assert set(reasons) == {
        "files:/opt/venv/lib/python3.12/site-packages/torch/fx/_symbolic_trace.py",
        "files:/root/dflash/old_loss.py",
        "git:/root/dflash",
        "env:HF_TOKEN",
        "probes:torch.fx._symbolic_trace.is_fx_symbolic_tracing",
        "probes:torch.backends.cuda.sdp_kernel",
        "python:version",
        "system:kernel",
        "system:cpu_count",
        "gpu:driver",
        "gpu:devices",
        "slurm:partition",
    }
    assert all(reasons.values())
    assert "keep_blobs" in str(reasons["files:/root/dflash/old_loss.py"])
    assert "uncommitted" in str(reasons["git:/root/dflash"])
    assert "kernel" in str(reasons["system:kernel"])
    probe = str(reasons["probes:torch.fx._symbolic_trace.is_fx_symbolic_tracing"])
    assert probe.startswith("follows files:/opt/venv/lib/python3.12/site-packages/torch/fx/")
    # An added file needs no stored content: the trial just leaves it out.
    assert kinds.unit("files:/root/dflash/new_loss.py").bisectable
    assert kinds.unit("git:/root/tools").bisectable


def test_gpu_and_python_changes(kinds: DiffResult) -> None:
    driver = kinds.unit("gpu:driver").changes[0]
    assert driver.kind is ChangeKind.UPGRADED
    devices = kinds.unit("gpu:devices").changes[0]
    assert devices.old == "1 × NVIDIA H200 (143771 MiB)"
    assert devices.new == "2 × NVIDIA H100 80GB HBM3 (81559 MiB)"
    assert kinds.unit("python:version").changes[0].kind is ChangeKind.UPGRADED


# --------------------------------------------------------------------------- env and redaction


def _h(value: str) -> dict[str, str]:
    return {"redacted": hashlib.sha256(value.encode()).hexdigest()[:8]}


def test_redacted_env_compares_by_hash_and_never_shows_the_value() -> None:
    good = make(env={"TOKEN": _h("s3cret-first"), "SAME": _h("x"), "PLAIN": "v", "GONE": _h("g")})
    bad = make(env={"TOKEN": _h("s3cret-second"), "SAME": _h("x"), "PLAIN": _h("v")})
    result = diff_manifests(good, bad)
    assert [c.key for c in result.changes] == ["TOKEN", "GONE"]
    token = result.unit("env:TOKEN")
    assert token.changes[0].kind is ChangeKind.CHANGED and not token.bisectable
    assert result.unit("env:GONE").changes[0].kind is ChangeKind.REMOVED
    assert "s3cret" not in repr(result.as_dict())


def test_env_added_while_good_is_redacted_elsewhere_is_bisectable() -> None:
    result = diff_manifests(make(env={}), make(env={"NEW": _h("s")}))
    assert result.unit("env:NEW").bisectable


def test_a_plain_secret_in_an_older_manifest_is_shown_and_treated_as_redacted() -> None:
    token = "ghp_" + "0lderT0ken" * 4
    good = make(env={"HF_TOKEN": "plain-old-secret", "TORCH_NOTE": "x"})
    bad = make(env={"HF_TOKEN": _h("new"), "TORCH_NOTE": token})
    result = diff_manifests(good, bad)
    note = result.unit("env:TORCH_NOTE").changes[0]
    assert note.old == "x" and note.new["reason"] == "value holds a GitHub token"
    hf = result.unit("env:HF_TOKEN")
    assert hf.changes[0].old == _h("plain-old-secret") and not hf.bisectable
    assert token not in repr(result.as_dict()) and "plain-old-secret" not in repr(result.as_dict())


# --------------------------------------------------------------------------- other rules


def test_cache_digest_only_difference_is_volatile() -> None:
    entry = {"path": "/c", "exists": True, "files": 3, "bytes": 10, "digest": "a", "subdirs": {}}
    moved = dict(entry, digest="b")
    assert diff_manifests(make(caches={"x": entry}), make(caches={"x": moved})).identical
    grown = dict(entry, files=4, bytes=12, digest="b")
    result = diff_manifests(make(caches={"x": entry}), make(caches={"x": grown}))
    assert [u.id for u in result.units] == ["caches:x"]


def test_file_mtime_only_is_volatile_and_blob_makes_bisectable() -> None:
    a = {"sha256": "a" * 64, "size": 1, "blob": None, "mtime": 1}
    assert diff_manifests(make(files={"/f": a}), make(files={"/f": dict(a, mtime=2)})).identical
    b = {"sha256": "b" * 64, "size": 2, "blob": None}
    assert (
        not diff_manifests(make(files={"/f": a}), make(files={"/f": b})).unit("files:/f").bisectable
    )
    with_blob = dict(a, blob="a" * 64)
    unit = diff_manifests(make(files={"/f": with_blob}), make(files={"/f": b})).unit("files:/f")
    assert unit.bisectable and unit.reason is None


def test_git_good_clean_bad_dirty_same_head_is_bisectable() -> None:
    clean = {"head": "c" * 40, "branch": "main", "dirty": False, "diff_sha256": None}
    dirty = dict(clean, dirty=True, diff_sha256="d" * 64)
    result = diff_manifests(make(git={"/r": clean}), make(git={"/r": dirty}))
    unit = result.unit("git:/r")
    assert unit.bisectable and unit.changes[0].new == "cccccccccccc (main) +uncommitted dddddddd"


def test_torch_only_build_fact_makes_a_torch_stack() -> None:
    result = diff_manifests(make(torch={"cuda": "12.8"}), make(torch={"cuda": "13.0"}))
    assert [u.id for u in result.units] == ["torch-stack"]
    assert result.units[0].title == "torch stack"


def test_unknown_sections_are_reported_not_bisected() -> None:
    result = diff_manifests(make(extra={"a": 1}), make(extra={"a": 2}))
    unit = result.unit("extra:a")
    assert not unit.bisectable and unit.reason and "extra" in unit.reason


def test_swapping_sides_mirrors_kinds(kinds: DiffResult) -> None:
    good, bad = load_pair("kinds")
    back = diff_manifests(bad, good)
    mirror = {
        ChangeKind.ADDED: ChangeKind.REMOVED,
        ChangeKind.REMOVED: ChangeKind.ADDED,
        ChangeKind.UPGRADED: ChangeKind.DOWNGRADED,
        ChangeKind.DOWNGRADED: ChangeKind.UPGRADED,
        ChangeKind.CHANGED: ChangeKind.CHANGED,
    }
    forward = {(c.section, c.key): c.kind for c in kinds.changes}
    backward = {(c.section, c.key): c.kind for c in back.changes}
    assert set(forward) == set(backward)
    for key, kind in forward.items():
        assert backward[key] is mirror[kind], key


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
        st.tuples(version_parts, version_parts),
        max_size=12,
    )
)
def test_every_package_difference_is_exactly_one_change(
    pairs: dict[str, tuple[list[int], list[int]]],
) -> None:
    good = {n: pkg(".".join(map(str, a))) for n, (a, _) in pairs.items()}
    bad = {n: pkg(".".join(map(str, b))) for n, (_, b) in pairs.items()}
    result = diff_manifests(make(packages=good), make(packages=bad))
    differing = {n for n in pairs if good[n] != bad[n]}
    assert sorted(c.key for c in result.changes) == sorted(differing)
    assert sum(len(u.changes) for u in result.units) == len(result.changes)


# --------------------------------------------------------------------------- selection and errors


def test_select_sections(seed: DiffResult) -> None:
    only = seed.select(["env", "torch"])
    assert [u.id for u in only.units] == ["torch-stack", "env:PYTORCH_CUDA_ALLOC_CONF"]
    assert only.hidden == 0  # no volatile change in those sections
    assert seed.select(["caches"]).hidden == 1
    with pytest.raises(UsageError, match="--section 'nope' is not a section"):
        seed.select(["nope"])


def test_wrong_entry_type_names_file_and_field() -> None:
    bad = Manifest(sections={"packages": {"torch": ["2.1"]}}, path=Path("/m/bad.yaml"))
    with pytest.raises(ManifestError, match=r"^/m/bad.yaml: field 'packages.torch' must be a "):
        diff_manifests(make(packages={"torch": pkg("2.0")}), bad)


def test_as_dict_round_trips_through_json(kinds: DiffResult) -> None:
    import json

    data = json.loads(json.dumps(kinds.as_dict()))
    assert data["identical"] is False
    assert len(data["units"]) == len(kinds.units)
    assert {c["kind"] for u in data["units"] for c in u["changes"]} == {k.value for k in ChangeKind}


def test_fact_missing_because_collection_failed_is_no_bisectable_change() -> None:
    gpu = {"driver": "580.159.04", "devices": [{"index": 0, "name": "NVIDIA H200"}]}
    repo = {"head": "a" * 40, "branch": "main", "dirty": False}
    good = make(gpu=gpu, git={"/r": repo, "/s": repo})
    bad = Manifest(
        sections={
            "meta": {
                "label": "bad",
                "errors": [
                    {"section": "gpu", "error": "nvidia-smi timed out after 10 s"},
                    {"section": "git", "error": "/r: not a git repository"},
                ],
            },
            "gpu": {},
            "git": {},
        }
    )
    result = diff_manifests(good, bad)
    driver = result.unit("gpu:driver")
    assert not driver.bisectable and "nvidia-smi timed out" in str(driver.reason)
    assert (
        driver.changes[0].note
        == "not collected in the bad snapshot: nvidia-smi timed out after 10 s"
    )
    assert "not a git repository" in str(result.unit("git:/r").reason)
    # /s vanished without an error naming it: a real removal, bisectable.
    s = result.unit("git:/s")
    assert s.bisectable and s.changes[0].note is None


def test_a_probe_with_a_malformed_module_file_does_not_crash_the_diff() -> None:
    from envbisect.diff import diff_manifests
    from envbisect.model.manifest import Manifest

    good = Manifest.from_dict(
        {"schema": "envbisect/manifest@1", "probes": {"m.f": {"status": "original"}}}, "good"
    )
    bad = Manifest.from_dict(
        {
            "schema": "envbisect/manifest@1",
            "probes": {"m.f": {"status": "patched", "module_file": {"odd": "mapping"}}},
        },
        "bad",
    )
    result = diff_manifests(good, bad)
    assert [u.id for u in result.units] == ["probes:m.f"]


# -- no double counting; data notes that know data_map ---------------------------------------


def _repo_pair(dirty: bool) -> tuple[Manifest, Manifest]:
    g = {"/r": {"head": "a" * 40, "branch": "main", "dirty": False, "untracked": 0}}
    b = {"/r": {"head": "b" * 40, "branch": "main", "dirty": dirty, "untracked": 0}}
    fg = {"/r/train.py": {"sha256": "1" * 64, "size": 1, "blob": "1" * 64}}
    fb = {"/r/train.py": {"sha256": "2" * 64, "size": 1, "blob": "2" * 64}}
    loose = {"/etc/x.cfg": {"sha256": "3" * 64, "size": 1, "blob": "3" * 64}}
    loose_b = {"/etc/x.cfg": {"sha256": "4" * 64, "size": 1, "blob": "4" * 64}}
    return make(git=g, files={**fg, **loose}), make(git=b, files={**fb, **loose_b})


def test_a_committed_file_change_belongs_to_its_repo_unit() -> None:
    """Found 4: a committed edit was counted twice (files:…/train.py and git:…)."""
    good, bad = _repo_pair(dirty=False)
    result = diff_manifests(good, bad)
    assert [u.id for u in result.units] == ["files:/etc/x.cfg", "git:/r"]
    repo = result.unit("git:/r")
    assert [(c.section, c.key) for c in repo.changes] == [("git", "/r"), ("files", "/r/train.py")]
    assert repo.changes[1].note == "committed in this repo: moves with its commits"


def test_a_file_in_a_repo_with_untracked_files_stays_its_own_unit() -> None:
    """An untracked file (not in any worktree) listed under files: must still be written."""
    good, bad = _repo_pair(dirty=False)
    for m in (good, bad):
        m.section("git")["/r"]["untracked"] = 1
    ids = [u.id for u in diff_manifests(good, bad).units]
    assert "files:/r/train.py" in ids and "git:/r" in ids


def test_an_uncommitted_file_change_stays_its_own_unit() -> None:
    good, bad = _repo_pair(dirty=True)
    ids = [u.id for u in diff_manifests(good, bad).units]
    assert "files:/r/train.py" in ids and "git:/r" in ids


def test_the_data_note_says_where_data_map_puts_the_old_dataset() -> None:
    """Found 4: "bisectable only where data_map says…" showed with data_map set."""
    good = make(data={"/d.jsonl": {"size": 1, "records": 1, "fingerprint": "a"}})
    bad = make(data={"/d.jsonl": {"size": 2, "records": 2, "fingerprint": "b"}})
    plain = diff_manifests(good, bad).unit("data:/d.jsonl")
    assert plain.reason is not None and plain.reason.startswith("bisectable only where")
    mapped = diff_manifests(good, bad, data_map={"/d.jsonl": "/old/d.jsonl"}).unit("data:/d.jsonl")
    assert mapped.reason == "the other version is at /old/d.jsonl (data_map); run checks it"
