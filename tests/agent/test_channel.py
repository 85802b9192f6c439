"""The agent protocol: bundles run by a real ``python -``, the framed channel, its deadline
and heartbeat, and the frame finder against hostile output."""

from __future__ import annotations

import ast
import base64
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbisect.agent import channel
from envbisect.model.errors import TransportError
from envbisect.transport import Transport
from envbisect.transport.bundle import build_bundle
from envbisect.transport.reply import find_frame

NONCE = "0123456789abcdef"


def _program(body: str, *, deadline_s: float | None = None, heartbeat_s: float = 2.0) -> bytes:
    """Channel source plus ``body``, run after the channel is open (as a bundle would)."""
    source = Path(channel.__file__).read_text()
    return (
        source
        + "\nimport os as _os, sys as _sys, time as _time\n"
        + f"open_channel({NONCE!r}, {deadline_s!r}, heartbeat_s={heartbeat_s!r})\n"
        + body
    ).encode()


def _run(program: bytes, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-"], input=program, capture_output=True, timeout=timeout, check=False
    )


# ---- find_frame ---------------------------------------------------------------------------


def test_frame_round_trips_and_other_nonces_are_ignored() -> None:
    ours = channel.frame(NONCE, {"ok": True, "text": "ü 😀 \n"})
    theirs = channel.frame("ffffffffffffffff", {"ok": False})
    noise = b'{"ok": false}\n<<ENVBISECT ' + NONCE.encode() + b" BEGIN>>\nnot base64!\n"
    assert find_frame(noise + theirs + ours + theirs + b"\n\n", NONCE) == {
        "ok": True,
        "text": "ü 😀 \n",
    }
    assert find_frame(noise + theirs, NONCE) is None


def test_the_last_complete_frame_wins_and_crlf_is_tolerated() -> None:
    first = channel.frame(NONCE, {"n": 1})
    second = channel.frame(NONCE, {"n": 2}).replace(b"\n", b"\r\n")
    assert find_frame(first + second, NONCE) == {"n": 2}
    truncated = channel.frame(NONCE, {"n": 3})[:-20]
    assert find_frame(first + truncated, NONCE) == {"n": 1}


@pytest.mark.parametrize(
    "payload",
    [b"!!!!", base64.b64encode(b"[1, 2]"), base64.b64encode(b"{not json")],
)
def test_a_frame_with_a_bad_payload_is_no_result(payload: bytes) -> None:
    data = b"<<ENVBISECT %s BEGIN>>\n%s\n<<ENVBISECT %s END>>\n" % (
        NONCE.encode(),
        payload,
        NONCE.encode(),
    )
    assert find_frame(data, NONCE) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(obj=st.dictionaries(st.text(), json_values, max_size=5), before=st.binary(max_size=200))
def test_any_json_object_survives_framing_after_arbitrary_bytes(
    obj: dict[str, object], before: bytes
) -> None:
    assert find_frame(before + channel.frame(NONCE, obj), NONCE) == obj


# ---- the channel in a real python ----------------------------------------------------------


def test_noise_goes_to_stderr_and_the_result_to_the_real_stdout() -> None:
    proc = _run(
        _program(
            "print('python print noise')\n"
            "_os.write(1, b'c-level write to fd 1\\n')\n"
            "_os.system('echo child process noise')\n"
            "write_stdout_line('ENVBISECT_RESULT {\"ok\": true}')\n"
            "emit({'answer': 42})\n"
        )
    )
    assert proc.returncode == 0, proc.stderr
    assert find_frame(proc.stdout, NONCE) == {"answer": 42}
    stdout_text = proc.stdout.decode()
    assert 'ENVBISECT_RESULT {"ok": true}\n' in stdout_text
    for noise in ("python print noise", "c-level write", "child process noise"):
        assert noise not in stdout_text
        assert noise in proc.stderr.decode()


def test_the_far_side_exits_at_its_deadline() -> None:
    start = time.monotonic()
    proc = _run(_program("_time.sleep(60)\nemit({})\n", deadline_s=1.0))
    assert proc.returncode == channel.EXIT_DEADLINE
    assert b"deadline of 1s reached" in proc.stderr
    assert find_frame(proc.stdout, NONCE) is None
    assert time.monotonic() - start < 50


