"""The collector's sections about the machine, the Python and its packages, torch, the GPU,
git, ``files:`` and datasets (stdlib only, Python 3.8+ syntax; shipped with
``envbisect.agent.collector``)."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import sys

from envbisect.agent.channel import keep_bytes
from envbisect.agent.collect_common import (
    Timeout,
    data_dir,
    data_file,
    file_sha256,
    metadata_headers,
    named_distributions,
    normalise,
    parse_direct_url,
    read_text,
    sorted_dict,
)
from envbisect.agent.redact import secret_in_content

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = ("envbisect.agent.collect_common", "envbisect.agent.redact")


def collect_system(c):
    u = os.uname()
    out = {"kernel": u.release, "arch": u.machine, "os": u.sysname}
    release = read_text("/etc/os-release")
    if release:
        m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', release, re.M)
        if m:
            out["os"] = f"{u.sysname} ({m.group(1)})"
    try:
        out["libc"] = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        out["libc"] = None
    cpuinfo = read_text("/proc/cpuinfo", 1 << 16) or ""
    m = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    out["cpu_model"] = m.group(1).strip() if m else None
    out["cpu_count"] = os.cpu_count()
    try:
        out["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        out["cpu_affinity"] = None
    meminfo = read_text("/proc/meminfo", 1 << 14) or ""
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo, re.M)
    out["mem_total_bytes"] = int(m.group(1)) * 1024 if m else None
    return sorted_dict(out)


def compiler_version(c):
    """First line of ``$CXX --version`` (TorchInductor's C++ compiler on CPU), or None."""
    cxx = os.environ.get("CXX") or _which("g++") or _which("c++") or _which("clang++")
    if not cxx:
        return None
    try:
        rc, stdout, _ = c.run([cxx, "--version"], timeout=5)
    except (Timeout, OSError):
        return None
    lines = stdout.decode("utf-8", "replace").splitlines()
    return lines[0].strip() if rc == 0 and lines else None


def collect_python(c):
    return sorted_dict(
        {
            "version": ".".join(str(n) for n in sys.version_info[:3]),
            "implementation": sys.implementation.name,
            "executable": sys.executable,
            "prefix": sys.prefix,
            "base_prefix": getattr(sys, "base_prefix", sys.prefix),
            "build": " ".join(sys.version.split()),
        }
    )


def collect_packages(c):
    """Every distribution on sys.path; the first of a name wins, as for imports."""
    out = {}

    def add(name, version, installer, direct_raw):
        key = normalise(name)
        if key in out:
            return
        direct_url, editable = parse_direct_url(direct_raw) if direct_raw else (None, False)
        out[key] = {
            "version": version,
            "installer": installer,
            "editable": editable,
            "direct_url": direct_url,
        }

    for entry in sys.path:
        entry = entry or os.getcwd()
        if os.path.isfile(entry):  # a zip or egg on sys.path: rare, let importlib read it
            from importlib import metadata

            for dist in metadata.distributions(path=[entry]):
                name, version = metadata_headers(dist.read_text("METADATA") or "")
                if name:
                    add(
                        name,
                        version,
                        dist.read_text("INSTALLER"),
                        dist.read_text("direct_url.json"),
                    )
            continue
        for name, version, _meta, info_dir in named_distributions(entry):
            installer = direct_raw = None
            if info_dir is not None:
                installer = read_text(os.path.join(info_dir, "INSTALLER"), 4096)
                direct_raw = read_text(os.path.join(info_dir, "direct_url.json"))
            add(name, version, (installer or "").strip() or None, direct_raw)
    return sorted_dict(out)


def _literal_assignments(source):
    import ast

    values = {}
    for node in ast.parse(source).body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t for t in node.targets if isinstance(t, ast.Name)]
            value = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target]
            value = node.value
        for t in targets:
            with contextlib.suppress(ValueError, TypeError, SyntaxError):
                values[t.id] = ast.literal_eval(value)
    return values


def _torch_dir():
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "torch")
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return candidate
    return None


def collect_torch(c, packages):
    def first(*names):
        for name in names:
            if name in packages:
                return packages[name]["version"]
        for name in sorted(packages):
            if any(name.startswith(n + "-") for n in names):
                return packages[name]["version"]
        return None

    out = {
        "version": None,
        "git_version": None,
        "cuda": None,
        "hip": None,
        "debug": None,
        "path": None,
        "cudnn": first("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn"),
        "nccl": first("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl"),
        "triton": first("pytorch-triton", "triton", "pytorch-triton-rocm"),
    }
    where = _torch_dir()
    if where is None:
        return sorted_dict(out)
    out["path"] = where
    source = read_text(os.path.join(where, "version.py"))
    if source is None:
        c.error("torch", f"torch found at {where} but torch/version.py is unreadable")
        return sorted_dict(out)
    values = _literal_assignments(source)
    out["version"] = values.get("__version__")
    for key in ("git_version", "cuda", "hip", "debug"):
        out[key] = values.get(key)
    return sorted_dict(out)


def _which(name):
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _libcuda_version():
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(v)) != 0 or not v.value:
        return None
    return f"{v.value // 1000}.{(v.value % 1000) // 10}"


