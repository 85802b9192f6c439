"""Host side of ``snapshot``: run the collector agent in the target, build the manifest.

The agent (``envbisect.agent.collector``) runs inside the target Python and returns the
fact sections; this side adds ``meta`` (label, time, tool version, host, target, elapsed,
errors), stores kept file contents under ``<manifests_dir>/blobs/<sha256>`` and writes the
manifest atomically. Nothing here imports torch, gitpython or tabulate.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from envbisect import __version__
from envbisect.agent.redact import redact_text
from envbisect.model.changes import human_bytes
from envbisect.model.config import Config
from envbisect.model.errors import CollectError, TransportError, UsageError
from envbisect.model.escape import printable
from envbisect.model.manifest import Manifest, save
from envbisect.model.paths import atomic_write_bytes, refuse_not_a_file
from envbisect.model.trust import sign
from envbisect.transport import Transport
from envbisect.transport.reply import BlobSink

AGENT = "envbisect.agent.collector"
DEFAULT_LABEL = "snapshot"


def agent_params(
    config: Config, *, gpu_timeout_s: float = 10.0, local: bool = False
) -> dict[str, Any]:
    """The JSON parameters the collector agent receives for ``config``; a ``local`` target
    writes kept cache contents straight into the blob store (no base64 round trip)."""
    return {
        "repos": [str(p) for p in config.repos],
        "files": list(config.files),
        "data": [str(p) for p in config.data],
        "caches": {name: str(path) for name, path in sorted(config.caches.items())},
        "probes": list(config.probes),
        "env": list(config.env),
        "keep_blobs": config.keep_blobs,
        "keep_caches": config.keep_caches,
        "cache_blob_dir": str(config.blobs_dir.absolute()) if local else None,
        # A remote target sends back only the content the blob store lacks.
        "have_blobs": [] if local else held_blobs(config.blobs_dir),
        "gpu_timeout_s": gpu_timeout_s,
        "cmd_timeout_s": 10.0,
    }


def take_snapshot(
    config: Config,
    transport: Transport,
    python: str,
    *,
    label: str | None = None,
    log_dir: Path | None = None,
    timeout_s: float = 60,
    params: dict[str, Any] | None = None,
) -> Manifest:
    """Collect the facts of the target ``python`` reached through ``transport``.

    ``params`` overrides individual agent parameters (e.g. ``gpu_timeout_s``). Raises
    CollectError when the agent returned nothing; partial failures land in ``meta.errors``.
    """
    started = time.monotonic()
    created = datetime.now(timezone.utc).replace(microsecond=0)
    all_params = agent_params(config, local=not transport.layers)
    all_params.update(params or {})
    own_logs = log_dir is None
    logs = Path(tempfile.mkdtemp(prefix="envbisect-snapshot-")) if log_dir is None else log_dir
    sink = BlobSink(config.blobs_dir, blob_cap(config))
    try:
        result = transport.run_agent(
            python,
            AGENT,
            all_params,
            timeout_s=timeout_s,
            log_dir=logs,
            name="snapshot",
            blobs=sink,
        )
    except TransportError as exc:
        own_logs = False  # keep the full log the message points at
        raise CollectError(
            f"snapshot of {python} via {transport.describe()} failed: {exc}"
        ) from None
    finally:
        if own_logs:
            shutil.rmtree(logs, ignore_errors=True)
    sections = result.get("sections")
    if not isinstance(sections, dict):
        raise CollectError(f"collector in {python} returned no sections")
    check_reply(result, f"{python} via {transport.describe()}")
    errors: list[dict[str, str]] = list(result.get("errors") or [])
    sections = _escape_raw_bytes(sections, errors)
    errors.extend(sink.errors)
    blobs = result.get("blobs") or {}
    if blobs:  # an agent called without a channel (none streams then)
        errors.extend(store_blobs(blobs, config.blobs_dir))
    meta: dict[str, Any] = {
        "agent_elapsed_s": result.get("elapsed_s"),
        "label": label or config.label or DEFAULT_LABEL,
        "created": created.isoformat().replace("+00:00", "Z"),
        "tool_version": __version__,
        "host": result.get("host"),
        # A layer may carry a credential on its command line (env HF_TOKEN=..., a URL).
        "target": {
            "python": redact_text(python),
            "via": [redact_text(layer.describe()) for layer in transport.layers],
        },
        "elapsed_s": round(time.monotonic() - started, 3),
        "errors": errors,
    }
    # What this snapshot was asked to record: a run may touch these paths of a manifest this
    # user made (see envbisect.model.scope), besides what envbisect.yaml names.
    meta["scope"] = {
        "files": list(config.files),
        "repos": [str(p) for p in config.repos],
        "data": [str(p) for p in config.data],
        "caches": sorted(
            {
                str(c["path"])
                for c in (sections.get("caches") or {}).values()
                if isinstance(c, dict) and isinstance(c.get("path"), str)
            }
        ),
    }
    if (
        blobs
        or sink.stored
        or any(
            isinstance(c, dict) and c.get("kept") for c in (sections.get("caches") or {}).values()
        )
    ):
        # Where the contents went, so a manifest written anywhere (-o PATH) finds them.
        meta["blobs_dir"] = str(config.blobs_dir.absolute())
    return Manifest(sections={"meta": dict(sorted(meta.items())), **sections})


def _escape_raw_bytes(sections: dict[str, Any], errors: list[dict[str, str]]) -> dict[str, Any]:
    """Sections whose paths and values that are not UTF-8 (a file name, an env value) are
    recorded with ``\\xNN`` escapes, each said in ``meta.errors``: YAML holds text only."""
    from envbisect.model.escape import escape_raw_bytes

    out: dict[str, Any] = {}
    for name, value in sections.items():
        found: list[str] = []
        out[name] = escape_raw_bytes(value, name, found)
        errors.extend(
            {"section": name, "error": f"{where}: not UTF-8; recorded with \\xNN escapes"}
            for where in found
        )
    return out


def held_blobs(blobs_dir: Path) -> list[str]:
    """The sha256 names of the contents already in ``blobs_dir`` (none when it is absent)."""
    try:
        names = os.listdir(blobs_dir)
    except OSError:
        return []
    return sorted(n for n in names if len(n) == 64 and all(c in "0123456789abcdef" for c in n))


_REPLY_SHAPES = (
    ("sections", dict, "a mapping of section names to facts"),
    ("errors", list, "a list of {section, error} records"),
    ("blobs", dict, "a mapping of sha256 to base64 content"),
    ("host", str, "a host name"),
    ("elapsed_s", (int, float), "a number of seconds"),
)


def check_reply(result: dict[str, Any], who: str) -> None:
    """CollectError naming the first field of a collector's reply that has the wrong shape
    (a hostile or broken target: nothing of it is written)."""
    for key, kind, what in _REPLY_SHAPES:
        value = result.get(key)
        if value is not None and not isinstance(value, kind):
            raise CollectError(
                f"the snapshot reply of {who}: {key} is {type(value).__name__}, not {what}"
            )
    bad_section = next((k for k, v in result["sections"].items() if not isinstance(v, dict)), None)
    if bad_section is not None:
        raise CollectError(
            f"the snapshot reply of {who}: section {printable(bad_section)} is not a mapping"
        )
    for record in result.get("errors") or ():
        if not isinstance(record, dict) or not all(isinstance(v, str) for v in record.values()):
            raise CollectError(
                f"the snapshot reply of {who}: errors holds {printable(record)[:80]}"
            )
    if not all(isinstance(v, str) for v in (result.get("blobs") or {}).values()):
        raise CollectError(f"the snapshot reply of {who}: a blob is not base64 text")


def blob_cap(config: Config) -> int:
    """The most kept content a snapshot's reply may bring back: every cache at its cap, and
    files at theirs (1 GiB for them in all), so a hostile target cannot fill the disk."""
    caches = len(config.caches) + 2  # and the default TorchInductor and Triton caches
    return (config.keep_caches or 0) * caches + (1 << 30 if config.keep_blobs else 0) + (1 << 20)


def store_blobs(blobs: dict[str, str], blobs_dir: Path) -> list[dict[str, str]]:
    """Write each base64 blob to ``blobs_dir/<sha256>`` unless present; errors as records."""
    errors = []
    for sha, encoded in sorted(blobs.items()):
        target = blobs_dir / sha
        if target.exists():
            continue
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            errors.append({"section": "files", "error": f"blob {sha}: not base64"})
            continue
        if hashlib.sha256(data).hexdigest() != sha:
            errors.append({"section": "files", "error": f"blob {sha}: content does not match"})
            continue
        try:
            atomic_write_bytes(target, data)
        except OSError as exc:
            errors.append({"section": "files", "error": f"blob {target}: {exc.strerror}"})
    return errors


def default_output(manifest: Manifest, config: Config) -> Path:
    """``<manifests_dir>/<label>-<UTC time>.yaml``, never overwriting an existing file."""
    created = str(manifest.section("meta").get("created") or "")
    stamp = created.replace("-", "").replace(":", "") or time.strftime("%Y%m%dT%H%M%SZ")
    label = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in manifest.label)
    while len(label.encode("utf-8")) > 100:  # a file name ends at 255 bytes; meta keeps it all
        label = label[:-1]
    path = config.manifests_dir / f"{label}-{stamp}.yaml"
    n = 2
    while path.exists():
        path = config.manifests_dir / f"{label}-{stamp}-{n}.yaml"
        n += 1
    return path


def write_snapshot(manifest: Manifest, out: str | None, config: Config) -> Path | None:
    """Write ``manifest``: ``-`` to stdout (returns None), else a path, atomically."""
    if out == "-":
        sys.stdout.write(sign(manifest).to_yaml())
        sys.stdout.flush()
        return None
    path = Path(out) if out else default_output(manifest, config)
    manifest = sign(manifest)
    if path.is_dir():
        raise UsageError(f"{path}: is a directory; give a file name for -o")
    refuse_not_a_file("-o", path)
    try:
        save(manifest, path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write manifest: {exc.strerror}") from None
    return path


def _cache_bit(name: str, cache: dict[str, Any]) -> str:
    """``inductor 300 files (content kept, 12.1 MB)`` / ``triton absent``."""
    if not cache.get("exists"):
        return f"{name} absent"
    kept = cache.get("kept")
    how = f" (content kept, {human_bytes(kept.get('bytes'))})" if isinstance(kept, dict) else ""
    return f"{name} {cache.get('files', 0)} files{how}"


def summary(manifest: Manifest) -> list[str]:
    """A few human lines about a snapshot: what was found, what failed, how long it took."""
    s = manifest.section
    meta = s("meta")
    torch = s("torch")
    gpu = s("gpu")
    caches = s("caches")
    parts = [
        f"python {s('python').get('version', '?')}",
        f"{len(s('packages'))} packages",
        f"torch {torch.get('version') or 'absent'}",
        f"{len(gpu.get('devices') or [])} GPU(s)",
        f"{len(s('git'))} repo(s)",
        f"{len(s('files'))} file(s)",
        f"{len(s('data'))} dataset(s)",
        f"{len(s('env'))} env var(s)",
    ]
    if s("probes"):
        parts.append(f"{len(s('probes'))} probe(s)")
    cache_bits = [_cache_bit(name, c) for name, c in caches.items() if isinstance(c, dict)]
    lines = [
        f"snapshot '{manifest.label}' of {meta.get('host') or '?'} "
        f"in {meta.get('elapsed_s', 0):.2f}s: " + ", ".join(parts),
    ]
    if cache_bits:
        lines.append("caches: " + ", ".join(cache_bits))
    errors = meta.get("errors") or []
    for err in errors:
        lines.append(f"error [{err.get('section')}]: {err.get('error')}")
    return lines
