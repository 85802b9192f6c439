"""Cost of the strict manifest loader (issue 17) against the plain safe loaders it wraps.

On the 20,000-entry manifest of bench_diff (4,000 packages, 10,000 files, 6,000 cache
subdirs), in this process, paired (A B A B ...), medians over --runs pairs after a warm-up:

1. ``manifest.parse_yaml`` (libyaml's safe loader + refusing aliases, merge and duplicate
   keys, depth check) vs ``yaml.load`` with the same libyaml safe loader;
2. ``manifest.parse_json`` (duplicate-key hook, depth check) vs ``json.loads``;
3. refusing a 50 MB file (``read_bounded``: open, fstat, refuse) vs reading a 1 KB manifest.

Usage: python benchmarks/bench_loader.py [--runs N]
Prints a markdown table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_diff import generate, paired  # noqa: E402 - a sibling script, not a package

from envbisect.model import manifest  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    good, _bad = generate()
    text = good.to_yaml()
    as_json = json.dumps(good.as_dict())
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    tmp = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    big, small = tmp / "big.yaml", tmp / "small.yaml"
    with open(big, "wb") as fh:
        fh.truncate(50_000_000)
    small.write_text(f"schema: {manifest.SCHEMA}\n# {'x' * 1000}\n")

    def refuse() -> None:
        try:
            manifest.read_bounded(big, manifest.max_bytes())
        except manifest.YamlRefused:
            return
        raise AssertionError("a 50 MB file was read")

    rows = [
        (
            "parse_yaml vs yaml.load (CSafeLoader)",
            *paired(
                lambda: manifest.parse_yaml(text), lambda: yaml.load(text, Loader=loader), args.runs
            ),
        ),
        (
            "parse_json vs json.loads",
            *paired(
                lambda: manifest.parse_json(as_json), lambda: json.loads(as_json), args.runs * 3
            ),
        ),
        (
            "refuse 50 MB vs read 1 KB (read_bounded)",
            *paired(
                refuse, lambda: manifest.read_bounded(small, manifest.max_bytes()), args.runs * 20
            ),
        ),
    ]
    print(f"manifest: {len(text) / 1e6:.1f} MB YAML, {len(as_json) / 1e6:.1f} MB JSON\n")
    print("| pair (A vs B) | A s | B s | A/B |")
    print("|---|---|---|---|")
    for name, a, b, ratio in rows:
        print(f"| {name} | {a:.4f} | {b:.4f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
