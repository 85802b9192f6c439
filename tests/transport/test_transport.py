"""Layer parsing, composition and local runs of envbisect.transport, through real shells and
the faithful fakes in tests/fakes/bin (the ssh side is in test_transport_ssh.py)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers_ssh import (
    CANARY,
    CANARY_DIR,
    NOISY_LAYER,
    PRINT_ARGV,
    argv_strategy,
    fake,
    hex_words,
    print_argv_result,
    target_path,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from envbisect.commands.common import composed_command, resolve_target
from envbisect.model.errors import ConfigError, TransportError, UsageError
from envbisect.transport import (
    MAX_ARG_BYTES,
    Layer,
    LayerKind,
    Transport,
    parse_layer,
    shell_join,
)

# ---- parse_layer: kinds, fix-ups, refusals ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "argv"),
    [
        ("ssh root@10.1.2.6", "shell", "ssh -T -o BatchMode=yes root@10.1.2.6"),
        ("ssh -p 2222 -o BatchMode=no h", "shell", "ssh -T -p 2222 -o BatchMode=no h"),
        ("/usr/bin/ssh -T -J jump h", "shell", "/usr/bin/ssh -o BatchMode=yes -T -J jump h"),
        ("pct exec 200 --", "argv", "pct exec 200 --"),
        ("pct exec 200", "argv", "pct exec 200 --"),
        ("pct exec 200 --keep-env 0", "argv", "pct exec 200 --keep-env 0 --"),
        ("docker exec trainer", "argv", "docker exec -i trainer"),
        ("docker -H ssh://x exec -u 0 -e A=1 c", "argv", "docker -H ssh://x exec -i -u 0 -e A=1 c"),
        ("podman exec --interactive c", "argv", "podman exec --interactive c"),
        ("kubectl exec trainer-0", "argv", "kubectl exec -i trainer-0 --"),
        (
            "kubectl -n ml exec -i pod/t -c main --",
            "argv",
            "kubectl -n ml exec -i pod/t -c main --",
        ),
        ("srun --gres=gpu:1 --", "argv", "srun -n1 --gres=gpu:1 --"),
        ("srun -p gpu -n 1", "argv", "srun -p gpu -n 1"),
        ("srun --ntasks=1 -N1", "argv", "srun --ntasks=1 -N1"),
        ("lxc-attach -n box", "argv", "lxc-attach -n box --"),
        ("sh -c", "shell", "sh -c"),
        ("bash -lc", "shell", "bash -lc"),
        ("/bin/bash --norc -c", "shell", "/bin/bash --norc -c"),
        ("su - bob -c", "shell", "su - bob -c"),
        ("sudo -u bob bash -lc", "shell", "sudo -u bob bash -lc"),
        ("sudo -u bob", "argv", "sudo -u bob"),
        ("sudo -n -u bob -- bash -c", "shell", "sudo -n -u bob -- bash -c"),
        ("lxc exec box", "argv", "lxc exec box --"),
        ("incus exec box --", "argv", "incus exec box --"),
        ("env A=1 B='x y'", "argv", "env A=1 'B=x y'"),
        ("nice -n 5", "argv", "nice -n 5"),
        ("shell:mosh-like host", "shell", "mosh-like host"),
        ("argv:bash ./wrapper.sh", "argv", "bash ./wrapper.sh"),
        ("  argv:my-prefix --flag  ", "argv", "my-prefix --flag"),
    ],
)
def test_parse_layer_infers_kind_and_fixes_up(text: str, kind: str, argv: str) -> None:
    layer = parse_layer(text)
    assert layer.kind is LayerKind(kind)
    assert layer.describe() == shell_join(layer.argv)
    assert list(layer.argv) == shlex.split(argv)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("ssh -t host", "must not get -t"),
        ("ssh -tt host", "must not get -t"),
        ("ssh -At host", "must not get -t"),
        ("ssh -n host", "must not get -n"),
        ("ssh -o RequestTTY=force host", "RequestTTY"),
        ("ssh -N host", "runs no remote command"),
        ("ssh -W db:5432 host", "runs no remote command"),
        ("sudo -i", "unescaped"),
        ("sudo -u bob -s", "unescaped"),
        ("sudo --login", "unescaped"),
        ("lxc list", "must be 'lxc exec INSTANCE --'"),
        ("ssh host python3", "words after the ssh destination"),
        ("ssh -p", "needs a value"),
        ("ssh", "no destination"),
        ("argv:ssh host", "always a shell layer"),
        ("docker exec -it c", "must not get -t"),
        ("docker exec -d c", "must not get -d"),
        ("docker exec --tty c", "must not get --tty"),
        ("docker exec -i", "names no container"),
        ("docker exec -i c bash", "words after the container"),
        ("docker run -i img", "must be 'docker exec -i CONTAINER'"),
        ("kubectl exec -ti pod", "must not get -t"),
        ("kubectl exec -i pod python3", "ambiguous"),
        ("kubectl exec -i pod -- python3", "words after '--'"),
        ("kubectl get pods", "must be 'kubectl exec -i POD --'"),
        ("kubectl exec -i", "names no pod"),
        ("pct enter 200", "must be 'pct exec VMID --'"),
        ("pct exec abc --", "numeric VMID"),
        ("pct exec 200 bash", "ambiguous"),
        ("pct exec 200 -- bash", "words after '--'"),
        ("pct exec 200 -x --", "unknown pct exec option"),
        ("srun -n 4", "one task"),
        ("srun --ntasks=2", "one task"),
        ("srun --pty", "--pty"),
        ("srun -p gpu python3", "not an srun option"),
        ("lxc-attach -n box -- sh", "words after '--'"),
        ("bash", "needs -c"),
        ("sh -c -e", "must be the last word"),
        ("su bob", "must end with -c"),
        ("A=1 ssh host", "not an assignment"),
        ("ssh 'host", "cannot split"),
        ("   ", "empty"),
    ],
)
def test_parse_layer_refuses_wrong_layers_naming_them(text: str, fragment: str) -> None:
    with pytest.raises(TransportError) as info:
        parse_layer(text)
    message = str(info.value)
    assert fragment in message
    assert message.startswith("--via ")
    assert "\n" not in message


def test_layer_kind_accepts_plain_strings_and_layer_parse_is_parse_layer() -> None:
    assert Layer(("sh", "-c"), "shell").kind is LayerKind.SHELL
    assert Layer(["env"]).argv == ("env",)
    assert Layer.parse("pct exec 7 --") == parse_layer("pct exec 7 --")
    assert Layer(("sh", "-c"), "shell").as_dict() == {"argv": ["sh", "-c"], "kind": "shell"}


def test_from_specs_builds_outermost_first_and_rejects_a_bare_string() -> None:
    t = Transport.from_specs(["ssh root@10.1.2.6", "pct exec 200 --"])
    assert [layer.tool for layer in t.layers] == ["ssh", "pct"]
    assert t.compose(["/root/venv/bin/python3", "-"]) == [
        "ssh",
        "-T",
        "-o",
        "BatchMode=yes",
        "root@10.1.2.6",
        "pct exec 200 -- /root/venv/bin/python3 -",
    ]
    assert t.describe() == "ssh -T -o BatchMode=yes root@10.1.2.6 → pct exec 200 --"
    assert Transport.from_specs([]).describe() == "local"
    with pytest.raises(TypeError):
        Transport.from_specs("ssh host")


def test_a_bad_layer_is_refused_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(TransportError, match="must not get -t"):
        Transport.from_specs([f"argv:touch {marker}", "ssh -t host"])
    assert not marker.exists()


# ---- quoting: every POSIX-family shell on this machine splits shell_join back -------------

SHELLS = [s for s in ("sh", "dash", "bash", "zsh", "ksh", "mksh") if shutil.which(s)]


@pytest.mark.parametrize("shell", SHELLS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=argv_strategy())
def test_shell_join_round_trips_through_real_shells(shell: str, words: list[str]) -> None:
    line = shell_join([sys.executable, str(PRINT_ARGV), *words])
    proc = subprocess.run([shell, "-c", line], capture_output=True, check=False)
    assert print_argv_result(proc.stdout) == hex_words(words), proc.stderr[-2000:]
    assert not CANARY.exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_words_that_zsh_or_bash_would_expand_come_through_unchanged(shell: str) -> None:
    words = ["=ls", "=python3", "a=b", "~", "~root", "!!", "{a,b}", "*", "$((1+1))", "^x", "#"]
    line = shell_join([sys.executable, str(PRINT_ARGV), *words])
    proc = subprocess.run([shell, "-c", line], capture_output=True, check=False)
    assert print_argv_result(proc.stdout) == hex_words(words), proc.stderr


def test_shell_join_quotes_zsh_equals_and_leading_assignments() -> None:
    assert shell_join(["=ls", "a=b", "plain", ""]) == "'=ls' a=b plain ''"
    assert shell_join(["A=1", "x"]) == "'A=1' x"
    assert shell_join(["it's"]) == "'it'\\''s'"


# ---- the property: random chains of real shells and fakes round-trip byte-identical ------


def _local_layers() -> list[str]:
    layers = [
        "sh -c",
        "bash -lc",
        f"{fake('pct')} exec 200 --",
        f"{fake('docker')} exec trainer",
        f"{fake('kubectl')} exec -n ml trainer-0",
        f"{fake('srun')} --gres=gpu:1 --",
        "env",
        "env LC_ALL=C.UTF-8",
    ]
    if os.geteuid() == 0:  # su -c asks root for no password
        layers.append("su -c")
    if shutil.which("zsh"):  # the shell of the field failure (`zsh: unmatched '`)
        layers.append("zsh -c")
    return layers


def _run_chain(via: list[str], words: list[str], log_dir: Path) -> None:
    transport = Transport.from_specs(via)
    argv = [sys.executable, str(PRINT_ARGV), *words]
    full = transport.compose(argv)
    too_long = max(len(os.fsencode(w)) for w in full) > MAX_ARG_BYTES
    env = {**os.environ, "PATH": target_path()}
    event(f"{len(via)} layers, " + ("refused: too long" if too_long else "ran"))
    if too_long:
        with pytest.raises(TransportError, match="per argument"):
            transport.run(argv, log_dir=log_dir, env=env, timeout_s=60)
        return
    result = transport.run(argv, log_dir=log_dir, env=env, timeout_s=60)
    got = print_argv_result(result.stdout())
    assert got == hex_words(words), (via, result.returncode, result.stderr_tail())
    assert result.returncode == 0
    assert not CANARY.exists(), f"canary fired via {via}"


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    via=st.lists(st.sampled_from(_local_layers()), min_size=1, max_size=4),
    words=argv_strategy(),
)
def test_random_chains_round_trip_argv_byte_identical(
    via: list[str], words: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    CANARY_DIR.mkdir(parents=True, exist_ok=True)
    _run_chain(via, words, tmp_path_factory.mktemp("chain"))


def test_fakes_are_found_on_path_like_the_real_tools(tmp_path: Path) -> None:
    transport = Transport.from_specs(
        ["pct exec 200", "docker exec c", "kubectl exec p", "srun", "sh -c"]
    )
    words = ["-c", "x", "--", "$(touch PWNED)"]
    result = transport.run(
        [sys.executable, str(PRINT_ARGV), *words],
        log_dir=tmp_path,
        env={**os.environ, "PATH": target_path()},
        cwd=tmp_path,
    )
    assert print_argv_result(result.stdout()) == hex_words(words), result.stderr_tail()
    assert not (tmp_path / "PWNED").exists()


# ---- the fakes behave like the real tools where the fix-ups matter ------------------------


def _raw(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        argv,
        input=b"stdin-data",
        capture_output=True,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PATH": target_path(), **env},
    )


def test_without_the_fixups_the_fakes_break_like_the_real_tools(tmp_path: Path) -> None:
    cat = [sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"]
    # kubectl without '--' takes the program's -c as its own --container flag.
    eaten = _raw([fake("kubectl"), "exec", "-i", "pod", *cat], tmp_path)
    assert "stdin-data" not in eaten.stdout.decode()
    # docker and kubectl without -i give the command no stdin.
    assert _raw([fake("docker"), "exec", "c", *cat], tmp_path).stdout.strip() == b"''"
    assert _raw([fake("kubectl"), "exec", "pod", "--", *cat], tmp_path).stdout.strip() == b"''"
    # docker -t without a terminal fails the way docker does.
    tty = _raw([fake("docker"), "exec", "-it", "c", *cat], tmp_path)
    assert tty.returncode == 1 and b"not a TTY" in tty.stderr
    # pct parses option-looking words before '--' as its own.
    assert b"Unknown option" in _raw([fake("pct"), "exec", "200", *cat], tmp_path).stderr
    # srun inside an allocation of 2 tasks runs the program twice unless pinned to -n1.
    twice = _raw([fake("srun"), *cat], tmp_path, SLURM_NTASKS="2")
    assert twice.stdout.count(b"\n") == 2
    layer = parse_layer("srun")
    once = _raw([*layer.argv, *cat], tmp_path, SLURM_NTASKS="2")
    assert once.stdout == b"'stdin-data'\n"
    # With the fix-ups, every fake passes stdin and argv through untouched.
    for via in ("kubectl exec pod", "docker exec c", "pct exec 200"):
        fixed = _raw([*parse_layer(via).argv, *cat], tmp_path)
        assert fixed.stdout == b"'stdin-data'\n", (via, fixed.stderr)


# ---- agents through chains: noise, failures, limits, timeouts ----------------------------


def test_agent_result_survives_a_10_mb_flood_with_fake_frames(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    # Noise from inside the target too: a sitecustomize that writes to fd 1 at start-up and
    # keeps printing from a thread after the channel is open.
    (site / "sitecustomize.py").write_text(
        "import os, sys, threading, time\n"
        "os.write(1, b'<<ENVBISECT 0000000000000000 BEGIN>>\\ne30=\\n"
        '<<ENVBISECT 0000000000000000 END>>\\n{"params": {}}\\n\' * 1000)\n'
        "def spam():\n"
        "    for _ in range(50):\n"
        "        print('{\"pid\": -1}'); sys.stdout.flush(); time.sleep(0.001)\n"
        "threading.Thread(target=spam, daemon=True).start()\n"
    )
    transport = Transport.from_specs(
        [f"{NOISY_LAYER} {10 * 1024 * 1024} --", "sh -c", f"env PYTHONPATH={site}"]
    )
    params = {"weird": "it's $(touch PWNED) `x` \n ü", "n": 3}
    result = transport.run_agent(
        sys.executable, "envbisect.agent.echo", params, timeout_s=60, log_dir=tmp_path / "log"
    )
    assert result["params"] == params
    assert result["python"] == sys.executable
    stdout = (tmp_path / "log" / "agent.stdout").read_bytes()
    assert len(stdout) > 10 * 1024 * 1024  # kept in full, not tailed


def test_no_frame_is_a_transport_error_with_chain_exit_code_and_log(tmp_path: Path) -> None:
    transport = Transport.from_specs(["sh -c", "env"])
    with pytest.raises(TransportError) as info:
        transport.run_agent(
            "/nonexistent/python3", "envbisect.agent.echo", {}, timeout_s=30, log_dir=tmp_path
        )
    message = str(info.value)
    assert "via sh -c → env" in message
    assert "exit code 127" in message
    assert "No such file or directory" in message
    assert str(tmp_path / "agent.stderr") in message
    assert "\n" not in message


def test_a_command_too_long_for_one_argument_is_refused_before_running(tmp_path: Path) -> None:
    transport = Transport.from_specs(["sh -c"])
    marker = tmp_path / "ran"
    with pytest.raises(TransportError, match="per argument"):
        transport.run(["touch", str(marker), "'" * 40_000], log_dir=tmp_path)
    assert not marker.exists()


def test_timeout_kills_the_whole_local_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pid_file}; wait"
    start = time.monotonic()
    result = Transport.from_specs(["sh -c"]).run(
        ["sh", "-c", script], timeout_s=1, log_dir=tmp_path
    )
    assert result.timed_out
    assert result.returncode == -signal.SIGKILL
    child = int(pid_file.read_text())
    assert _gone(child, within_s=5)
    assert time.monotonic() - start < 60


def _gone(pid: int, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _leaver(tmp_path: Path) -> str:
    """A command that exits normally and leaves three children behind: one in the background
    of its process group, one that called setsid, one that also cleared its environment."""
    d = tmp_path
    return (
        f"sleep 300 & echo $! > {d}/bg.pid; "
        f"setsid sh -c 'echo $$ > {d}/sid.pid; exec sleep 301' & "
        f"env -i /bin/sh -c 'setsid /bin/sh -c \"echo \\$\\$ > {d}/bare.pid; exec sleep 302\" &' ; "
        f"for f in bg sid bare; do while [ ! -s {d}/$f.pid ]; do :; done; done; "
        'echo ENVBISECT_RESULT \'{"ok": true, "tok_per_s": 1.0}\''
    )


def test_a_run_that_exits_normally_leaves_no_process_behind(tmp_path: Path) -> None:
    result = Transport().run(["sh", "-c", _leaver(tmp_path)], timeout_s=60, log_dir=tmp_path)
    assert result.returncode == 0 and not result.timed_out
    pids = {name: int((tmp_path / f"{name}.pid").read_text()) for name in ("bg", "sid", "bare")}
    for name, pid in pids.items():
        assert _gone(pid, within_s=5), f"the {name} child {pid} is still running"
    killed = {int(line.split()[0]): line for line in result.killed}
    assert set(pids.values()) <= set(killed)
    assert "sleep 301" in killed[pids["sid"]] and "sleep 302" in killed[pids["bare"]]
    assert (tmp_path / "run.killed").read_text().splitlines() == list(result.killed)


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl sets a process title like ssh")
def test_an_ssh_control_master_is_left_to_serve_the_next_call(tmp_path: Path) -> None:
    # ssh -o ControlPersist daemonizes a master (daemon(): a new session) titled
    # "ssh: <socket> [mux]" (setproctitle); perl's $0 rewrites the title the same way.
    title = f"ssh: {tmp_path}/eb-sock [mux]"
    script = (
        f"setsid perl -e '$0 = q{{{title}}}; sleep 300' & echo $! > {tmp_path}/mux.pid; "
        # As ssh's: titled before the call ends (perl's own argv also holds "mux": wait for
        # the title itself, which starts the cmdline).
        'until [ "$(head -c 4 /proc/$!/cmdline)" = ssh: ]; do :; done'
    )
    result = Transport().run(["sh", "-c", script], timeout_s=60, log_dir=tmp_path)
    pid = int((tmp_path / "mux.pid").read_text())
    try:
        assert not _gone(pid, within_s=0.5) and result.killed == ()
    finally:
        os.kill(pid, signal.SIGKILL)


def test_a_run_that_leaves_nothing_kills_nothing(tmp_path: Path) -> None:
    result = Transport().run(["sh", "-c", "echo hi"], timeout_s=60, log_dir=tmp_path)
    assert result.killed == () and not (tmp_path / "run.killed").exists()


def test_a_missing_first_program_is_a_transport_error(tmp_path: Path) -> None:
    with pytest.raises(TransportError, match="cannot start"):
        Transport.from_specs(["no-such-layer-tool --x"]).run(["true"], log_dir=tmp_path)


# ---- resolve_target and --print-command ---------------------------------------------------


def _config(tmp_path: Path, targets: dict[str, object]) -> object:
    from envbisect.model.config import Config

    return Config.from_mapping({"targets": targets}, tmp_path / "envbisect.yaml")


def test_resolve_target_from_via_and_defaults() -> None:
    transport, python = resolve_target(None, None, ("ssh h", "pct exec 200"), None)
    assert [layer.tool for layer in transport.layers] == ["ssh", "pct"]
    assert python == "python3"
    transport, python = resolve_target(None, "/v/bin/python", (), None)
    assert transport.layers == () and python == "/v/bin/python"


def test_resolve_target_from_config_targets(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        {"box": {"via": ["ssh root@10.1.2.6", "pct exec 200 --"], "python": "/root/v/bin/python3"}},
    )
    transport, python = resolve_target(config, None, (), "box")
    assert python == "/root/v/bin/python3"
    assert transport == Transport.from_specs(["ssh root@10.1.2.6", "pct exec 200 --"])
    assert resolve_target(config, "/other/python", (), "box")[1] == "/other/python"
    # A plain mapping works too (config objects built by hand in other tests).
    plain = type("C", (), {"targets": {"x": {"via": ["sh -c"]}}, "path": None})()
    assert resolve_target(plain, None, (), "x")[0].layers[0].kind is LayerKind.SHELL


def test_resolve_target_errors_name_the_file_and_the_target(tmp_path: Path) -> None:
    config = _config(tmp_path, {"box": {"via": ["ssh -t root@h"]}})
    with pytest.raises(UsageError, match="mutually exclusive"):
        resolve_target(config, None, ("sh -c",), "box")
    with pytest.raises(ConfigError) as info:
        resolve_target(config, None, (), "nope")
    assert str(tmp_path / "envbisect.yaml") in str(info.value)
    assert "'nope'" in str(info.value) and "box" in str(info.value)
    with pytest.raises(ConfigError, match=r"targets\.box\.via: --via 'ssh -t root@h'"):
        resolve_target(config, None, (), "box")
    with pytest.raises(ConfigError, match="none defined"):
        resolve_target(object(), None, (), "box")


@pytest.mark.parametrize("shell", SHELLS)
def test_print_command_output_pasted_into_a_shell_runs_the_agent(
    shell: str, tmp_path: Path
) -> None:
    from envbisect.transport.bundle import build_bundle
    from envbisect.transport.reply import find_frame

    transport = Transport.from_specs(["sh -c", f"{fake('pct')} exec 200", "env A='x y'"])
    line = composed_command(transport, sys.executable)
    bundle = build_bundle("envbisect.agent.echo", {"k": "$(v)"})
    proc = subprocess.run(
        [shell, "-c", line],
        input=bundle.source,
        capture_output=True,
        check=False,
        env={**os.environ, "PATH": target_path()},
    )
    payload = find_frame(proc.stdout, bundle.nonce)
    assert payload is not None, proc.stderr[-2000:]
    assert payload["params"] == {"k": "$(v)"}


# ---- the verbs: --via / --target / --print-command as a user types them -------------------


def _envbisect(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbisect", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env={**os.environ, "PATH": target_path(), **(env or {})},
        timeout=120,
    )


def test_a_wrong_via_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    proc = _envbisect(["snapshot", "--via", "ssh -t root@10.1.2.6"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("envbisect: error: --via 'ssh -t root@10.1.2.6': ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    both = _envbisect(["snapshot", "--via", "sh -c", "--target", "box"], tmp_path)
    assert both.returncode == 2 and "mutually exclusive" in both.stderr


def test_print_command_and_a_named_target_from_envbisect_yaml(tmp_path: Path) -> None:
    (tmp_path / "envbisect.yaml").write_text(
        "targets:\n"
        "  box:\n"
        "    via: ['sh -c', 'pct exec 200', \"env A='x y'\"]\n"
        f"    python: {sys.executable}\n"
    )
    printed = _envbisect(["snapshot", "--target", "box", "--print-command"], tmp_path)
    assert printed.returncode == 0, printed.stderr
    expected = Transport.from_specs(["sh -c", "pct exec 200", "env A='x y'"]).command_line(
        [sys.executable, "-"]
    )
    assert printed.stdout == expected + "\n"
    missing = _envbisect(["snapshot", "--target", "nope"], tmp_path)
    assert missing.returncode == 2
    assert str(tmp_path / "envbisect.yaml") in missing.stderr and "'nope'" in missing.stderr
    snap = _envbisect(["snapshot", "--target", "box", "-o", "-"], tmp_path)
    assert snap.returncode == 0, snap.stderr
    manifest = yaml.safe_load(snap.stdout)
    assert manifest["meta"]["target"]["via"][1] == "pct exec 200 --"
    assert manifest["python"]["executable"] == sys.executable


def test_the_timeout_holds_even_when_the_far_end_never_reads_stdin(tmp_path: Path) -> None:
    # A hung hop (ssh still connecting, a layer that ignores stdin) must not block the
    # write of a program larger than a pipe buffer past the timeout.
    result = Transport.from_specs(["sh -c"]).run(
        ["sleep", "300"], stdin=b"x" * (4 << 20), timeout_s=1, log_dir=tmp_path
    )
    assert result.timed_out
    assert result.elapsed_s < 60
