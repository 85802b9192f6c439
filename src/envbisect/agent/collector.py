"""The snapshot collector agent: runs inside the *target* Python (stdlib only, 3.8+ syntax).

Shipped on stdin by ``Transport.run_agent``; ``main(params)`` returns the manifest sections
plus ``errors`` (one ``{section, error}`` per fact that could not be collected), ``host``,
``elapsed_s`` and, when blobs are kept, ``blobs`` (sha256 -> base64 content).

It stays fast and harmless: torch is never imported (its version is read from
``torch/version.py`` as text), every external command runs with a timeout in its own process
group, cache trees are walked with ``os.scandir`` without reading file contents, datasets are
fingerprinted from a bounded number of bytes, and secrets are redacted here, before anything
leaves the target.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import glob
import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time

# Secrets are redacted by the one implementation the host uses too; the bundle ships it along.
from envbisect.agent.redact import redact_env, redact_text

AGENT_REQUIRES = ("envbisect.agent.redact",)

# -- what is collected from the environment ----------------------------------------------

ENV_PREFIXES = (
    "PYTORCH_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "TORCHDYNAMO_",
    "TRITON_",
    "CUDA_",
    "CUBLAS_",
    "CUDNN_",
    "NCCL_",
    "NVIDIA_",
    "NVSHMEM_",
    "OMP_",
    "MKL_",
    "KMP_",
)
ENV_NAMES = ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PATH")


# -- helpers -------------------------------------------------------------------------------


class _Collector:
    def __init__(self, params):
        self.params = params
        self.errors = []
        self.cmd_timeout = float(params.get("cmd_timeout_s") or 10.0)

    def error(self, section, message):
        self.errors.append({"section": section, "error": redact_text(message)})

    def run(self, argv, timeout=None, cwd=None, env=None):
        """(returncode, stdout bytes, stderr text); the process group dies at the timeout."""
        timeout = self.cmd_timeout if timeout is None else timeout
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            raise _Timeout(f"{argv[0]} timed out after {timeout:g}s") from None
        return proc.returncode, out, err.decode("utf-8", "replace").strip()


class _Timeout(Exception):
    pass


def _read(path, limit=1 << 20):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _sorted(d):
    return dict(sorted(d.items()))


def _normalise(name):
    # PEP 503 by hand: the collector is stdlib-only and cannot import packaging.utils.
    return re.sub(r"[-_.]+", "-", name).lower()


def _file_sha256(path):
    h = hashlib.sha256()
    size = 0
    # Only a regular file is hashed: /dev/zero or a FIFO under files: would never end.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    with os.fdopen(fd, "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            size += len(chunk)
            h.update(chunk)
    return h.hexdigest(), size


# -- sections ------------------------------------------------------------------------------


def collect_system(c):
    u = os.uname()
    out = {"kernel": u.release, "arch": u.machine, "os": u.sysname}
    release = _read("/etc/os-release")
    if release:
        m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', release, re.M)
        if m:
            out["os"] = f"{u.sysname} ({m.group(1)})"
    try:
        out["libc"] = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        out["libc"] = None
    cpuinfo = _read("/proc/cpuinfo", 1 << 16) or ""
    m = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    out["cpu_model"] = m.group(1).strip() if m else None
    out["cpu_count"] = os.cpu_count()
    try:
        out["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        out["cpu_affinity"] = None
    meminfo = _read("/proc/meminfo", 1 << 14) or ""
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo, re.M)
    out["mem_total_bytes"] = int(m.group(1)) * 1024 if m else None
    return _sorted(out)


def _compiler_version(c):
    """First line of ``$CXX --version`` (TorchInductor's C++ compiler on CPU), or None."""
    cxx = os.environ.get("CXX") or _which("g++") or _which("c++") or _which("clang++")
    if not cxx:
        return None
    try:
        rc, stdout, _ = c.run([cxx, "--version"], timeout=5)
    except (_Timeout, OSError):
        return None
    lines = stdout.decode("utf-8", "replace").splitlines()
    return lines[0].strip() if rc == 0 and lines else None


def collect_python(c):
    return _sorted(
        {
            "version": ".".join(str(n) for n in sys.version_info[:3]),
            "implementation": sys.implementation.name,
            "executable": sys.executable,
            "prefix": sys.prefix,
            "base_prefix": getattr(sys, "base_prefix", sys.prefix),
            "build": " ".join(sys.version.split()),
        }
    )


def _metadata_headers(text):
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break
        if line.startswith("Name:") and name is None:
            name = line[5:].strip()
        elif line.startswith("Version:") and version is None:
            version = line[8:].strip()
    return name, version


def _direct_url(raw):
    try:
        info = json.loads(raw)
    except ValueError:
        return None, False
    if not isinstance(info, dict):
        return None, False
    url = redact_text(str(info.get("url", "")))
    editable = bool((info.get("dir_info") or {}).get("editable", False))
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs"):
        url = "{}+{}@{}".format(vcs.get("vcs"), url, vcs.get("commit_id", ""))
    return url or None, editable


def _read_headers(path):
    """The header block of a METADATA/PKG-INFO file (it can be long: stop at the body)."""
    chunks = []
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(8192)
            chunks.append(chunk)
            if not chunk or b"\n\n" in chunk or b"\r\n\r\n" in chunk:
                break
    return b"".join(chunks).decode("utf-8", "replace")


def _path_distributions(entry):
    """(metadata file, dist-info dir or None) of every distribution directly in ``entry``.

    The same places importlib.metadata looks, without its import cost (email, zipfile, csv).
    """
    try:
        names = sorted(e.name for e in os.scandir(entry))
    except OSError:
        return
    for name in names:
        path = os.path.join(entry, name)
        if name.endswith(".dist-info"):
            yield os.path.join(path, "METADATA"), path
        elif name.endswith(".egg-info"):
            if os.path.isdir(path):
                yield os.path.join(path, "PKG-INFO"), path
            else:
                yield path, None


def collect_packages(c):
    """Every distribution on sys.path; the first of a name wins, as for imports."""
    out = {}

    def add(name, version, installer, direct_raw):
        key = _normalise(name)
        if key in out:
            return
        direct_url, editable = _direct_url(direct_raw) if direct_raw else (None, False)
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
                name, version = _metadata_headers(dist.read_text("METADATA") or "")
                if name:
                    add(
                        name,
                        version,
                        dist.read_text("INSTALLER"),
                        dist.read_text("direct_url.json"),
                    )
            continue
        for name, version, _meta, info_dir in _named_distributions(entry):
            installer = direct_raw = None
            if info_dir is not None:
                installer = _read(os.path.join(info_dir, "INSTALLER"), 4096)
                direct_raw = _read(os.path.join(info_dir, "direct_url.json"))
            add(name, version, (installer or "").strip() or None, direct_raw)
    return _sorted(out)


def _named_distributions(entry):
    """(name, version, metadata file, dist-info dir or None) of every distribution in
    ``entry`` whose metadata names it; unreadable metadata is skipped."""
    for meta_file, info_dir in _path_distributions(entry):
        try:
            name, version = _metadata_headers(_read_headers(meta_file))
        except OSError:
            continue
        if name:
            yield name, version, meta_file, info_dir


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
        return _sorted(out)
    out["path"] = where
    source = _read(os.path.join(where, "version.py"))
    if source is None:
        c.error("torch", f"torch found at {where} but torch/version.py is unreadable")
        return _sorted(out)
    values = _literal_assignments(source)
    out["version"] = values.get("__version__")
    for key in ("git_version", "cuda", "hip", "debug"):
        out[key] = values.get(key)
    return _sorted(out)


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
    except _Timeout as exc:
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
        except _Timeout as exc:
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
        except _Timeout as exc:
            c.error("git", f"{key}: {exc}")
            out[key] = {"error": str(exc)}
        except (OSError, _GitError) as exc:
            c.error("git", f"{key}: {exc}")
            out[key] = {"error": str(exc)}
    return _sorted(out)


class _GitError(Exception):
    pass


# The repo's own hooks and fsmonitor command never run from a snapshot (git status starts an
# fsmonitor); the same flags as agent.actuate_remote.NO_SIDE_EFFECTS.
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
                sha, size = _file_sha256(key)
            except FileNotFoundError:
                out[key] = {"sha256": None, "size": None, "blob": None, "exists": False}
                continue
            except OSError as exc:
                c.error("files", f"{key}: {exc.strerror}")
                continue
            blob = None
            if limit and size <= limit:
                with open(key, "rb") as fh:
                    data = fh.read()
                if hashlib.sha256(data).hexdigest() == sha:  # unchanged while we looked
                    blobs[sha] = base64.b64encode(data).decode("ascii")
                    blob = sha
            out[key] = {"sha256": sha, "size": size, "blob": blob}
    return _sorted(out)


_SAMPLE = 1 << 16
_TEXT_SUFFIXES = (".jsonl", ".ndjson", ".txt", ".csv", ".tsv", ".json")


def _data_file(c, path):
    size = os.path.getsize(path)
    h = hashlib.sha256(b"size=%d\n" % size)
    with open(path, "rb") as fh:
        # Head, middle and tail: a bounded read that still moves when data is appended,
        # truncated or edited in place at either end.
        for offset in sorted({0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)}):
            fh.seek(offset)
            h.update(fh.read(_SAMPLE))
    records = None
    count_limit = int(c.params.get("data_count_max_bytes") or (2 << 30))
    if path.lower().endswith(_TEXT_SUFFIXES) and size <= count_limit:
        records = 0
        last = b"\n"
        with open(path, "rb") as fh:
            while True:
                chunk = fh.read(1 << 22)
                if not chunk:
                    break
                records += chunk.count(b"\n")
                last = chunk[-1:]
        if last != b"\n":
            records += 1
    return {"size": size, "records": records, "fingerprint": "sha256:" + h.hexdigest()[:32]}


