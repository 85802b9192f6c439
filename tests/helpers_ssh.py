"""A real sshd on 127.0.0.1 for transport tests, plus the paths of the faithful fakes.

``sshd_server`` (session scope) starts Debian's ``/usr/sbin/sshd -D -e -f <cfg>`` on a free
port with its own host key and authorized key, as the current user (no root needed for a
normal user; as root, sshd insists on its privilege-separation dir /run/sshd, which the
fixture creates when missing -- the package's service would). ``SshServer.via`` is a
``--via`` string carrying every client option, so nothing in ~/.ssh is read or written.
Tests that need it skip with a reason when sshd is not installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import atexit
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")
FAKES = Path(__file__).resolve().parent / "fakes" / "bin"
PRINT_ARGV = FAKES / "print-argv"
NOISY_LAYER = FAKES / "noisy-layer"


def fake(name: str) -> str:
    """Absolute path of a fake tool (pct, docker, kubectl, srun)."""
    return str(FAKES / name)


def target_path() -> str:
    """PATH for targets: the fakes first, then this venv's python3, then the system."""
    return os.pathsep.join([str(FAKES), str(Path(sys.executable).parent), "/usr/bin", "/bin"])


@dataclass(frozen=True)
class SshServer:
    """A running test sshd and the client options that reach it."""

    port: int
    user: str
    key: Path
    known_hosts: Path
    log: Path
    pid: int
    home: Path  # the HOME sessions through this sshd get
    uv_cache: str  # the UV_CACHE_DIR they get: this machine's

    @property
    def options(self) -> list[str]:
        return [
            "-F",
            "/dev/null",
            "-p",
            str(self.port),
            "-i",
            str(self.key),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "LogLevel=ERROR",
        ]

    @property
    def via(self) -> str:
        """``ssh -F /dev/null -p PORT -i KEY -o ... user@127.0.0.1`` as one --via value."""
        return shlex.join(["ssh", *self.options, f"{self.user}@127.0.0.1"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "envbisect-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )


def _uv_cache() -> str:
    """The uv cache this machine's runs use (``uv cache dir``), for the target to share."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv:
        found = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, check=False)
        if found.returncode == 0 and found.stdout.strip():
            return found.stdout.strip()
    return os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv")


def start_sshd(workdir: Path) -> tuple[SshServer, subprocess.Popen[bytes]]:
    """Start sshd in ``workdir``; returns once it accepts a login."""
    if not SSHD.exists() or shutil.which("ssh") is None:
        pytest.skip("openssh-server/client not installed (/usr/sbin/sshd); .ci/run installs it")
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    host_key, client_key = workdir / "host_ed25519", workdir / "client_ed25519"
    _keygen(host_key)
    _keygen(client_key)
    authorized = workdir / "authorized_keys"
    authorized.write_bytes((client_key.with_suffix(".pub")).read_bytes())
    user = pwd.getpwuid(os.geteuid()).pw_name
    home, uv_cache = workdir / "home", _uv_cache()
    home.mkdir(exist_ok=True)
    port = _free_port()
    config = workdir / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {workdir / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                f"AllowUsers {user}",
                "StrictModes no",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password",
                "MaxStartups 64",
                # PATH: the fakes and this venv's python3 on the far side too. SHLVL=1 makes
                # bash skip ~/.bashrc for ssh commands (it sources it only at level 1), so a
                # developer's shell setup neither slows every hop nor is needed by any test.
                # HOME: the target's own, in the test's tmp dir, so the remote sessions that
                # runs through this sshd make (~/.envbisect/session-*) go with the tmp dir and
                # never pile up in the real home; uv keeps the real cache (no downloads).
                f"SetEnv PATH={target_path()} SHLVL=1 HOME={home} UV_CACHE_DIR={uv_cache}",
                "",
            ]
        )
    )
    log = workdir / "sshd.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    known_hosts = workdir / "known_hosts"
    host_pub = host_key.with_suffix(".pub").read_text().split()
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    server = SshServer(
        port=port,
        user=user,
        key=client_key,
        known_hosts=known_hosts,
        log=log,
        pid=proc.pid,
        home=home,
        uv_cache=uv_cache,
    )
    deadline = time.monotonic() + 15
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text()[-2000:]}")
        probe = subprocess.run(
            ["ssh", "-T", "-o", "BatchMode=yes", *server.options, f"{user}@127.0.0.1", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return server, proc
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(
                f"test sshd on port {port} refused logins: {probe.stderr.decode()[-500:]} "
                f"sshd log: {log.read_text()[-1000:]}"
            )
        time.sleep(0.1)


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A real sshd on 127.0.0.1 for the whole session."""
    server, proc = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- round-trip property material (shared by test_transport and test_transport_ssh) ----

CANARY_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / f"envbisect-canary-{os.getpid()}"
CANARY = CANARY_DIR / "PWNED"
# Made now, so that a mis-quoted `touch` anywhere (a real shell test too) leaves a trace.
CANARY_DIR.mkdir(exist_ok=True)
atexit.register(shutil.rmtree, CANARY_DIR, True)

# Pieces that a shell anywhere in the chain would act on if a word were mis-quoted.
ADVERSARIAL = [
    "'",
    '"',
    "\\",
    "\\'",
    "'\\''",
    "$(",
    ")",
    "`",
    "$HOME",
    "${HOME}",
    "$1",
    "$@",
    "*",
    "?",
    "[a-z]",
    "~",
    "~root",
    ";",
    "&&",
    "||",
    "|",
    ">",
    "<",
    "&",
    "\n",
    "\r",
    "\t",
    " ",
    "  ",
    "--",
    "-n",
    "-c",
    "-",
    "=",
    "=ls",
    "#",
    "!",
    "!!",
    "%",
    "{a,b}",
    "ü",
    "€",
    "😀",
    "\u200b",
    "\x7f",
    "\x1b[31m",
    f"$(touch {CANARY})",
    f"`touch {CANARY}`",
    f";touch {CANARY};",
]


def print_argv_result(stdout: bytes) -> list[str] | None:
    """The hex words print-argv framed on ``stdout``, or None when it did not run."""
    import json
    import re

    match = re.search(rb"<<ARGV>>(.*?)<<END>>", stdout)
    return None if match is None else json.loads(match.group(1))


def hex_words(argv: list[str]) -> list[str]:
    return [os.fsencode(a).hex() for a in argv]


def _strategies():  # type: ignore[no-untyped-def]  # hypothesis is imported only by tests
    from hypothesis import strategies as st

    piece = st.one_of(
        st.sampled_from(ADVERSARIAL),
        st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
            min_size=1,
            max_size=4,
        ),
    )
    word = st.lists(piece, max_size=6).map("".join)

    @st.composite
    def argv(draw: st.DrawFn) -> list[str]:
        words = draw(st.lists(word, max_size=6))
        if draw(st.integers(0, 4)) == 0:  # now and then one 100 KB word with pieces inside
            head, mid, tail = draw(word), draw(word), draw(word)
            big = head + "a" * 50_000 + mid + "b" * 50_000 + tail
            words.insert(draw(st.integers(0, len(words))), big)
        return words

    return argv()


def argv_strategy():  # type: ignore[no-untyped-def]  # a SearchStrategy[list[str]]
    """Random argv from the adversarial alphabet, sometimes with one 100 KB word."""
    return _strategies()