def collect_gpu(c):
    out = {"driver": None, "cuda_driver": None, "devices": [], "source": None}
    smi = _which("nvidia-smi")
    if smi is None:
        out["source"] = "nvidia-smi not on PATH"
        return out
    out["source"] = smi
    timeout = float(c.params.get("gpu_timeout_s") or 10.0)
    query = [
        smi,
        "--query-gpu=index,name,memory.total,driver_version",
        "--format=csv,noheader,nounits",
    ]
    try:
        rc, stdout, stderr = c.run(query, timeout=timeout)
    except Timeout as exc:
        c.error("gpu", str(exc))
        return out
    if rc != 0:
        # A driver/library mismatch or no device: a fact about the machine, not a crash.
        c.error("gpu", f"nvidia-smi exited {rc}: {(stderr.splitlines() or [''])[-1]}")
        return out
    for line in stdout.decode("utf-8", "replace").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            mem = int(float(parts[2]))
        except ValueError:
            mem = None
        out["devices"].append(
            {
                "index": int(parts[0]) if parts[0].isdigit() else parts[0],
                "name": parts[1],
                "memory_mib": mem,
            }
        )
        out["driver"] = parts[3]
    out["cuda_driver"] = _libcuda_version()
    if out["cuda_driver"] is None:
        try:
            rc, stdout, _ = c.run([smi], timeout=timeout)
            m = re.search(rb"CUDA Version:\s*([0-9.]+)", stdout)
            out["cuda_driver"] = m.group(1).decode() if m else None
        except Timeout as exc:
            c.error("gpu", str(exc))
    return out


def collect_git(c):
    env = dict(os.environ)
    env["GIT_OPTIONAL_LOCKS"] = "0"  # never rewrite the user's index while looking
    env["LC_ALL"] = "C"
    out = {}
    for repo in c.params.get("repos") or []:
        key = os.path.abspath(repo)
        try:
            out[key] = _git_repo(c, key, env)
        except Timeout as exc:
            c.error("git", f"{key}: {exc}")
            out[key] = {"error": str(exc)}
        except (OSError, _GitError) as exc:
            c.error("git", f"{key}: {exc}")
            out[key] = {"error": str(exc)}
    return sorted_dict(out)


class _GitError(Exception):
    pass


# The repo's own hooks and fsmonitor command never run from a snapshot (git status starts an
# fsmonitor); the same flags as agent.actuate_common.NO_SIDE_EFFECTS.
GIT_NO_SIDE_EFFECTS = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")


def _git_repo(c, repo, env):
    if not os.path.isdir(repo):
        raise _GitError("no such directory")
    rc, stdout, stderr = c.run(
        [
            "git",
            "-C",
            repo,
            *GIT_NO_SIDE_EFFECTS,
            "status",
            "--porcelain=v2",
            "--branch",
            "-z",
            "--untracked-files=all",
        ],
        env=env,
    )
    if rc != 0:
        raise _GitError("not a git repository" if "not a git" in stderr else stderr[-200:])
    head = branch = None
    dirty = False
    untracked = 0
    for rec in stdout.split(b"\0"):
        if rec.startswith(b"# branch.oid "):
            oid = rec[13:].decode()
            head = None if oid == "(initial)" else oid
        elif rec.startswith(b"# branch.head "):
            name = rec[14:].decode("utf-8", "replace")
            branch = None if name == "(detached)" else name
        elif rec.startswith(b"? "):
            untracked += 1
        elif rec[:2] in (b"1 ", b"2 ", b"u "):
            dirty = True
    diff_sha = None
    if dirty and head is not None:
        rc, diff, stderr = c.run(
            [
                "git",
                "-C",
                repo,
                *GIT_NO_SIDE_EFFECTS,
                "diff",
                "HEAD",
                "--binary",
                "--no-ext-diff",
                "--no-color",
            ],
            env=env,
        )
        if rc != 0:
            raise _GitError("git diff failed: " + stderr[-200:])
        diff_sha = hashlib.sha256(diff).hexdigest()
    return {
        "branch": branch,
        "diff_sha256": diff_sha,
        "dirty": dirty,
        "head": head,
        "untracked": untracked,
    }


def collect_files(c, blobs):
    limit = c.params.get("keep_blobs")
    have = frozenset(c.params.get("have_blobs") or ())  # content the caller already holds
    out = {}
    for pattern in c.params.get("files") or []:
        if glob.has_magic(pattern):
            matches = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
            if not matches:
                c.error("files", f"no file matches {pattern}")
        else:
            matches = [pattern]
        for path in matches:
            key = os.path.abspath(path)
            if key in out:
                continue
            try:
                sha, size = file_sha256(key)
            except FileNotFoundError:
                out[key] = {"sha256": None, "size": None, "blob": None, "exists": False}
                continue
            except OSError as exc:
                c.error("files", f"{key}: {exc.strerror}")
                continue
            blob = None
            withheld = None
            if limit and size <= limit and sha in have:  # the caller's store holds it
                blob = sha
            elif limit and size <= limit:
                with open(key, "rb") as fh:
                    data = fh.read()
                withheld = secret_in_content(data)
                if withheld is None and hashlib.sha256(data).hexdigest() == sha:
                    keep_bytes(blobs, sha, data)  # unchanged while we looked
                    blob = sha
            out[key] = {"sha256": sha, "size": size, "blob": blob}
            if withheld:
                out[key]["withheld"] = f"content not kept: it holds {withheld}"
    return sorted_dict(out)


def collect_data(c):
    out = {}
    for path in c.params.get("data") or []:
        key = os.path.abspath(path)
        try:
            if os.path.isdir(key):
                out[key] = data_dir(key)
            elif os.path.exists(key):
                out[key] = data_file(c, key)
            else:
                out[key] = {"size": None, "records": None, "fingerprint": None, "exists": False}
        except OSError as exc:
            c.error("data", f"{key}: {exc.strerror or exc}")
    return sorted_dict(out)
