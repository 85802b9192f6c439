"""Shared test fixtures. Area-specific fixtures live in tests/helpers_<area>.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Env prefixes the collector and the smoke test read: a developer's own settings must not
# leak into what tests observe.
_ISOLATED_PREFIXES = (
    "PYTORCH_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "TORCHDYNAMO_",
    "TRITON_",
    "CUDA_",
    "NCCL_",
    "OMP_",
    "MKL_",
    "KMP_",
    "ENVBISECT",
)


@pytest.fixture(autouse=True)
def _isolate_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    for name in list(os.environ):
        if name.startswith(_ISOLATED_PREFIXES):
            monkeypatch.delenv(name, raising=False)
    # The manifest parse cache goes to a per-session dir, never the developer's ~/.cache.
    monkeypatch.setenv("ENVBISECT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    # Swapped files are locked machine-wide; tests keep their locks out of /tmp's shared dir.
    monkeypatch.setenv("ENVBISECT_LOCK_DIR", str(tmp_path_factory.getbasetemp() / "locks"))
    # The per-user key that marks manifests as this user's own (envbisect.model.trust).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "xdg-config"))


@pytest.fixture(autouse=True, scope="session")
def _own_manifest_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The per-user manifest key for the whole session, set before any module or session
    fixture snapshots: a manifest a fixture made is this user's own in every test."""
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.getbasetemp() / "xdg-config")
    yield
    if old is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = old


@pytest.fixture(autouse=True, scope="session")
def _no_log_dirs_left() -> Iterator[None]:
    """envbisect keeps the log dir of a failed check, smoke or snapshot in the system temp
    dir, as users need (the message points at it); the tests' failures are on purpose, so
    the dirs they made are removed when the session ends. (The temp dir itself is not
    redirected: the collector's default inductor cache path is read from it.)"""
    root = Path(tempfile.gettempdir())
    kinds = ("check", "smoke", "snapshot", "probe")
    before = {p for k in kinds for p in root.glob(f"envbisect-{k}-*")}
    yield
    for path in {p for k in kinds for p in root.glob(f"envbisect-{k}-*")} - before:
        shutil.rmtree(path, ignore_errors=True)
