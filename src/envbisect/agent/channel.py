"""The framed result channel of an agent (stdlib only, Python 3.8+ syntax).

An agent is shipped on stdin to ``<python> -``. Before its program runs, ``open_channel``
moves the real stdout out of the way: fd 1 becomes a copy of fd 2, so anything a library
prints -- Python ``print``, C-level ``write(1, ...)``, a sitecustomize -- lands on stderr.
The result is written once, on the saved real stdout, between two marker lines that carry
a per-call nonce, as base64 of JSON. Noise cannot corrupt it and a ``tail`` cannot hide it.

The channel also keeps the agent from outliving its caller: a watchdog exits at the
deadline, and a heartbeat (a bare newline, ignored by the reader) exits as soon as the real
stdout is broken -- which is what happens when an ssh or container layer dies. On either
exit, the rest of the agent's process group (workers it started) is killed too, when the
agent leads that group (it does under ssh and under a local run).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import sys
import threading
import time

from envbisect.agent.procfs import read_stat

# Registered before this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = ("envbisect.agent.procfs",)

_state = {"fd": None, "nonce": None, "lock": threading.Lock(), "done": False}

EXIT_DEADLINE = 124
EXIT_BROKEN_PIPE = 141


def _write(data):
    fd = _state["fd"]
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _end_own_group():
    """SIGKILL the rest of our process group when we lead it (e.g. compile workers we
    started), so that exiting leaves nothing running on the far side. Linux /proc only."""
    me = os.getpid()
    try:
        if os.getpgrp() != me:
            return  # not our group to end: the caller's own processes may share it
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        proc = read_stat(int(name))
        if proc is not None and proc.pgrp == me:
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)


def _exit(code):
    _end_own_group()
    os._exit(code)


def _watchdog(deadline_s):
    time.sleep(deadline_s)
    if not _state["done"]:
        sys.stderr.write(f"envbisect agent: deadline of {deadline_s:.0f}s reached, exiting\n")
        sys.stderr.flush()
        _exit(EXIT_DEADLINE)


def _heartbeat(interval_s):
    while not _state["done"]:
        time.sleep(interval_s)
        with _state["lock"]:
            if _state["done"]:
                return
            try:
                _write(b"\n")
            except OSError:
                _exit(EXIT_BROKEN_PIPE)


def open_channel(nonce, deadline_s=None, heartbeat_s=2.0):
    """Save the real stdout, point fd 1 at stderr, start the watchdog and heartbeat."""
    sys.stdout.flush()
    _state["fd"] = os.dup(1)
    _state["nonce"] = nonce
    os.dup2(2, 1)
    if deadline_s:
        threading.Thread(target=_watchdog, args=(float(deadline_s),), daemon=True).start()
    if heartbeat_s:
        threading.Thread(target=_heartbeat, args=(float(heartbeat_s),), daemon=True).start()


def frame(nonce, obj):
    """Bytes of one frame holding ``obj``."""
    payload = base64.b64encode(json.dumps(obj, sort_keys=True, default=str).encode("utf-8"))
    return b"".join(
        [
            b"\n<<ENVBISECT ",
            nonce.encode("ascii"),
            b" BEGIN>>\n",
            payload,
            b"\n<<ENVBISECT ",
            nonce.encode("ascii"),
            b" END>>\n",
        ]
    )


def emit(obj):
    """Write the result frame on the real stdout (once)."""
    with _state["lock"]:
        _write(frame(_state["nonce"], obj))
        _state["done"] = True


# Raw bytes per base64 line of a blob frame: a line is 64 KiB of text, written in one go.
BLOB_CHUNK = 48 * 1024


class BlobStream:
    """Kept content sent back as it is found, one blob frame each (``<<ENVBISECT nonce BLOB
    sha256>>``, base64 lines, ``END``), so that neither side holds a large cache in memory:
    the caller writes each line to disk as it arrives. Used like the ``sha256 -> base64``
    dict it replaces; ``send_file`` streams a file without reading it whole."""

    def __init__(self, have=()):
        self._sent = set(have)

    def __contains__(self, sha):
        return sha in self._sent

    def __setitem__(self, sha, encoded):
        self.send_bytes(sha, base64.b64decode(encoded))

    def send_bytes(self, sha, data):
        if sha in self._sent:
            return
        self._sent.add(sha)
        self._frame(sha, (data[i : i + BLOB_CHUNK] for i in range(0, len(data), BLOB_CHUNK)))

    def send_file(self, sha, path):
        if sha in self._sent:
            return
        self._sent.add(sha)
        with open(path, "rb") as fh:
            self._frame(sha, iter(lambda: fh.read(BLOB_CHUNK), b""))

    def _frame(self, sha, chunks):
        nonce = _state["nonce"].encode("ascii")
        with _state["lock"]:
            _write(b"\n<<ENVBISECT " + nonce + b" BLOB " + sha.encode("ascii") + b">>\n")
        for chunk in chunks:
            line = base64.b64encode(chunk) + b"\n"
            with _state["lock"]:  # whole lines: a heartbeat lands between them, never inside
                _write(line)
        with _state["lock"]:
            _write(b"<<ENVBISECT " + nonce + b" END>>\n")

    def items(self):
        return ()

    def __len__(self):
        return 0


def keep_bytes(blobs, sha, data):
    """Put ``data`` into ``blobs`` (a :class:`BlobStream` streams it as it is, a dict takes
    its base64)."""
    if isinstance(blobs, BlobStream):
        blobs.send_bytes(sha, data)
    else:
        blobs[sha] = base64.b64encode(data).decode("ascii")


def blob_store(have=()):
    """Where an agent puts the content it keeps: a :class:`BlobStream` inside a channel, a
    plain ``sha256 -> base64`` dict when called in-process (no channel is open)."""
    return BlobStream(have) if _state["fd"] is not None else {}


def write_stdout_line(line):
    """Write one line on the real stdout, outside any frame (e.g. ``ENVBISECT_RESULT {...}``)."""
    with _state["lock"]:
        _write(line.rstrip("\n").encode("utf-8") + b"\n")
