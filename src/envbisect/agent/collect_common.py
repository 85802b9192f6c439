"""What the collector and the as-of agent share (stdlib only, Python 3.8+ syntax): the
``Collector`` that runs commands and keeps errors, file and metadata readers, dataset
fingerprints and the tree walk."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import signal
import stat
import subprocess

from envbisect.agent.redact import redact_text

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = ("envbisect.agent.redact",)

# -- helpers -------------------------------------------------------------------------------


class Collector:
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
            raise Timeout(f"{argv[0]} timed out after {timeout:g}s") from None
        return proc.returncode, out, err.decode("utf-8", "replace").strip()


class Timeout(Exception):
    pass


def read_text(path, limit=1 << 20):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def sorted_dict(d):
    return dict(sorted(d.items()))


def normalise(name):
    # PEP 503 by hand: the collector is stdlib-only and cannot import packaging.utils.
    return re.sub(r"[-_.]+", "-", name).lower()


def file_sha256(path):
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


# -- distribution metadata and datasets ---------------------------------------------------


def metadata_headers(text):
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break
        if line.startswith("Name:") and name is None:
            name = line[5:].strip()
        elif line.startswith("Version:") and version is None:
            version = line[8:].strip()
    return name, version


def parse_direct_url(raw):
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


def named_distributions(entry):
    """(name, version, metadata file, dist-info dir or None) of every distribution in
    ``entry`` whose metadata names it; unreadable metadata is skipped."""
    for meta_file, info_dir in _path_distributions(entry):
        try:
            name, version = metadata_headers(_read_headers(meta_file))
        except OSError:
            continue
        if name:
            yield name, version, meta_file, info_dir


_SAMPLE = 1 << 16
_TEXT_SUFFIXES = (".jsonl", ".ndjson", ".txt", ".csv", ".tsv", ".json")


def data_file(c, path):
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


def data_dir(path):
    entries = []
    total = 0
    for rel, size, _mtime in walk(path):
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


def walk(root):
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
