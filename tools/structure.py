"""Checks of the source layout that import-linter does not make (``make lint``, tests).

- no module imports another module's ``_private`` name (``from x import _y``, ``x._y``), and
  no code reads or sets another object's private field (``other._y``, ``replace(other, _y=...)``;
  ``self._y`` is its own).
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


def _bindings(tree: ast.Module, me: str, package: str) -> tuple[dict[str, str], set[str], list]:
    """Local names bound to envbisect modules/names, to other modules, and the private
    names imported from another module (with their line numbers)."""
    aliases: dict[str, str] = {}  # local name -> envbisect module or name it is bound to
    external: set[str] = set()  # local names of third-party and stdlib modules
    privates = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            if not base.startswith("envbisect"):
                continue
            for alias in node.names:
                if _private(alias.name) and base != me:
                    privates.append((node.lineno, f"{base}.{alias.name}"))
                aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                if alias.name.startswith("envbisect"):
                    aliases[local] = alias.name
                else:
                    external.add(local)
    return aliases, external, privates


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(path: Path) -> list[str]:
    """``path``'s imports of names private to another module, and its reaches into other
    objects' private fields."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    aliases, external, privates = _bindings(tree, me, package)
    found = [f"{path}:{line}: imports {name}" for line, name in privates]
    lines = path.read_text(encoding="utf-8").splitlines()
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and node.attr not in NAMEDTUPLE_API
        ):
            continue
        base = node.value
        if isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in external):
            continue
        if "# private:" in lines[node.lineno - 1]:
            continue
        if isinstance(base, ast.Name) and base.id in aliases:
            found.append(f"{path}:{node.lineno}: uses {aliases[base.id]}.{node.attr}")
        else:
            found.append(f"{path}:{node.lineno}: reaches into {ast.unparse(node)}")
    return found + private_keywords(tree, path)


def private_keywords(tree: ast.Module, path: Path) -> list[str]:
    """Calls that set a private field by keyword (``replace(other, _x=...)``, ``Cls(_x=...)``)
    of a class this module does not define."""
    own = {
        item.target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }
    return [
        f"{path}:{node.lineno}: sets {keyword.arg}= of another module's class"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and not (isinstance(node.func, ast.Name) and node.func.id == "dict")
        for keyword in node.keywords
        if keyword.arg and _private(keyword.arg) and keyword.arg not in own
    ]


def long_modules(path: Path) -> list[str]:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    if lines > MAX_LINES:
        return [f"{path}: {lines} lines (at most {MAX_LINES})"]
    return []


def shadowing_modules(path: Path) -> list[str]:
    """An agent module named like a stdlib one: the agent's scripts run with their folder as
    sys.path[0] (``python .../agent/drafter.py``), where it would shadow the stdlib's."""
    if path.parent.name != "agent" or path.stem not in sys.stdlib_module_names:
        return []
    return [f"{path}: shadows the stdlib module {path.stem!r} when an agent script runs"]


def main() -> int:
    findings = []
    for path in sorted((SRC / "envbisect").rglob("*.py")):
        findings += private_imports(path) + long_modules(path) + shadowing_modules(path)
    for line in findings:
        print(Path(line).as_posix().replace(str(ROOT) + "/", ""))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
