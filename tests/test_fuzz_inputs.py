"""Fuzzing what other people hand envbisect: manifests (diff), --via replies (snapshot),
profile facts (profile-diff) and session journals (reset). Whatever the input, the command
ends with its normal output or with one line on stderr and exit 2: never a traceback, and
nothing written outside the session it was given."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbisect.cli import main
from envbisect.model.errors import CollectError
from envbisect.snapshot import check_reply
from envbisect.transport.reply import BlobSink, read_reply

NASTY_TEXT = st.sampled_from(
    ["", "a\nb", "\x1b]52;c;aGk=\x07", "\x1b[2J", "../../etc/passwd", "/dev/null", "=", "\x00",
     "9" * 5000, "%2e%2e", "file:///x/../y", "\udc80"]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    NASTY_TEXT,
)
TREES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=12), NASTY_TEXT), inner, max_size=4),
    ),
    max_leaves=25,
)
SECTIONS = ["meta", "env", "packages", "torch", "files", "git", "data", "caches", "machine"]
MANIFESTS = st.fixed_dictionaries(
    {"schema": st.sampled_from(["envbisect/manifest@1", "envbisect/manifest@9", 3])},
    optional={name: TREES for name in SECTIONS},
)
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@contextmanager
def _dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="envbisect-fuzz-") as name:
        yield Path(name)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _one_line_or_output(argv: list[str], capsys: pytest.CaptureFixture[str]) -> int:
    """Run the CLI in this process; an error must be one line on stderr with exit 2."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    code = int(info.value.code or 0)
    err = capsys.readouterr().err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("envbisect: error: "), err
    else:
        assert code in (0, 1), (code, err)
    assert "Traceback" not in err
    return code


def _dump(data: Any) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError):
        return json.dumps(data, default=str)


@FUZZ
@given(good=MANIFESTS, bad=MANIFESTS)
def test_diff_of_any_two_manifests(
    good: dict[str, Any], bad: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with _dir() as root:
        (root / "g.yaml").write_text(_dump(good), errors="surrogateescape")
        (root / "b.yaml").write_text(_dump(bad), errors="surrogateescape")
        before = _files(root)
        for fmt in ("table", "json"):
            _one_line_or_output(
                ["diff", "--format", fmt, str(root / "g.yaml"), str(root / "b.yaml")], capsys
            )
        assert _files(root) == before


@FUZZ
@given(raw=st.binary(max_size=400))
def test_diff_of_bytes_that_are_no_manifest(raw: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    with _dir() as root:
        (root / "g.yaml").write_bytes(raw)
        (root / "b.yaml").write_bytes(b"schema: envbisect/manifest@1\n")
        _one_line_or_output(["diff", str(root / "g.yaml"), str(root / "b.yaml")], capsys)


@FUZZ
@given(good=TREES, bad=TREES)
def test_profile_diff_of_any_facts(good: Any, bad: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with _dir() as root:
        (root / "g.json").write_text(json.dumps(good, default=str))
        (root / "b.json").write_text(json.dumps({"facts": bad}, default=str))
        _one_line_or_output(["profile-diff", str(root / "g.json"), str(root / "b.json")], capsys)


JOURNAL_LINES = st.one_of(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["swap", "put", "written", "restored", "x"])},
        optional={
            "id": SCALARS,
            "path": SCALARS,
            "backup": SCALARS,
            "existed": SCALARS,
            "sha256": SCALARS,
            "mode": SCALARS,
            "put": SCALARS,
        },
    ),  # fmt: skip
    TREES,
)


