"""Whose manifest is this, and what in it can run code or reach out.

A manifest this user made on this machine carries ``meta.signature``: an HMAC-SHA256 of its
canonical content under a per-user key kept 0600 in ``$XDG_CONFIG_HOME/envbisect/`` (default
``~/.config/envbisect/``), made on first use. Any other manifest is *foreign*: before the first
trial ``run`` lists every entry of it that can execute code or reach the network when a
trial realizes it — every env var not on :data:`ENV_ALLOWED` (variables known to load no
code), packages from sources other than the configured indexes (decided on the URL's
normalized, decoded place), ``.pth``/``sitecustomize`` files, repos with hooks or an
fsmonitor, kept compile-cache trees — and refuses unless ``--trust`` names the manifest (like git's
``safe.directory``). ``diff`` marks the same entries and always shows package sources.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from envbisect.model.errors import TrustError
from envbisect.model.escape import printable
from envbisect.model.manifest import Manifest, parse_yaml

KEY_NAME = "manifest.key"
SIGNATURE_PREFIX = "hmac-sha256:"

# Env vars whose value makes a process load or run something else, or reach elsewhere.
CODE_ENV = frozenset(
    {
        "BROWSER",
        "BASH_ENV",
        "ENV",
        "PERL5OPT",
        "PERL5LIB",
        "PERLLIB",
        "NODE_OPTIONS",
        "NODE_PATH",
        "RUBYOPT",
        "RUBYLIB",
        "PATH",
        "PROMPT_COMMAND",
        "EDITOR",
        "VISUAL",
        "PAGER",
        "SHELL",
        "SSH_ASKPASS",
        "SUDO_ASKPASS",
        "TERMINAL",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "CUDA_INJECTION64_PATH",
        "REQUESTS_CA_BUNDLE",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "CURL_CA_BUNDLE",
        "HF_ENDPOINT",
    }
)
CODE_ENV_PREFIXES = ("LD_", "DYLD_", "GIT_", "PIP_", "UV_", "CONDA_", "PYTHON")
# The only env vars a foreign manifest may set without review: each takes a number, a
# switch or a list of options, and none names a program, a library, a module, a plugin, a
# cache of compiled code or a place to fetch from (README's security section lists them).
_COUNT = "a thread or process count"
_SWITCH = "an on/off switch"
ENV_ALLOWED: Mapping[str, str] = {
    "OMP_NUM_THREADS": _COUNT,
    "MKL_NUM_THREADS": _COUNT,
    "OPENBLAS_NUM_THREADS": _COUNT,
    "NUMEXPR_NUM_THREADS": _COUNT,
    "TORCHINDUCTOR_COMPILE_THREADS": _COUNT,
    "WORLD_SIZE": _COUNT,
    "LOCAL_WORLD_SIZE": _COUNT,
    "RANK": "a process's rank",
    "LOCAL_RANK": "a process's rank",
    "CUDA_VISIBLE_DEVICES": "which GPUs a process sees",
    "CUDA_LAUNCH_BLOCKING": _SWITCH,
    "CUDA_DEVICE_MAX_CONNECTIONS": "a queue count",
    "CUDA_MODULE_LOADING": "LAZY or EAGER",
    "PYTORCH_CUDA_ALLOC_CONF": "the caching allocator's options (sizes and switches)",
    "PYTORCH_NO_CUDA_MEMORY_CACHING": _SWITCH,
    "CUBLAS_WORKSPACE_CONFIG": "cuBLAS workspace sizes",
    "NCCL_DEBUG": "a log level (printed to stderr)",
    "NCCL_P2P_DISABLE": _SWITCH,
    "NCCL_IB_DISABLE": _SWITCH,
    "TOKENIZERS_PARALLELISM": _SWITCH,
    "HF_HUB_OFFLINE": "a switch that only stops network use",
    "HF_DATASETS_OFFLINE": "a switch that only stops network use",
    "TRANSFORMERS_OFFLINE": "a switch that only stops network use",
    "PYTHONHASHSEED": "a number",
    "PYTHONUNBUFFERED": _SWITCH,
    "PYTHONDONTWRITEBYTECODE": _SWITCH,
    "PYTHONFAULTHANDLER": _SWITCH,
    "PYTHONUTF8": _SWITCH,
    "PYTHONIOENCODING": "an encoding name",
    "PYTHONOPTIMIZE": "a level",
    "PYTHONNOUSERSITE": "a switch that only turns code loading off",
    "PYTHONDEVMODE": _SWITCH,
    "PYTHONINTMAXSTRDIGITS": "a number",
    "LANG": "a locale name (data files only)",
    "LC_ALL": "a locale name (data files only)",
}
_PROXY = re.compile(r"(?i)^(all|http|https|ftp|no)_proxy$")
_CODE_FILES = re.compile(r"(\.pth|(^|/)(site|user)customize\.py|\.so|\.pyd)$")


# ---- the per-user key ------------------------------------------------------------------------


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/envbisect`` (default ``~/.config/envbisect``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "envbisect"


def key_path() -> Path:
    return config_dir() / KEY_NAME


def _read_key(path: Path) -> bytes | None:
    """The key's bytes; None when absent. TrustError when it is not this user's private
    regular file (a symlink is not followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TrustError(f"{path}: cannot read the manifest key: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TrustError(f"{path}: the manifest key is not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise TrustError(
                f"{path}: the manifest key must be yours and private (chmod 600 {path})"
            )
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(data) < 32:
        raise TrustError(f"{path}: the manifest key is too short; remove it to make a new one")
    return data


def _key(create: bool) -> bytes | None:
    path = key_path()
    key = _read_key(path)
    if key is not None or not create:
        return key
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_key(path)  # another process made it first
    except OSError as exc:
        raise TrustError(f"{path}: cannot create the manifest key: {exc.strerror}") from None
    try:
        os.write(fd, secrets.token_hex(32).encode("ascii") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    return _read_key(path)


# ---- signing ------------------------------------------------------------------------------


def _canonical(data: Mapping[str, Any]) -> bytes:
    body = dict(data)
    meta = dict(body.get("meta") or {})
    meta.pop("signature", None)
    body["meta"] = meta
    return json.dumps(body, sort_keys=True, ensure_ascii=True, default=str).encode("ascii")


def _mac(key: bytes, data: Mapping[str, Any]) -> str:
    return SIGNATURE_PREFIX + hmac.new(key, _canonical(data), hashlib.sha256).hexdigest()


def sign(manifest: Manifest) -> Manifest:
    """``manifest`` with ``meta.signature`` set: made by this user on this machine."""
    unsigned = dict(manifest.sections)
    meta = {k: v for k, v in manifest.section("meta").items() if k != "signature"}
    unsigned["meta"] = meta
    plain = Manifest(sections=unsigned, path=manifest.path)
    # Signed as it will read back (the YAML round trip), so verification sees the same data.
    data = parse_yaml(plain.to_yaml())
    meta = dict(sorted({**meta, "signature": _mac(_key(create=True) or b"", data)}.items()))
    return Manifest(sections={**unsigned, "meta": meta}, path=manifest.path)


def is_own(manifest: Manifest) -> bool:
    """True when ``manifest`` was signed with this user's key and not changed since."""
    sig = manifest.section("meta").get("signature")
    if not isinstance(sig, str) or not sig.startswith(SIGNATURE_PREFIX):
        return False
    key = _key(create=False)
    if key is None:
        return False
    return hmac.compare_digest(sig, _mac(key, manifest.as_dict()))


# ---- what can run code ------------------------------------------------------------------------


@dataclass(frozen=True)
class Risk:
    """One entry of a manifest that can run code or reach out when a trial realizes it."""

    section: str
    key: str
    why: str
    manifest: str  # the manifest the value comes from

    def text(self) -> str:
        return printable(f"{self.section} {self.key}: {self.why}")


def env_risk(name: str) -> str | None:
    """Why env var ``name`` from a foreign manifest needs review (None: it is on
    :data:`ENV_ALLOWED`). Known code loaders are named as such; every other name is
    reviewed too, since a list of dangerous names always misses the next one."""
    if name in ENV_ALLOWED:
        return None
    if name in CODE_ENV:
        return "an env var that loads code or redirects a tool"
    if name.startswith("PYTHON"):
        return "a Python env var that imports, runs or warns"
    if name.startswith(CODE_ENV_PREFIXES):
        return "an env var that loads code or changes where tools fetch from"
    if _PROXY.match(name):
        return "a proxy: where network traffic goes"
    return "not on the list of env vars known to load no code (README: Security)"


def package_source(value: Any) -> str | None:
    """The direct URL a ``packages:`` entry installs from (None: a version from the
    configured indexes)."""
    if isinstance(value, Mapping):
        direct = value.get("direct_url")
        if isinstance(direct, Mapping):
            url = direct.get("url")
            vcs = direct.get("vcs_info")
            if isinstance(vcs, Mapping) and vcs.get("vcs"):
                return f"{vcs.get('vcs')}+{url}"
            return str(url) if url else None
        if isinstance(direct, str) and direct:
            return direct
    return None


def _url_place(url: str) -> tuple[str, str, str] | None:
    """``(scheme, host, path)`` of ``url`` (a bare path: a ``file`` URL) with the path
    percent-decoded until it no longer changes and, for a local file, its symlinks resolved;
    None when the decoded path holds a ``.``/``..`` step, a NUL or a backslash (no place
    can be trusted for it)."""
    parts = urlsplit(url if "://" in url else Path(os.path.abspath(url)).as_uri())
    path = parts.path
    for _ in range(4):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    else:
        return None
    steps = path.split("/")
    if any(s in (".", "..") for s in steps) or "\0" in path or "\\" in path:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme == "file" and host in ("", "localhost"):
        path, host = os.path.realpath(path), ""
    return scheme, f"{host}:{parts.port or ''}", path.rstrip("/") or "/"


def _from_index(url: str, indexes: Sequence[str]) -> bool:
    """True when ``url`` lies at or under one of ``indexes``, decided on normalized,
    decoded places (never on string prefixes: ``<index>/../x`` is not under the index)."""
    place = _url_place(url)
    if place is None:
        return False
    for ix in indexes:
        root = _url_place(ix) if ix else None
        if root is None or root[:2] != place[:2]:
            continue
        if place[2] == root[2] or place[2].startswith(root[2].rstrip("/") + "/"):
            return True
    return False


def repo_runs_code(repo: str) -> str | None:
    """Why git in ``repo`` can run something of the repo's own (hooks, fsmonitor)."""
    git_dir = Path(repo) / ".git"
    if git_dir.is_file():  # a worktree or submodule: follow the gitdir line
        text = git_dir.read_text(encoding="utf-8", errors="replace").strip()
        if text.startswith("gitdir:"):
            git_dir = (Path(repo) / text.split(":", 1)[1].strip()).resolve()
    found = []
    hooks = git_dir / "hooks"
    try:
        names = sorted(p.name for p in hooks.iterdir() if not p.name.endswith(".sample"))
    except OSError:
        names = []
    if names:
        found.append("hooks " + ", ".join(names))
    try:
        config = (git_dir / "config").read_text(encoding="utf-8", errors="replace").lower()
    except OSError:
        config = ""
    for word in ("fsmonitor", "hookspath"):
        if word in config:
            found.append(f"core.{word} set")
    return "a repo with " + "; ".join(found) if found else None


def review(
    good: Manifest,
    bad: Manifest,
    changes: Iterable[Any],
    indexes: Sequence[str] = (),
    foreign: Iterable[Manifest] | None = None,
) -> list[Risk]:
    """The entries of the foreign manifests among ``good``/``bad`` (default: those not
    :func:`is_own`) that a run over ``changes`` would realize and that can run code or
    reach out."""
    strangers = list(foreign) if foreign is not None else [m for m in (good, bad) if not is_own(m)]
    out: list[Risk] = []
    for change in changes:
        for manifest in (good, bad):
            if not any(manifest is m for m in strangers):
                continue
            # The raw entry (a Change holds the shown values).
            value = manifest.section(change.section).get(change.key)
            if value is None:
                continue
            why = _why(change.section, change.key, value, indexes)
            if why:
                name = str(manifest.path or manifest.label)
                out.append(Risk(change.section, change.key, why, name))
    for manifest in strangers:
        out += kept_trees(manifest)
    return list(dict.fromkeys(out))


def kept_trees(manifest: Manifest) -> list[Risk]:
    """The compile caches whose content ``manifest`` keeps: a run rebuilds them from its
    blobs (whichever state it realizes), and a trial loads that compiled code."""
    return [
        Risk(
            "caches",
            str(name),
            "a kept compile-cache tree: compiled code a trial loads, rebuilt from its blobs",
            str(manifest.path or manifest.label),
        )
        for name, value in sorted(manifest.section("caches").items())
        if isinstance(value, Mapping) and isinstance(value.get("kept"), Mapping)
    ]


def _why(section: str, key: str, value: Any, indexes: Sequence[str]) -> str | None:
    if section == "env":
        return env_risk(key)
    if section in ("packages", "torch"):
        url = package_source(value)
        if url and not _from_index(url, indexes):
            return f"installs from {url} (not a configured index): its build runs code"
        return None
    if section == "files" and _CODE_FILES.search(key):
        return "a file Python or the loader runs at start-up"
    if section == "git":
        return repo_runs_code(key)
    return None


def package_sources(good: Manifest, bad: Manifest, changes: Iterable[Any]) -> list[str]:
    """``name: old source → new source`` for every package change with a direct URL."""
    out = []
    for change in changes:
        if change.section not in ("packages", "torch"):
            continue
        old = package_source(good.section(change.section).get(change.key))
        new = package_source(bad.section(change.section).get(change.key))
        if old or new:
            out.append(f"packages {change.key}: source {old or 'index'} → {new or 'index'}")
    return out


def refuse_untrusted(risks: Sequence[Risk], trusted: Iterable[Path]) -> list[Risk]:
    """TrustError listing ``risks`` of manifests ``trusted`` does not name; returns the
    risks that --trust accepted."""
    names = {os.path.realpath(str(p)) for p in trusted}
    open_risks = [r for r in risks if os.path.realpath(r.manifest) not in names]
    if open_risks:
        manifests = sorted({r.manifest for r in open_risks})
        listed = "; ".join(r.text() for r in open_risks)
        raise TrustError(
            f"{', '.join(manifests)}: not made by you on this machine, and a trial would "
            f"run what it names: {listed}. Review it; to run it anyway pass "
            + " ".join(f"--trust {m}" for m in manifests)
        )
    return list(risks)


@dataclass(frozen=True)
class Review:
    """What ``diff`` says about trust: the foreign entries that can run code, and every
    package source (shown for every manifest)."""

    risks: tuple[Risk, ...]
    sources: tuple[str, ...]

    def lines(self) -> list[str]:
        out = []
        if self.risks:
            out.append("can run code or reach out (from a manifest not made by you here):")
            out += list(dict.fromkeys(f"  ! {r.text()}" for r in self.risks))
        if self.sources:
            out.append("package sources:")
            out += [f"  {s}" for s in self.sources]
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "can_run_code": [
                {"section": r.section, "key": r.key, "why": r.why, "manifest": r.manifest}
                for r in self.risks
            ],
            "package_sources": list(self.sources),
        }


def diff_review(
    good: Manifest,
    bad: Manifest,
    changes: Sequence[Any],
    indexes: Sequence[str] = (),
    own: Sequence[Manifest] = (),
) -> Review:
    """The review of a diff's ``changes``; ``own``: manifests known to be this user's (a
    fresh snapshot) besides the signed ones."""
    foreign = [m for m in (good, bad) if not any(m is o for o in own) and not is_own(m)]
    return Review(
        tuple(review(good, bad, changes, indexes, foreign=foreign)),
        tuple(package_sources(good, bad, changes)),
    )
