"""Shared test fixtures. Area-specific fixtures live in tests/helpers_<area>.py."""

from __future__ import annotations

import os
import tempfile

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
    # The per-user key that marks manifests as this user's own (envbisect.trust).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "xdg-config"))
    # Log dirs that envbisect keeps for a failed run (check, smoke, snapshot) go under the
    # session's base temp, not /tmp, so a test run leaves nothing behind.
    keep = tmp_path_factory.getbasetemp() / "t"
    keep.mkdir(exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(keep))
