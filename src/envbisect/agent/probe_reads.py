"""Which data files the probed program opened, and which version of each (stdlib only,
Python 3.8+ syntax; shipped in the probe's bootstrap as ``_envbisect_probe_reads``).

A program that builds its dataset's path itself (``os.path.join('data', dataset)``, a name
in a config) is not met through its argv: the host puts the state's version where the
program looks, and this proves it did. The host names the paths to watch (``watch`` in the
probe's config: every place of the state's datasets); an audit hook on ``open`` (PEP 578:
``open()``, ``io.open``, ``os.open``, ``numpy.memmap`` and ``torch.load`` all raise it)
records those opened, and at exit each is fingerprinted as a snapshot's ``data:`` section
fingerprints it (``collect_common.data_file``). Files opened by C code that raises no audit
event are not seen: the host then says the read is not verified.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading

READS: dict = {"watch": None, "opened": {}}  # opened: real path -> the path as opened
_LOCK = threading.Lock()
_SAMPLE = 1 << 16


def configure(config):
    """Watch the paths the host named (``watch``: a list), if any."""
    watch = config.get("watch") if isinstance(config, dict) else None
    if not isinstance(watch, list) or not watch:
        return
    READS["watch"] = set(os.path.realpath(str(p)) for p in watch)
    sys.addaudithook(_on_event)


def _on_event(event, args):
    if event not in ("open", "os.open") or not args:
        return
    path = args[0]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # an fd
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError, OSError):
        return
    if real in READS["watch"] and real not in READS["opened"]:
        with _LOCK:
            READS["opened"].setdefault(real, os.fsdecode(path))


def fingerprint(path):
    """A data file's fingerprint, as a snapshot records it (size, head, middle, tail)."""
    size = os.path.getsize(path)
    h = hashlib.sha256(b"size=%d\n" % size)
    with open(path, "rb") as fh:
        for offset in sorted({0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)}):
            fh.seek(offset)
            h.update(fh.read(_SAMPLE))
    return "sha256:" + h.hexdigest()[:32]


def facts():
    """``{"data_reads": [{path, real, fingerprint}]}`` when paths were watched, else {}."""
    if READS["watch"] is None:
        return {}
    with _LOCK:
        opened = sorted(READS["opened"].items())
    reads = []
    for real, path in opened:
        try:
            fp = fingerprint(real)
        except OSError:
            fp = None
        reads.append({"path": path, "real": real, "fingerprint": fp})
    return {"data_reads": reads, "data_watched": len(READS["watch"])}