def _data_dir(path):
    entries = []
    total = 0
    for rel, size, _mtime in _walk(path):
        entries.append(f"{rel}\0{size}")
        total += size
    entries.sort()
    h = hashlib.sha256("\n".join(entries).encode("utf-8", "surrogateescape"))
    return {
        "size": total,
        "records": None,
        "files": len(entries),
        "fingerprint": "sha256:" + h.hexdigest()[:32],
    }


def collect_data(c):
    out = {}
    for path in c.params.get("data") or []:
        key = os.path.abspath(path)
        try:
            if os.path.isdir(key):
                out[key] = _data_dir(key)
            elif os.path.exists(key):
                out[key] = _data_file(c, key)
            else:
                out[key] = {"size": None, "records": None, "fingerprint": None, "exists": False}
        except OSError as exc:
            c.error("data", f"{key}: {exc.strerror or exc}")
    return _sorted(out)


def _walk(root):
    """Yield (relpath, size, mtime_ns) of every file below ``root`` (no symlink follow)."""
    stack = [("", root)]
    while stack:
        rel, path = stack.pop()
        try:
            it = os.scandir(path)
        except OSError:
            continue
        with it:
            for entry in it:
                name = rel + entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((name + "/", entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        yield name, st.st_size, st.st_mtime_ns
                except OSError:
                    continue


def _user():
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if os.environ.get(name):
            return os.environ[name]
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return "unknown"


def default_caches():
    """Where TorchInductor and Triton look for their caches, and why."""
    caches = {}
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        caches["inductor"] = (os.environ["TORCHINDUCTOR_CACHE_DIR"], "env TORCHINDUCTOR_CACHE_DIR")
    else:
        # torch sanitises the user name the same way (torch._inductor.runtime.cache_dir_utils).
        user = re.sub(r'[\\/:*?"<>|]', "_", _user())
        caches["inductor"] = (
            os.path.join(tempfile.gettempdir(), "torchinductor_" + user),
            "default <tempdir>/torchinductor_<user>",
        )
    if os.environ.get("TRITON_CACHE_DIR"):
        caches["triton"] = (os.environ["TRITON_CACHE_DIR"], "env TRITON_CACHE_DIR")
    else:
        home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
        caches["triton"] = (os.path.join(home, ".triton", "cache"), "default ~/.triton/cache")
    return caches


def cache_facts(path, max_subdirs=256):
    if not os.path.isdir(path):
        return {
            "exists": os.path.exists(path),
            "files": 0,
            "bytes": 0,
            "digest": None,
            "subdirs": {},
        }
    lines = []
    total = 0
    subdirs = {}
    for rel, size, mtime in _walk(path):
        lines.append(f"{rel}\0{size}\0{mtime}")
        total += size
        top = rel.split("/", 1)[0] if "/" in rel else "."
        s = subdirs.get(top)
        if s is None:
            s = subdirs[top] = {"files": 0, "bytes": 0}
        s["files"] += 1
        s["bytes"] += size
    lines.sort()
    digest = hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()
    names = sorted(subdirs)
    if len(names) > max_subdirs:
        kept = {n: subdirs[n] for n in names[:max_subdirs]}
        kept["..."] = {
            "files": sum(subdirs[n]["files"] for n in names[max_subdirs:]),
            "bytes": sum(subdirs[n]["bytes"] for n in names[max_subdirs:]),
        }
        subdirs = kept
    return {
        "exists": True,
        "files": len(lines),
        "bytes": total,
        "digest": "sha256:" + digest[:32],
        "subdirs": _sorted(subdirs),
    }


def collect_caches(c):
    caches = default_caches()
    for name, path in sorted((c.params.get("caches") or {}).items()):
        caches[name] = (path, "config")
    out = {}
    for name, (path, source) in sorted(caches.items()):
        facts = {"path": os.path.abspath(os.path.expanduser(path)), "source": source}
        try:
            facts.update(cache_facts(facts["path"]))
        except OSError as exc:
            c.error("caches", f"{name}: {exc}")
        out[name] = _sorted(facts)
    return out


def collect_env(c):
    wanted = set(ENV_NAMES) | set(c.params.get("env") or [])
    out = {}
    for name, value in os.environ.items():
        if name in wanted or name.startswith(ENV_PREFIXES):
            out[name] = redact_env(name, value)
    return _sorted(out)


def _code_fingerprint(code):
    h = hashlib.sha256()
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    h.update(repr(code.co_freevars).encode())
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            h.update(_code_fingerprint(const).encode())
        else:
            h.update(repr(const).encode("utf-8", "replace"))
    return h.hexdigest()


def _find_code(module_code, qualname):
    code = module_code
    for part in qualname.split("."):
        if part == "<locals>":
            continue
        nxt = None
        for const in code.co_consts:
            if hasattr(const, "co_code") and const.co_name == part:
                nxt = const
                break
        if nxt is None:
            return None
        code = nxt
    return code


def probe(dotted):
    """original / patched / missing for one dotted name, comparing live and on-disk code."""
    module, rest = _import_longest_prefix(dotted)
    result = {"status": "missing", "module_file": None, "code_sha256": None}
    if module is None:
        result["reason"] = f"no importable module in {dotted}"
        return result
    obj = module
    for attr in rest:
        if not hasattr(obj, attr):
            result["reason"] = "{} has no attribute {}".format(getattr(obj, "__name__", obj), attr)
            return result
        obj = getattr(obj, attr)
    func = getattr(obj, "__func__", obj)
    code = getattr(func, "__code__", None)
    module_file = getattr(module, "__file__", None)
    result["module_file"] = module_file
    if code is None:
        result["status"] = "original"
        result["reason"] = f"not a Python function ({type(obj).__name__})"
        return result
    result["code_sha256"] = _code_fingerprint(code)
    home_name = getattr(func, "__module__", None) or ""
    qualname = getattr(func, "__qualname__", code.co_name)
    if home_name != module.__name__ and home_name.split(".")[0] != module.__name__.split(".")[0]:
        # Defined outside the probed package (a sitecustomize, a training script): a patch.
        result.update(
            status="patched", live_file=code.co_filename, reason=f"defined in module {home_name!r}"
        )
    elif rest and qualname.split(".")[-1] != rest[-1]:
        result.update(
            status="patched",
            live_file=code.co_filename,
            reason=f"{dotted} is bound to {home_name}.{qualname}",
        )
    else:
        # Re-exports (torch.fx.symbolic_trace) are compared against their defining module.
        home = getattr(sys.modules.get(home_name), "__file__", None)
        result.update(
            _compare_with_disk(code, result["code_sha256"], qualname, home or module_file)
        )
    return _sorted(result)


def _import_longest_prefix(dotted):
    """(the module of the longest importable prefix of ``dotted``, the attribute names
    after it); (None, None) when no prefix imports."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            return importlib.import_module(".".join(parts[:i])), parts[i:]
        except ImportError:
            continue
    return None, None


def _compare_with_disk(code, fingerprint, qualname, source_file):
    """status (and live_file or reason) of live ``code`` (its ``_code_fingerprint``) against
    ``qualname`` compiled from ``source_file`` as it is on disk."""
    if source_file and source_file.endswith((".pyc", ".pyo")):
        source_file = source_file[:-1]
    source = _read(source_file, 1 << 26) if source_file else None
    if source is None:
        return {
            "status": "patched" if code.co_filename != source_file else "original",
            "reason": "no source on disk to compare",
        }
    disk = compile(source, source_file, "exec", dont_inherit=True)
    disk_code = _find_code(disk, qualname)
    same = (
        disk_code is not None
        and os.path.abspath(code.co_filename) == os.path.abspath(source_file)
        and _code_fingerprint(disk_code) == fingerprint
    )
    if same:
        return {"status": "original"}
    return {"status": "patched", "live_file": code.co_filename}


def collect_probes(c):
    out = {}
    for dotted in c.params.get("probes") or []:
        try:
            out[dotted] = probe(dotted)
        except Exception as exc:  # an import can fail in any way; the fact is "missing"
            out[dotted] = {
                "status": "missing",
                "module_file": None,
                "code_sha256": None,
                "reason": f"{type(exc).__name__}: {exc}",
            }
            c.error("probes", f"{dotted}: {type(exc).__name__}: {exc}")
    return _sorted(out)


# -- entry point ---------------------------------------------------------------------------


def main(params):
    start = time.monotonic()
    c = _Collector(params)
    blobs = {}
    # "only": the sections a state check needs (run verifies every realized state this
    # way, so it must not wait on nvidia-smi or a compiler); default: all of them.
    only = set(params.get("only") or ()) or None
    sections = _collect_sections(c, only, blobs)
    if params.get("probes") and _wanted(only, "probes"):
        _guarded(c, sections, "probes", collect_probes)
    return {
        "sections": sections,
        "errors": sorted(c.errors, key=lambda e: (e["section"], e["error"])),
        "blobs": blobs,
        "host": os.uname().nodename,
        "elapsed_s": round(time.monotonic() - start, 4),
    }


def _wanted(only, name):
    return only is None or name in only


def _guarded(c, sections, name, fn, *args):
    """``sections[name] = fn(c, *args)``; a failure is an error of that section, which is
    then empty."""
    try:
        sections[name] = fn(c, *args)
    except Exception as exc:  # one broken fact family must not lose the others
        sections[name] = {}
        c.error(name, f"{type(exc).__name__}: {exc}")


def _collect_sections(c, only, blobs):
    """Every wanted section but probes; file contents kept go into ``blobs``."""
    import threading

    sections = {}
    # Sections that wait on external commands (nvidia-smi can take seconds) run beside the
    # in-process ones; each command still has its own timeout.
    background = [
        threading.Thread(target=_guarded, args=(c, sections, name, fn), daemon=True)
        for name, fn in (
            ("gpu", collect_gpu),
            ("git", collect_git),
            ("compiler", _compiler_version),
        )
        if _wanted(only, "system" if name == "compiler" else name)
    ]
    for thread in background:
        thread.start()
    for name, fn, args in (
        ("system", collect_system, ()),
        ("python", collect_python, ()),
        ("packages", collect_packages, ()),
        ("torch", collect_torch, None),
        ("files", collect_files, (blobs,)),
        ("data", collect_data, ()),
        ("caches", collect_caches, ()),
        ("env", collect_env, ()),
    ):
        if _wanted(only, name):
            args = args if args is not None else (sections.get("packages") or {},)
            _guarded(c, sections, name, fn, *args)
    for thread in background:
        thread.join()
    if "system" in sections:
        compiler = sections.pop("compiler", None)
        sections["system"]["compiler"] = compiler if isinstance(compiler, str) else None
        sections["system"] = _sorted(sections["system"])
    return sections
