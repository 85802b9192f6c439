"""Layer chains through a real sshd on 127.0.0.1 (see helpers_ssh.sshd_server)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_ssh import (
    CANARY,
    CANARY_DIR,
    NOISY_LAYER,
    PRINT_ARGV,
    SshServer,
    argv_strategy,
    fake,
    hex_words,
    print_argv_result,
    sshd_server,  # noqa: F401 - a pytest fixture, used by name
    target_path,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from envbisect.model.errors import TransportError
from envbisect.transport import MAX_ARG_BYTES, Transport
from envbisect.transport.bundle import build_bundle
from envbisect.transport.reply import find_frame

pytestmark = pytest.mark.ssh

OTHER_LAYERS = [
    "sh -c",
    "bash -lc",
    f"{fake('pct')} exec 200 --",
    f"{fake('docker')} exec trainer",
    f"{fake('kubectl')} exec trainer-0",
    f"{fake('srun')} -p gpu",
    "env",
    *(["zsh -c"] if shutil.which("zsh") else []),  # stands in for a zsh login shell
]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), words=argv_strategy())
def test_random_chains_with_ssh_round_trip_argv_byte_identical(
    sshd_server: SshServer,  # noqa: F811 - the fixture imported above
    data: st.DataObject,
    words: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    others = data.draw(st.lists(st.sampled_from(OTHER_LAYERS), max_size=3), label="others")
    ssh_count = data.draw(st.integers(1, 2 if len(others) < 3 else 1), label="ssh hops")
    via = list(others)
    for _ in range(ssh_count):
        via.insert(data.draw(st.integers(0, len(via))), sshd_server.via)
    event(f"{len(via)} layers, {ssh_count} ssh")
    CANARY_DIR.mkdir(parents=True, exist_ok=True)
    transport = Transport.from_specs(via)
    argv = [sys.executable, str(PRINT_ARGV), *words]
    log_dir = tmp_path_factory.mktemp("ssh-chain")
    if max(len(os.fsencode(w)) for w in transport.compose(argv)) > MAX_ARG_BYTES:
        with pytest.raises(TransportError, match="per argument"):
            transport.run(argv, log_dir=log_dir, timeout_s=60)
        return
    result = transport.run(argv, log_dir=log_dir, timeout_s=60)
    assert print_argv_result(result.stdout()) == hex_words(words), (
        via,
        result.returncode,
        result.stderr_tail(),
    )
    assert result.returncode == 0
    assert not CANARY.exists(), f"canary fired via {via}"


def test_agent_through_ssh_and_fake_pct(sshd_server: SshServer, tmp_path: Path) -> None:  # noqa: F811
    transport = Transport.from_specs([sshd_server.via, "pct exec 200 --"])
    params = {"q": 'it\'s "$(touch PWNED)" `x` ; \n\r\t ü 😀', "big": "z" * 200_000}
    result = transport.run_agent(
        sys.executable, "envbisect.agent.echo", params, timeout_s=60, log_dir=tmp_path
    )
    assert result["params"] == params
    assert result["python"] == sys.executable
    assert not (Path.home() / "PWNED").exists()


def test_ssh_failure_is_reported_as_ssh_itself_failing(
    sshd_server: SshServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    via = sshd_server.via.replace(f"-p {sshd_server.port}", "-p 1")
    with pytest.raises(TransportError) as info:
        Transport.from_specs([via]).run_agent(
            sys.executable, "envbisect.agent.echo", {}, timeout_s=30, log_dir=tmp_path
        )
    message = str(info.value)
    assert "exit code 255 (ssh itself failed)" in message
    assert "Connection refused" in message
    assert str(tmp_path / "agent.stderr") in message


def _remote_sleeper(pid_file: Path, deadline_s: float | None) -> tuple[bytes, str]:
    """A program for ``python -`` that opens the real channel, records its pid and sleeps."""
    from envbisect.agent import channel

    nonce = "feedfacefeedface"
    source = Path(channel.__file__).read_text()
    program = (
        source
        + "\nimport os as _os, time as _time\n"
        + f"open_channel({nonce!r}, {deadline_s!r}, heartbeat_s=0.5)\n"
        + "import subprocess as _sp\n"
        + "_worker = _sp.Popen(['sleep', '300'])\n"
        + f"open({str(pid_file)!r}, 'w').write('%d %d' % (_os.getpid(), _worker.pid))\n"
        + "_time.sleep(120)\n"
        + "emit({'slept': True})\n"
    )
    return program.encode(), nonce


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _wait_for(path: Path, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def test_killing_the_ssh_client_ends_the_far_python(
    sshd_server: SshServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "far.pid"
    program, _ = _remote_sleeper(pid_file, deadline_s=None)  # only the heartbeat can end it
    argv = Transport.from_specs([sshd_server.via, "pct exec 200 --"]).compose([sys.executable, "-"])
    client = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert client.stdin is not None
    client.stdin.write(program)
    client.stdin.close()
    _wait_for(pid_file, 30)
    far, worker = (int(p) for p in pid_file.read_text().split())
    assert far != client.pid and _alive(far) and _alive(worker)
    client.send_signal(signal.SIGKILL)
    client.wait()
    end = time.monotonic() + 10
    while (_alive(far) or _alive(worker)) and time.monotonic() < end:
        time.sleep(0.1)
    left = [pid for pid in (far, worker) if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the far python or its worker outlived the ssh client"


def test_far_agent_exits_at_its_own_deadline(
    sshd_server: SshServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "far.pid"
    program, nonce = _remote_sleeper(pid_file, deadline_s=1.0)
    result = Transport.from_specs([sshd_server.via]).run(
        [sys.executable, "-"], stdin=program, timeout_s=60, log_dir=tmp_path
    )
    assert not result.timed_out
    assert result.returncode == 124
    assert "deadline of 1s reached" in result.stderr_path.read_text()
    assert find_frame(result.stdout(), nonce) is None
    far, worker = (int(p) for p in pid_file.read_text().split())
    assert not _alive(far)
    end = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < end:
        time.sleep(0.1)
    assert not _alive(worker)


def test_print_command_line_runs_through_ssh_when_pasted_into_bash(
    sshd_server: SshServer,  # noqa: F811
) -> None:
    transport = Transport.from_specs([sshd_server.via, "pct exec 200", "bash -lc"])
    line = transport.command_line([sys.executable, "-"])
    bundle = build_bundle("envbisect.agent.echo", {"x": "$(y) 'z'"})
    proc = subprocess.run(
        ["bash", "-c", line],
        input=bundle.source,
        capture_output=True,
        check=False,
        env={**os.environ, "PATH": target_path()},
        timeout=60,
    )
    payload = find_frame(proc.stdout, bundle.nonce)
    assert payload is not None, proc.stderr[-2000:]
    assert payload["params"] == {"x": "$(y) 'z'"}


# Fields that differ between two snapshots of one state by nature: when and where they were
# taken, and caches that other processes on this machine may write in between.
_VOLATILE_META = ("created", "elapsed_s", "agent_elapsed_s", "host", "target")
_VOLATILE_CACHE = ("digest", "files", "bytes", "subdirs", "mtime", "newest_mtime")


def _comparable(sections: dict[str, object]) -> dict[str, object]:
    out = dict(sections)
    meta = dict(out["meta"])  # type: ignore[call-overload]
    for key in _VOLATILE_META:
        meta.pop(key, None)
    out["meta"] = meta
    caches = {}
    for name, facts in dict(out.get("caches") or {}).items():  # type: ignore[call-overload]
        caches[name] = {k: v for k, v in facts.items() if k not in _VOLATILE_CACHE}
    out["caches"] = caches
    return out


def test_snapshot_through_ssh_and_fake_pct_equals_a_local_snapshot(
    sshd_server: SshServer,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from envbisect.model.config import Config
    from envbisect.snapshot import take_snapshot

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "train.py").write_text("print('train')\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
        check=True,
    )
    (repo / "train.py").write_text("print('patched')\n")  # dirty
    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"i": {i}}}\n' for i in range(100)))
    cache = tmp_path / "cache"
    (cache / "sub").mkdir(parents=True)
    (cache / "sub" / "kernel.bin").write_bytes(b"\0" * 1000)
    config = Config.from_mapping(
        {
            "repos": [str(repo)],
            "files": [str(repo / "*.py")],
            "data": [str(data)],
            "caches": {"mine": str(cache)},
            "env": ["ENVBISECT_TRANSPORT_PROBE"],
            "probes": ["json.dumps"],
        },
        tmp_path / "envbisect.yaml",
    )
    # The far side's recorded environment is what sshd gives a session; make the local one
    # the same so that only transport-volatile fields may differ.
    monkeypatch.setenv("PATH", target_path())
    monkeypatch.setenv("HOME", str(sshd_server.home))
    monkeypatch.setenv("UV_CACHE_DIR", sshd_server.uv_cache)
    for name in list(os.environ):
        if name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH") or name.startswith(
            ("NVIDIA_", "CUBLAS_", "CUDNN_", "NVSHMEM_")
        ):
            monkeypatch.delenv(name)
    local = take_snapshot(config, Transport(), sys.executable, log_dir=tmp_path / "l")
    remote_transport = Transport.from_specs([sshd_server.via, "pct exec 200 --"])
    remote = take_snapshot(config, remote_transport, sys.executable, log_dir=tmp_path / "r")
    assert remote.sections["meta"]["target"]["via"] == [
        layer.describe() for layer in remote_transport.layers
    ]
    assert remote.sections["git"][str(repo)]["dirty"] is True
    assert remote.sections["data"][str(data)]["records"] == 100
    assert _comparable(remote.sections) == _comparable(local.sections)


def test_snapshot_survives_a_10_mb_flood_before_the_agent(
    sshd_server: SshServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    from envbisect.model.config import Config
    from envbisect.snapshot import take_snapshot

    config = Config.from_mapping({}, tmp_path / "envbisect.yaml")
    quiet = Transport.from_specs([sshd_server.via])
    noisy = Transport.from_specs([sshd_server.via, f"{NOISY_LAYER} {10 * 1024 * 1024} --"])
    a = take_snapshot(config, quiet, sys.executable, log_dir=tmp_path / "a")
    b = take_snapshot(config, noisy, sys.executable, log_dir=tmp_path / "b", timeout_s=120)
    assert _comparable(b.sections) == _comparable(a.sections)
    assert (tmp_path / "b" / "snapshot.stdout").stat().st_size > 10 * 1024 * 1024


def test_with_env_reaches_the_far_process(sshd_server: SshServer, tmp_path: Path) -> None:  # noqa: F811
    transport = Transport.from_specs([sshd_server.via, "pct exec 200 --"]).with_env(
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "ODD": "it's $(x)\n"}
    )
    program = (
        b"import os, sys\n"
        b"sys.stdout.write(repr((os.environ.get('PYTORCH_CUDA_ALLOC_CONF'), "
        b"os.environ.get('ODD'))))\n"
    )
    result = transport.run([sys.executable, "-"], stdin=program, log_dir=tmp_path, timeout_s=60)
    assert result.stdout().decode() == repr(("expandable_segments:True", "it's $(x)\n"))
    with pytest.raises(TransportError, match="cannot be passed on"):
        Transport().with_env({"A-B": "1"})
    assert Transport().with_env({}) == Transport()
