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

import hashlib
import os
import re
import sys
import tempfile
import time

from envbisect.agent.cache_keep import keep, put_into_dir, put_into_map
from envbisect.agent.channel import blob_store
from envbisect.agent.collect_common import Collector, read_text, sorted_dict, walk
from envbisect.agent.collect_sections import (
    collect_data,
    collect_files,
    collect_git,
    collect_gpu,
    collect_packages,
    collect_python,
    collect_system,
    collect_torch,
    compiler_version,
)

# Secrets are redacted by the one implementation the host uses too; the bundle ships it along.
from envbisect.agent.redact import redact_env, secret_in_content

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = (
    "envbisect.agent.cache_keep",
    "envbisect.agent.collect_common",
    "envbisect.agent.collect_sections",
    "envbisect.agent.redact",
)

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
    for rel, size, mtime in walk(path):
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
        "subdirs": sorted_dict(subdirs),
    }


def collect_caches(c, blobs):
    """Each compile cache's facts; with ``keep_caches`` (a byte cap) also its content, kept
    as blobs (``agent.cache_keep``): written straight into ``cache_blob_dir`` when the host
    shares this machine's disk, else sent back in ``blobs``."""
    caches = default_caches()
    for name, path in sorted((c.params.get("caches") or {}).items()):
        caches[name] = (path, "config")
    cap = c.params.get("keep_caches")
    blob_dir = c.params.get("cache_blob_dir")
    have = frozenset(c.params.get("have_blobs") or ())
    put = put_into_dir(blob_dir) if blob_dir else put_into_map(blobs, have)
    out = {}
    for name, (path, source) in sorted(caches.items()):
        facts = {"path": os.path.abspath(os.path.expanduser(path)), "source": source}
        try:
            facts.update(cache_facts(facts["path"]))
            if cap and facts.get("files"):
                kept = keep(facts["path"], cap, put, _secret_file)
                if isinstance(kept, str):
                    c.error("caches", f"{name}: {kept}")
                else:
                    facts["kept"] = kept
        except OSError as exc:
            c.error("caches", f"{name}: {exc}")
        out[name] = sorted_dict(facts)
    return out


_SCANNED_BYTES = 256 * 1024


def _secret_file(path, st):
    """Why a cache file must not be kept as a blob (it holds a key or a token), or None.
    Small text files only: compiled code is neither, and is read once more for its hash."""
    if st.st_size > _SCANNED_BYTES:
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.read(_SCANNED_BYTES)
    except OSError:
        return None
    if b"\0" in head[:8192]:
        return None
    why = secret_in_content(head)
    return f"content not kept: it holds {why}" if why else None


def collect_env(c):
    wanted = set(ENV_NAMES) | set(c.params.get("env") or [])
    out = {}
    for name, value in os.environ.items():
        if name in wanted or name.startswith(ENV_PREFIXES):
            out[name] = redact_env(name, value)
    return sorted_dict(out)


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
    return sorted_dict(result)


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
    source = read_text(source_file, 1 << 26) if source_file else None
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
    return sorted_dict(out)


# -- entry point ---------------------------------------------------------------------------


def main(params):
    start = time.monotonic()
    c = Collector(params)
    # Kept content is streamed back as it is found (agent.channel.BlobStream).
    blobs = blob_store(params.get("have_blobs") or ())
    # "only": the sections a state check needs (run verifies every realized state this
    # way, so it must not wait on nvidia-smi or a compiler); default: all of them.
    only = set(params.get("only") or ()) or None
    sections = _collect_sections(c, only, blobs)
    if params.get("probes") and _wanted(only, "probes"):
        _guarded(c, sections, "probes", collect_probes)
    return {
        "sections": sections,
        "errors": sorted(c.errors, key=lambda e: (e["section"], e["error"])),
        "blobs": blobs if isinstance(blobs, dict) else {},
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
            ("compiler", compiler_version),
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
        ("caches", collect_caches, (blobs,)),
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
        sections["system"] = sorted_dict(sections["system"])
    return sections