@FUZZ
@given(lines=st.lists(JOURNAL_LINES, max_size=5))
def test_reset_of_any_journal(lines: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    with _dir() as root:
        session = root / "session"
        session.mkdir()
        (session / "journal.jsonl").write_text(
            "".join(json.dumps(line, default=str) + "\n" for line in lines)
        )
        outside = root / "elsewhere"
        outside.mkdir()
        (outside / "kept").write_text("mine\n")
        _one_line_or_output(["reset", "--session", str(session)], capsys)
        assert _files(outside) == {"kept"} and (outside / "kept").read_text() == "mine\n"


@FUZZ
@given(reply=TREES, noise=st.binary(max_size=200))
def test_any_via_reply_is_refused_or_read(reply: Any, noise: bytes) -> None:
    """The reader and the shape check of a snapshot's reply: a payload comes back whole or
    not at all, and a wrong shape is a CollectError, never another exception."""
    nonce = "0123456789abcdef"
    body = base64.b64encode(json.dumps({"sections": reply}, default=str).encode())
    frame = b"\n<<ENVBISECT " + nonce.encode() + b" BEGIN>>\n" + body + b"\n<<ENVBISECT "
    frame += nonce.encode() + b" END>>\n"
    with _dir() as root:
        (root / "out").write_bytes(noise + frame + noise)
        sink = BlobSink(root / "blobs", 1 << 20)
        payload = read_reply(root / "out", nonce, sink, "t")
        assert payload is not None
        if isinstance(payload.get("sections"), dict):
            try:
                check_reply(payload, "t")
            except CollectError as exc:
                assert "the snapshot reply of t" in str(exc)


HOSTILE = r"""#!{python}
import base64, json, re, sys
nonce = re.search(r"_NONCE = '([0-9a-f]+)'", sys.stdin.read()).group(1)
body = base64.b64encode(open({reply!r}, "rb").read())
sys.stdout.write("\n<<ENVBISECT " + nonce + " BEGIN>>\n" + body.decode() + "\n<<ENVBISECT "
                 + nonce + " END>>\n")
"""


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reply=st.dictionaries(st.sampled_from(["sections", "errors", "blobs", "host"]), TREES))
def test_snapshot_through_a_layer_from_a_hostile_target(reply: dict[str, Any]) -> None:
    with _dir() as root:
        (root / "reply.json").write_text(json.dumps(reply, default=str))
        prog = root / "python"
        prog.write_text(HOSTILE.format(python=sys.executable, reply=str(root / "reply.json")))
        prog.chmod(0o755)
        (root / "envbisect.yaml").write_text(f"manifests_dir: {root / 'm'}\n")
        proc = subprocess.run(
            [sys.executable, "-m", "envbisect", "snapshot", "--config",
             str(root / "envbisect.yaml"), "--python", str(prog), "--via", "sh -c",
             "-o", str(root / "out.yaml")],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "TMPDIR": str(root)},
        )  # fmt: skip
        assert "Traceback" not in proc.stderr
        if proc.returncode != 0:
            assert proc.returncode == 2, proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert not (root / "out.yaml").exists()


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("huge-int.yaml", "schema: envbisect/manifest@1\nenv: {A: " + "9" * 5000 + "}\n",
         "holds an integer of more than"),
        ("deep.yaml", "schema: envbisect/manifest@1\nenv: " + "[" * 100_000 + "\n",
         "nesting depth"),
    ],
)  # fmt: skip
def test_the_reviews_edge_cases_are_one_line(
    tmp_path: Path, name: str, content: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_text(content)
    (tmp_path / "ok.yaml").write_text("schema: envbisect/manifest@1\n")
    with pytest.raises(SystemExit) as info:
        main(["diff", str(tmp_path / name), str(tmp_path / "ok.yaml")])
    assert info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert said in line and "Traceback" not in line, line


def test_profile_diff_refuses_a_fifo_a_deep_file_and_a_huge_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as fh:
        fh.truncate(65 << 20)  # sparse: no disk used
    for path, said in ((fifo, "is a FIFO"), (deep, "nested too deep"), (huge, "larger than")):
        with pytest.raises(SystemExit) as info:
            main(["profile-diff", str(path), str(path)])
        assert info.value.code == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert said in line, line
