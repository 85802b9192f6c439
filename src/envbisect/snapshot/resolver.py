"""The resolver of a reconstruction: which package versions uv would have chosen at a time
(``uv pip compile --exclude-newer``), the low-confidence guess for a package with no other
evidence."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from envbisect.model.config import Config
from envbisect.model.errors import ReconstructError
from envbisect.model.sources import Sources, uv_args
from envbisect.snapshot.when import iso

# (input file name, its text, constraints lines, time) -> {name: version}; raises
# ReconstructError with uv's last line when it cannot resolve.
Resolver = Callable[[str, str, list[str], datetime], dict[str, str]]


def uv_compile(
    uv: str, name: str, text: str, args: Sequence[str], constraints: Sequence[str] = ()
) -> dict[str, str]:
    """``uv pip compile`` of ``text`` (a requirements file named ``name``) with uv's
    ``args`` and ``constraints`` lines, in a temporary dir: the pinned versions. Raises
    ReconstructError with uv's last line when it cannot resolve."""
    with tempfile.TemporaryDirectory(prefix="envbisect-compile-") as tmp:
        src = Path(tmp) / name
        src.write_text(text, encoding="utf-8")
        argv = [uv, "pip", "compile", "-q", "--no-header", "--no-annotate", *args]
        if constraints:
            cons = Path(tmp) / "constraints.txt"
            cons.write_text("".join(f"{c}\n" for c in constraints), encoding="utf-8")
            argv += ["-c", str(cons)]
        argv.append(str(src))
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=300, cwd=tmp, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ReconstructError(f"uv pip compile: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        raise ReconstructError(f"uv pip compile: {last.strip()}")
    return compiled_pins(proc.stdout)


def uv_resolver(config: Config) -> Resolver:
    """``uv pip compile --exclude-newer`` against the configured package sources."""

    def resolve(name: str, text: str, constraints: list[str], when: datetime) -> dict[str, str]:
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
        args = ["--exclude-newer", iso(when), *_source_args(config)]
        return uv_compile(uv, name, text, args, [*constraints, *_pin_constraints(config)])

    return resolve


def _source_args(config: Config) -> list[str]:
    """The config's sources as uv options, without find-links: they carry no upload time,
    so --exclude-newer cannot judge them (a find-links wheel would win whatever its age).
    They are evidence (kept wheels), not a source here."""
    return uv_args(dataclasses.replace(Sources.from_config(config), find_links=()))


def _pin_constraints(config: Config) -> list[str]:
    """The config's version pins as constraint lines (``einops==0.7.0``)."""
    pins = getattr(config, "pins", None) or {}
    return [f"{name}{pin.specifier}" for name, pin in sorted(pins.items()) if pin.specifier]


def compiled_pins(text: str) -> dict[str, str]:
    """``uv pip compile`` output → normalised name → pinned version."""
    from packaging.utils import canonicalize_name

    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name.split("[", 1)[0].strip())] = version.split(";")[0].strip()
    return out
