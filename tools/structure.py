"""Checks of the source layout that import-linter does not make (``make lint``, tests).

- no module imports another module's ``_private`` name (``from x import _y``, ``x._y``), and
  no code reads or sets another object's private field (``other._y``; ``self._y`` is its own).
  Namedtuple methods (``_replace``) and a third-party module's privates (``torch._dynamo``, which
  the agent must reach) are not envbisect's; a line that has to reach one says so with
  ``# private: <why>``;
- no module is longer than ``MAX_LINES`` lines.

The layer order itself is written once, in ``.importlinter``. Exit 1 with one line a finding.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_LINES = 600
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}
ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def private_imports(path: Path) -> list[str]:
    """``path``'s imports of names that are private to another module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    aliases: dict[str, str] = {}  # local name -> envbisect module it is bound to
    external: set[str] = set()  # local names of third-party and stdlib modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            if not base.startswith("envbisect"):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    if base != me:
                        found.append(f"{path}:{node.lineno}: imports {base}.{alias.name}")
                else:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("envbisect"):
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name
                else:
                    external.add(alias.asname or alias.name.split(".")[0])
    lines = path.read_text(encoding="utf-8").splitlines()
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in NAMEDTUPLE_API
        ):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            continue
        if isinstance(base, ast.Name) and base.id in external:
            continue
        if "# private:" in lines[node.lineno - 1]:
            continue
        if isinstance(base, ast.Name) and base.id in aliases:
            found.append(f"{path}:{node.lineno}: uses {aliases[base.id]}.{node.attr}")
        else:
            found.append(f"{path}:{node.lineno}: reaches into {ast.unparse(node)}")
    return found


def long_modules(path: Path) -> list[str]:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    if lines > MAX_LINES:
        return [f"{path}: {lines} lines (at most {MAX_LINES})"]
    return []


def main() -> int:
    findings = []
    for path in sorted((SRC / "envbisect").rglob("*.py")):
        findings += private_imports(path) + long_modules(path)
    for line in findings:
        print(Path(line).as_posix().replace(str(ROOT) + "/", ""))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
