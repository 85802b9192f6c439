"""Diff speed on two generated manifests of 20,000 entries each (goal: diff <= 0.3 s).

Each manifest holds 4,000 packages, 10,000 files and one compile cache of 6,000 subdirectories
(20,000 entries), plus the usual small sections. The bad side upgrades 5 % of the packages,
changes 2 % of the files, adds and removes some of each and grows a quarter of the cache.

Measured in this process, paired (A B A B ...), medians over --runs pairs after one warm-up:

1. core: ``diff_manifests(good, bad)`` vs the reference, a plain dict-equality pass over the
   same sections (``g.get(k) == b.get(k)`` for every key): the least any diff must do;
2. load: ``manifest.load`` of both files (libyaml when PyYAML has it) vs ``yaml.load`` of the
   same two texts with the same loader (the validation overhead of manifest.load);
3. load, JSON-encoded vs YAML: the same manifests through manifest.load's JSON fast path;
4. render: ``render(result, "table")`` and ``render(result, "json")``, and each against the
   same output without the secret rules (``render_table``; ``json.dumps`` of ``as_dict()``).

The whole CLI process (``envbisect diff good.yaml bad.yaml``, and the same on the .json
files) is measured separately, from outside, on the files this script leaves with
``--keep DIR``; the load pairs use a third of --runs (YAML loads take seconds).

Usage: python benchmarks/bench_diff.py [--runs N] [--keep DIR]
Prints a markdown table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from envbisect.diff import DiffResult, diff_manifests
from envbisect.model import manifest
from envbisect.model.manifest import Manifest
from envbisect.render.diff import render, render_table

N_PACKAGES, N_FILES, N_SUBDIRS = 4_000, 10_000, 6_000


def h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def generate() -> tuple[Manifest, Manifest]:
    rnd = random.Random(20261202)
    good = _good_sections(rnd)
    bad = _drifted(good, rnd)
    return Manifest(good), Manifest(bad)


def _good_sections(rnd: random.Random) -> dict[str, Any]:
    """The good side: N_PACKAGES packages, N_FILES files, one cache of N_SUBDIRS subdirs."""
    packages = {
        f"pkg-{i:05d}": {
            "version": f"{rnd.randint(0, 9)}.{rnd.randint(0, 30)}.{rnd.randint(0, 9)}",
            "installer": "uv",
            "editable": False,
            "direct_url": None,
        }
        for i in range(N_PACKAGES)
    }
    files = {
        f"/srv/project/src/mod{i // 100:03d}/file{i:05d}.py": {
            "sha256": h(f"f{i}"),
            "size": 1000 + i,
            "blob": None,
        }
        for i in range(N_FILES)
    }
    subdirs = {
        f"{h(str(i))[:2]}/{h(f'd{i}')[:40]}": {
            "files": 3,
            "bytes": 9000 + i,
            "digest": h(f"s{i}")[:16],
        }
        for i in range(N_SUBDIRS)
    }
    return {
        "meta": {"label": "good", "created": "2026-12-01T00:00:00Z", "host": "bench"},
        "system": {"os": "Ubuntu 24.04", "kernel": "6.8.0", "arch": "x86_64"},
        "python": {"version": "3.12.3", "implementation": "CPython"},
        "torch": {"version": "2.10.0+cu128", "cuda": "12.8"},
        "packages": packages,
        "files": files,
        "caches": {
            "inductor": {
                "path": "/tmp/torchinductor_root",
                "exists": True,
                "files": 3 * N_SUBDIRS,
                "bytes": sum(s["bytes"] for s in subdirs.values()),
                "digest": h("good-cache")[:16],
                "subdirs": subdirs,
            }
        },
        "env": {"CUDA_VISIBLE_DEVICES": "0"},
    }


def _drifted(good: dict[str, Any], rnd: random.Random) -> dict[str, Any]:
    """The bad side: 5 % of the packages upgraded, 2 % of the files changed, some of each
    added and removed, a quarter of the cache grown, a new torch."""
    bad: dict[str, Any] = yaml.safe_load(yaml.safe_dump(good))  # a deep copy
    bad["meta"].update(label="bad", created="2026-12-02T00:00:00Z")
    bad["torch"] = {"version": "2.11.0+cu130", "cuda": "13.0"}
    names = list(bad["packages"])
    for name in rnd.sample(names, N_PACKAGES // 20):
        bad["packages"][name]["version"] += ".post1"
    for name in names[:20]:
        del bad["packages"][name]
    for i in range(20):
        bad["packages"][f"new-pkg-{i}"] = {"version": "1.0", "installer": "uv"}
    paths = list(bad["files"])
    for path in rnd.sample(paths, N_FILES // 50):
        bad["files"][path].update(sha256=h(path + "changed"), size=bad["files"][path]["size"] + 7)
    for path in paths[:50]:
        del bad["files"][path]
    for i in range(50):
        bad["files"][f"/srv/project/src/new/file{i}.py"] = {
            "sha256": h(str(i)),
            "size": 1,
            "blob": None,
        }
    cache = bad["caches"]["inductor"]
    for name in rnd.sample(list(cache["subdirs"]), N_SUBDIRS // 4):
        cache["subdirs"][name]["bytes"] += 100
    cache["bytes"] += 100 * (N_SUBDIRS // 4)
    cache["digest"] = h("bad-cache")[:16]
    return bad


def reference(good: Manifest, bad: Manifest) -> int:
    """A plain dict-equality pass over the same sections: the floor for any diff."""
    differing = 0
    for name in set(good.sections) | set(bad.sections):
        g, b = good.section(name), bad.section(name)
        for key in set(g) | set(b):
            if g.get(key) != b.get(key):
                differing += 1
    return differing


def paired(
    a: Callable[[], object], b: Callable[[], object], runs: int
) -> tuple[float, float, float]:
    """Medians of A, of B, and of the per-pair ratio A/B, after one warm-up pair."""
    a(), b()
    ta, tb, ratios = [], [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
        ratios.append((t1 - t0) / (t2 - t1))
    return statistics.median(ta), statistics.median(tb), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--keep", type=Path, default=None, help="Write good.yaml/bad.yaml here.")
    args = parser.parse_args()

    good, bad = generate()
    entries = [
        len(m.section("packages"))
        + len(m.section("files"))
        + len(m.section("caches")["inductor"]["subdirs"])
        for m in (good, bad)
    ]
    out = args.keep or Path(tempfile.mkdtemp(prefix="bench-diff-"))
    good_path, bad_path = out / "good.yaml", out / "bad.yaml"
    manifest.save(good, good_path)
    manifest.save(bad, bad_path)
    # The same manifests JSON-encoded (JSON is YAML; manifest.load has a fast path for it).
    good_json, bad_json = out / "good.json", out / "bad.json"
    good_json.write_text(json.dumps(good.as_dict()))
    bad_json.write_text(json.dumps(bad.as_dict()))
    good, bad = manifest.load(good_path), manifest.load(bad_path)
    result = diff_manifests(good, bad)

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    rows = _diff_rows(good, bad, args.runs) + _load_rows(
        (good_path, bad_path), (good_json, bad_json), loader, max(3, args.runs // 3)
    )
    rows += _render_rows(result, args.runs)
    version = sys.version.split()[0]
    print(f"entries per manifest: {entries}; loader: {loader.__name__}; python {version}")
    print(f"result: {result.summary()}")
    for path in (good_path, bad_path, good_json, bad_json):
        print(f"file: {path} ({path.stat().st_size:,} B)")
    print()
    print("| measure (A vs B) | A median s | B median s | A/B median |")
    print("|---|---|---|---|")
    for name, ta, tb, ratio in rows:
        print(f"| {name} | {ta:.4f} | {tb:.4f} | {ratio:.2f} |")


Row = tuple[str, float, float, float]


def _diff_rows(good: Manifest, bad: Manifest, runs: int) -> list[Row]:
    return [
        (
            "core diff vs dict-equality pass",
            *paired(lambda: diff_manifests(good, bad), lambda: reference(good, bad), runs),
        ),
    ]


def _load_rows(
    yaml_paths: tuple[Path, Path], json_paths: tuple[Path, Path], loader: Any, runs: int
) -> list[Row]:
    """manifest.load against plain yaml.load, and of JSON against YAML (``runs``: fewer
    pairs than the others, YAML loads take seconds)."""
    texts = [path.read_text() for path in yaml_paths]
    return [
        (
            "manifest.load x2 vs yaml.load x2",
            *paired(
                lambda: [manifest.load(path) for path in yaml_paths],
                lambda: [yaml.load(t, Loader=loader) for t in texts],  # a safe loader
                runs,
            ),
        ),
        (
            "manifest.load x2: JSON-encoded vs YAML",
            *paired(
                lambda: [manifest.load(path) for path in json_paths],
                lambda: [manifest.load(path) for path in yaml_paths],
                runs,
            ),
        ),
    ]


def _render_rows(result: DiffResult, runs: int) -> list[Row]:
    return [
        (
            "render table vs render json",
            *paired(lambda: render(result, "table"), lambda: render(result, "json"), runs),
        ),
        # The secret rules' cost (issue 16): each format against the same text unredacted.
        (
            "render table vs render_table (unredacted)",
            *paired(lambda: render(result, "table"), lambda: render_table(result), runs),
        ),
        (
            "render json vs json.dumps(as_dict()) (unredacted)",
            *paired(
                lambda: render(result, "json"),
                lambda: json.dumps(result.as_dict(), indent=2, ensure_ascii=False, default=str),
                runs,
            ),
        ),
    ]


if __name__ == "__main__":
    main()