def test_at_its_deadline_the_agent_takes_the_workers_it_started_along(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    program = _program(
        "import subprocess as _sp\n"
        "_w = _sp.Popen(['sleep', '300'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(_w.pid))\n"
        "_time.sleep(60)\n",
        deadline_s=1.0,
    )
    # Transport.run starts the agent in a new session, so it leads its process group. (The
    # _run() calls above share pytest's group: there the agent must and does leave it alone.)
    result = Transport().run([sys.executable, "-"], stdin=program, timeout_s=60, log_dir=tmp_path)
    assert result.returncode == channel.EXIT_DEADLINE
    worker = int(pid_file.read_text())
    end = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_the_far_side_exits_when_its_stdout_breaks(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    proc = subprocess.Popen(
        [sys.executable, "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(
        _program(
            f"open({str(pid_file)!r}, 'w').write(str(_os.getpid()))\n_time.sleep(60)\n",
            heartbeat_s=0.2,
        )
    )
    proc.stdin.close()
    end = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < end
        time.sleep(0.05)
    proc.stdout.close()  # what a dying ssh or container layer does to the far side
    assert proc.wait(timeout=20) == channel.EXIT_BROKEN_PIPE


# ---- bundles --------------------------------------------------------------------------------


def test_a_bundle_needs_nothing_installed_in_the_target(tmp_path: Path) -> None:
    bundle = build_bundle("envbisect.agent.echo", {"a": [1, "two"], "q": "'$(x)'"})
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-"],  # isolated, no site-packages: envbisect is absent
        input=bundle.source,
        capture_output=True,
        check=False,
        cwd=tmp_path,
    )
    payload = find_frame(proc.stdout, bundle.nonce)
    assert payload is not None, proc.stderr
    assert payload["params"] == {"a": [1, "two"], "q": "'$(x)'"}
    assert payload["cwd"] == str(tmp_path)


def test_two_bundles_never_share_a_nonce() -> None:
    assert (
        build_bundle("envbisect.agent.echo", {}).nonce
        != build_bundle("envbisect.agent.echo", {}).nonce
    )


def test_an_agent_exception_comes_back_as_a_transport_error(tmp_path: Path) -> None:
    # The channel module has no main(): the bundle must report that, not hang or lose it.
    with pytest.raises(TransportError) as info:
        Transport().run_agent(
            sys.executable, "envbisect.agent.channel", {}, timeout_s=30, log_dir=tmp_path
        )
    assert "AttributeError" in str(info.value)
    assert "agent envbisect.agent.channel failed" in str(info.value)


def test_an_agent_that_cannot_import_in_the_target_reports_why(tmp_path: Path) -> None:
    # envbisect.transport.process is not self-contained: in the target, its imports must fail, and
    # the failure must come back framed rather than as a lost traceback.
    with pytest.raises(TransportError) as info:
        Transport().run_agent(
            sys.executable, "envbisect.transport.process", {}, timeout_s=30, log_dir=tmp_path
        )
    assert "ModuleNotFoundError" in str(info.value)
    assert "envbisect.model" in str(info.value)


def test_an_unknown_agent_module_is_a_transport_error() -> None:
    with pytest.raises(TransportError, match="not found"):
        build_bundle("envbisect.agent.no_such_agent", {})


def test_shipped_code_is_python_38_syntax() -> None:
    bundle = build_bundle("envbisect.agent.echo", {"x": 1})
    ast.parse(bundle.source, feature_version=(3, 8))
    ast.parse(Path(channel.__file__).read_text(), feature_version=(3, 8))


OLD_PYTHONS = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))


@pytest.mark.skipif(not OLD_PYTHONS, reason="no Python 3.8 interpreter on this machine")
def test_a_python_38_target_runs_the_bundle_through_a_chain(tmp_path: Path) -> None:
    result = Transport.from_specs(["sh -c", "env"]).run_agent(
        OLD_PYTHONS[0], "envbisect.agent.echo", {"k": "v"}, timeout_s=60, log_dir=tmp_path
    )
    assert result["version"][:2] == [3, 8]
    assert result["params"] == {"k": "v"}
    assert json.loads(json.dumps(result)) == result
