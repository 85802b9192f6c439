"""The source keeps the shape docs/ARCHITECTURE.md draws (the checks ``make lint`` runs).

Each check is the real tool on the real tree: the layer contracts of ``.importlinter``
(import-linter), tools/structure.py (private reaches, module length) and the page's layer
picture against the one drawn from the code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_layer_contracts_are_kept() -> None:
    done = _run(str(BIN / "lint-imports"), "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout and " kept, 0 broken" in done.stdout


def test_no_private_reaches_and_no_long_module() -> None:
    done = _run(sys.executable, "tools/structure.py")
    assert done.returncode == 0, done.stdout


def test_the_architecture_page_draws_the_layers_of_the_code() -> None:
    done = _run(sys.executable, "tools/layers_picture.py", "--check")
    assert done.returncode == 0, done.stdout
