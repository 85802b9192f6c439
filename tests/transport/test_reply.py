"""A --via reply is read streamed and bounded (envbisect.transport.reply): blobs go to disk
as their lines arrive, a reply over its cap or of the wrong shape is refused in one line,
and a blob that does not match its name is not stored. The target here is a hostile one:
a program in place of Python that answers the bundle's nonce with what the test chose."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envbisect.agent import channel
from envbisect.transport.reply import BlobSink, find_frame, read_reply

HOSTILE = r"""#!{python}
import base64, json, os, re, sys
src = sys.stdin.read()
nonce = re.search(r"_NONCE = '([0-9a-f]+)'", src).group(1)
out = sys.stdout.buffer
spec = json.load(open({spec!r}))
for sha, size in spec.get("blobs", []):
    out.write(b"\n<<ENVBISECT " + nonce.encode() + b" BLOB " + sha.encode() + b">>\n")
    chunk = base64.b64encode(b"x" * 49152) + b"\n"
    for _ in range(size // 49152):
        out.write(chunk)
    out.write(b"<<ENVBISECT " + nonce.encode() + b" END>>\n")
body = base64.b64encode(json.dumps(spec["reply"]).encode())
out.write(b"\n<<ENVBISECT " + nonce.encode() + b" BEGIN>>\n" + body + b"\n<<ENVBISECT "
          + nonce.encode() + b" END>>\n")
"""


def _hostile(tmp_path: Path, reply: object, blobs: list[tuple[str, int]] = ()) -> Path:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"reply": reply, "blobs": list(blobs)}))
    prog = tmp_path / "python"
    prog.write_text(HOSTILE.format(python=sys.executable, spec=str(spec)))
    prog.chmod(0o755)
    (tmp_path / "envbisect.yaml").write_text(
        f"manifests_dir: {tmp_path / 'm'}\nkeep_caches: 1MiB\n"
    )
    return prog


def _snapshot(tmp_path: Path, prog: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbisect", "snapshot", "--config",
         str(tmp_path / "envbisect.yaml"), "--python", str(prog), "--via", "sh -c",
         "-o", str(tmp_path / "out.yaml")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    for word in words:
        assert word in line, line


def test_kept_content_over_the_cap_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    # keep_caches 1 MiB: the reply may bring 1 MiB per cache (2 default ones) + 1 MiB.
    prog = _hostile(tmp_path, {"sections": {}}, blobs=[("a" * 64, 8 << 20)])
    _one_line_error(_snapshot(tmp_path, prog), "holds more than 3 MiB of kept content")
    assert not (tmp_path / "out.yaml").exists()
    assert list((tmp_path / "m" / "blobs").iterdir()) == []


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ({"sections": {}, "blobs": [1, 2]}, "blobs is list, not a mapping"),
        ({"sections": {}, "blobs": {"ab": 5}}, "a blob is not base64 text"),
        ({"sections": {"env": {}}, "errors": "x"}, "errors is str, not a list"),
        ({"sections": {"meta": 5}}, "section meta is not a mapping"),
        ({"sections": {}, "elapsed_s": "x"}, "elapsed_s is str, not a number"),
    ],
)
def test_a_reply_of_the_wrong_shape_is_refused_in_one_line(
    tmp_path: Path, reply: dict[str, object], said: str
) -> None:
    prog = _hostile(tmp_path, reply)
    _one_line_error(_snapshot(tmp_path, prog), f"the snapshot reply of {prog} via sh -c", said)
    assert not (tmp_path / "out.yaml").exists()


def test_a_blob_that_does_not_match_its_name_is_not_stored(tmp_path: Path) -> None:
    prog = _hostile(tmp_path, {"sections": {}}, blobs=[("b" * 64, 49152)])
    proc = _snapshot(tmp_path, prog)
    assert proc.returncode == 0, proc.stderr
    assert "content does not match its name" in (tmp_path / "out.yaml").read_text()
    assert list((tmp_path / "m" / "blobs").iterdir()) == []


def test_blob_frames_are_written_through_and_checked(tmp_path: Path) -> None:
    """The agent's own BlobStream, read back: a heartbeat between lines is harmless, a frame
    cut off is dropped, and the result is found after them."""
    data = os.urandom(200_000)
    sha = hashlib.sha256(data).hexdigest()
    nonce = "0123456789abcdef"
    r, w = os.pipe()
    channel._state.update(fd=w, nonce=nonce)
    try:
        pid = os.fork()
        if pid == 0:
            os.close(r)
            channel.BlobStream().send_bytes(sha, data)
            channel._write(b"\n\n<<ENVBISECT " + nonce.encode() + b" BLOB " + b"c" * 64 + b">>\n")
            channel._write(base64.b64encode(b"cut") + b"\n")
            channel.emit({"ok": 1})
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as fh:
            stdout = fh.read()
        os.waitpid(pid, 0)
    finally:
        channel._state.update(fd=None, nonce=None, done=False)
    (tmp_path / "out").write_bytes(stdout)
    sink = BlobSink(tmp_path / "blobs", 1 << 20)
    assert read_reply(tmp_path / "out", nonce, sink, "t") == {"ok": 1}
    assert sink.stored == [sha]
    assert (tmp_path / "blobs" / sha).read_bytes() == data
    assert (tmp_path / "blobs" / sha).stat().st_mode & 0o077 == 0
    assert [e["error"] for e in sink.errors] == [f"blob {'c' * 64} from t: cut off; not stored"]
    assert find_frame(stdout, nonce) == {"ok": 1}


def test_a_targets_host_and_errors_reach_the_terminal_escaped(tmp_path: Path) -> None:
    osc52 = "\x1b]52;c;aGk=\x07"
    reply = {
        "sections": {},
        "host": f"box{osc52}\x1b[2J",
        "errors": [{"section": "env", "error": f"no access\x1b[2J{osc52}"}],
    }
    proc = _snapshot(tmp_path, _hostile(tmp_path, reply))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert "box\\x1b]52;c;aGk=\\x07" in proc.stderr
