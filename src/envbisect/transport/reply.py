"""Reading an agent's reply from its stdout file, streamed and bounded (this module does I/O).

An agent (see ``envbisect.agent.channel``) writes its result as one frame and the content
it keeps as blob frames, each ``<<ENVBISECT nonce BLOB sha256>>``, base64 lines, then
``<<ENVBISECT nonce END>>``. The reply is read line by line from the file the run's stdout
went to: a blob is decoded into a private temp file as its lines arrive, checked against
its name and moved into the blob store, so a 300 MB cache costs no more memory than one
line. Every size is capped (a line, the result, the blobs in all): a target that sends more
gets a one-line error, not a machine out of memory.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from envbisect.model.errors import TransportError

# The result frame (facts, not content): a large snapshot's is a few MB, on one line.
MAX_RESULT_BYTES = 128 << 20
# A line longer than a result can be is not a reply: skipped without being held.
MAX_LINE = MAX_RESULT_BYTES
_SHA = re.compile(rb"[0-9a-f]{64}")


@dataclass
class BlobSink:
    """Where a reply's blob frames go: ``directory`` (created 0700, blobs 0600), at most
    ``cap_bytes`` of decoded content in all. ``errors``: ``{section, error}`` records of
    blobs refused; ``stored``: the names written."""

    directory: Path
    cap_bytes: int
    errors: list[dict[str, str]] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)
    received: int = 0


def _lines(fh: IO[bytes]) -> Iterator[bytes]:
    """The lines of ``fh`` without their ends; a line longer than MAX_LINE comes as one
    ``None``-free marker (``b"\\0"``) after its bytes were skipped."""
    while True:
        line = fh.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = fh.readline(MAX_LINE + 1)
            yield b"\0"
            continue
        yield line.rstrip(b"\r\n")


def read_reply(path: Path, nonce: str, sink: BlobSink | None, who: str) -> dict[str, Any] | None:
    """The payload of the last complete result frame with ``nonce`` in the file ``path``
    (None: there is none); blob frames go to ``sink``. TransportError naming ``who`` when
    the reply is over a cap."""
    with open(path, "rb") as fh:
        return _read(fh, nonce, sink, who)


_B64_LINE = re.compile(rb"[A-Za-z0-9+/=]*")


def _read(fh: IO[bytes], nonce: str, sink: BlobSink | None, who: str) -> dict[str, Any] | None:
    reader = _Reader(nonce, sink, who)
    for line in _lines(fh):
        reader.line(line)
    return reader.payload()


class _Reader:
    """The frames of one reply, a line at a time: the last complete result frame is kept,
    each blob frame is written through as it comes."""

    def __init__(self, nonce: str, sink: BlobSink | None, who: str) -> None:
        tag = b"<<ENVBISECT " + nonce.encode("ascii") + b" "
        self.begin, self.end, self.blob_head = tag + b"BEGIN>>", tag + b"END>>", tag + b"BLOB "
        self.sink, self.who = sink, who
        self.last: list[bytes] | None = None
        self.body: list[bytes] | None = None  # the result frame being read
        self.size = 0
        self.blob: _Blob | None = None

    def line(self, line: bytes) -> None:
        if line == self.begin or (line.startswith(self.blob_head) and line.endswith(b">>")):
            self._start(line)
        elif line == self.end:
            if self.body is not None:
                self.last = self.body
            elif self.blob is not None:
                self.blob.finish()
            self.body, self.blob = None, None
        elif self.body is not None:
            self._result_line(line)
        elif self.blob is not None and line:
            self.blob.write(line)

    def _start(self, line: bytes) -> None:
        if self.blob is not None:
            self.blob.drop("cut off")
        self.body, self.size, self.blob = None, 0, None
        if line == self.begin:
            self.body = []
        else:
            self.blob = _Blob.open(self.sink, line[len(self.blob_head) : -2], self.who)

    def _result_line(self, line: bytes) -> None:
        assert self.body is not None
        if not _B64_LINE.fullmatch(line):
            self.body = None  # not a frame the agent wrote
            return
        self.size += len(line)
        if self.size > MAX_RESULT_BYTES:
            raise TransportError(
                f"the reply of {self.who} is over {MAX_RESULT_BYTES >> 20} MiB of facts: not "
                "an envbisect agent's"
            )
        self.body.append(line)

    def payload(self) -> dict[str, Any] | None:
        if self.blob is not None:
            self.blob.drop("cut off")
        if self.last is None:
            return None
        try:
            payload = json.loads(base64.b64decode(b"".join(self.last)))
        except (binascii.Error, ValueError, RecursionError):
            return None
        return payload if isinstance(payload, dict) else None


class _Blob:
    """One blob frame being decoded into a private temp file of the sink's directory."""

    def __init__(self, sink: BlobSink, sha: str, who: str) -> None:
        self.sink, self.sha, self.who = sink, sha, who
        sink.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.tmp = sink.directory / f".{sha}.{os.getpid()}.part"
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        self.out: IO[bytes] | None = os.fdopen(fd, "wb")
        self.digest = hashlib.sha256()

    @classmethod
    def open(cls, sink: BlobSink | None, name: bytes, who: str) -> _Blob | None:
        """None (the frame is skipped) when no sink takes blobs or the name is no sha256."""
        if sink is None or not _SHA.fullmatch(name):
            return None
        return cls(sink, name.decode("ascii"), who)

    def write(self, line: bytes) -> None:
        if self.out is None:
            return  # already dropped: the rest of the frame is skipped
        try:
            data = base64.b64decode(line, validate=True)
        except (binascii.Error, ValueError):
            self.drop("not base64")
            return
        self.sink.received += len(data)
        if self.sink.received > self.sink.cap_bytes:
            self.drop("over the cap")
            raise TransportError(
                f"the reply of {self.who} holds more than {self.sink.cap_bytes >> 20} MiB of "
                "kept content (the caps of keep_caches and keep_blobs): not read further"
            )
        self.out.write(data)
        self.digest.update(data)

    def finish(self) -> None:
        if self.out is None:
            return
        self.out.close()
        self.out = None
        if self.digest.hexdigest() != self.sha:
            self.drop("content does not match its name")
            return
        target = self.sink.directory / self.sha
        if not target.exists():
            os.replace(self.tmp, target)
        self._remove()
        self.sink.stored.append(self.sha)

    def drop(self, why: str) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None
        self._remove()
        if why:
            error = f"blob {self.sha} from {self.who}: {why}; not stored"
            self.sink.errors.append({"section": "files", "error": error})

    def _remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()


def find_frame(stdout: bytes, nonce: str) -> dict[str, Any] | None:
    """The payload of the last complete result frame with ``nonce`` in ``stdout`` (bytes
    already read), or None; blob frames are skipped. Frames with another nonce (a nested
    agent, a hostile printer) are ignored."""
    import io

    try:
        return _read(io.BytesIO(stdout), nonce, None, "the program")
    except TransportError:
        return None
