"""Real parts for the snapshot tests: git repos, wheels, uv venvs, cache trees, stand-ins."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


def make_repo(path: Path, commits: int = 2) -> Path:
    """A real git repo on branch ``main`` with ``commits`` commits of ``train.py``."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for i in range(commits):
        (path / "train.py").write_text(f"STEPS = {i}\n")
        git(path, "add", "train.py")
        git(path, "commit", "-q", "-m", f"commit {i}")
    return path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(out_dir: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A real, installable wheel (PEP 427) holding ``files`` (path -> text)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    contents = {path: text.encode() for path, text in files.items()}
    contents[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: test stand-in\n\n"
    ).encode()
    contents[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: envbisect-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    record = [_record_line(p, d) for p, d in contents.items()] + [f"{info}/RECORD,,"]
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in contents.items():
            zf.writestr(path, data)
    return wheel


FAKE_TORCH_VERSION_PY = """\
from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'xpu']
__version__ = '2.9.1+cu128'
debug = False
cuda: Optional[str] = '12.8'
git_version = 'd38164a545b4a4e4e0cf73ce67173f70574890b6'
hip: Optional[str] = None
xpu: Optional[str] = None
"""

# Importing it would be a bug: the collector must read version.py as text.
FAKE_TORCH_INIT = "raise ImportError('the envbisect collector must not import torch')\n"


def uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if not found:
        raise RuntimeError("uv is not installed")
    return found


def make_fake_torch_venv(root: Path) -> Path:
    """A real uv venv holding a fake CUDA torch, cudnn, triton; returns its python."""
    wheels = root / "wheels"
    build_wheel(
        wheels,
        "torch",
        "2.9.1+cu128",
        {"torch/__init__.py": FAKE_TORCH_INIT, "torch/version.py": FAKE_TORCH_VERSION_PY},
    )
    build_wheel(wheels, "nvidia-cudnn-cu12", "9.10.2.21", {"nvidia_cudnn_stub.py": ""})
    build_wheel(wheels, "pytorch-triton", "3.5.1", {"triton_stub.py": ""})
    build_wheel(wheels, "Private_Pkg", "1.0", {"private_pkg.py": ""})
    venv = root / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([uv(), "venv", "-q", "--python", base, str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [uv(), "pip", "install", "-q", "--offline", "--no-deps", "--python", str(python)]
        + sorted(str(w) for w in wheels.glob("*.whl")),
        check=True,
    )
    return python


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def make_cache_tree(root: Path, files: int, subdirs: tuple[str, ...] = ("fxgraph", "triton")):
    """A compile-cache-like tree: ``files`` small files spread over hashed subdirectories."""
    for i in range(files):
        top = subdirs[i % len(subdirs)]
        d = root / top / f"{i % 97:02x}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"entry{i}.bin").write_bytes(b"x" * (i % 13))
    return root


def write_stand_in(bin_dir: Path, name: str, script: str) -> Path:
    """An executable shell script ``name`` on a private PATH directory."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


NOISY_SITECUSTOMIZE = """\
import os, sys
# A library that talks a lot: megabytes through print and through the raw fd 1.
print("noise " * 200000)
os.write(1, b"<<ENVBISECT deadbeef BEGIN>>\\nbm90IGEgcmVzdWx0\\n<<ENVBISECT deadbeef END>>\\n")
os.write(1, b"C-level noise\\n" * 100000)
sys.stdout.flush()
"""
