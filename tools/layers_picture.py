"""Draw the layers of ``.importlinter`` with the imports they make, from the code itself.

``python tools/layers_picture.py`` prints the picture; ``--write`` puts it into
docs/ARCHITECTURE.md between its ``layers:begin`` / ``layers:end`` markers, and ``--check``
exits 1 when the page's picture is not the code's (a test runs it). One block per layer, top
first: its modules, then the layers below it that it imports (``→``). A layer never names one
above it: ``make lint`` refuses that import.
"""

from __future__ import annotations

import argparse
import configparser
import sys
import textwrap
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- layers:begin -->", "<!-- layers:end -->"
WIDTH = 96


def layer_order() -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return config["importlinter:contract:layers"]["layers"].split()


def picture() -> str:
    layers = layer_order()
    graph = grimp.build_graph("envbisect")

    def layer_of(module: str) -> str | None:
        for layer in layers:
            if module == layer or module.startswith(layer + "."):
                return layer
        return None

    def short(name: str) -> str:
        return name.removeprefix("envbisect.")

    out = ["```"]
    pad = max(len(short(layer)) for layer in layers) + 2
    for i, layer in enumerate(layers):
        own = sorted(m for m in graph.modules if layer_of(m) == layer)
        names = [short(m).removeprefix(short(layer) + ".") for m in own if m != layer]
        if not names:
            names = [f"{short(layer)}.py"]
        below: set[str] = set()
        for module in own:
            for imported in graph.find_modules_directly_imported_by(module):
                target = layer_of(imported)
                if target and target != layer:
                    below.add(target)
        lines = textwrap.wrap(", ".join(names), WIDTH - pad - 2)
        out.append(f"{short(layer):<{pad}}{lines[0]}")
        out += [f"{'':<{pad}}{line}" for line in lines[1:]]
        if below:
            arrow = "→ " + ", ".join(short(t) for t in layers if t in below)
            out.append(f"{'  │' if i < len(layers) - 1 else '':<{pad}}{arrow}")
        elif i < len(layers) - 1:
            out.append("  │")
    out.append("```")
    return "\n".join(out)


def page_with(text: str) -> str:
    page = PAGE.read_text(encoding="utf-8")
    head, _, rest = page.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{text}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/ARCHITECTURE.md")
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = parser.parse_args()
    text = picture()
    if args.write:
        PAGE.write_text(page_with(text), encoding="utf-8")
    elif args.check:
        if page_with(text) != PAGE.read_text(encoding="utf-8"):
            print(f"{PAGE}: the layer picture is stale: python tools/layers_picture.py --write")
            return 1
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
