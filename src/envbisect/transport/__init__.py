"""Every subprocess envbisect starts goes through here.

A Transport is a chain of layers (outermost first) in front of a target command. A layer is
an argv prefix plus a kind: an ``argv`` layer (pct, docker exec, kubectl exec, srun, sudo,
env, any custom prefix) puts its words in front of the command; a ``shell`` layer (ssh,
``sh -c``, ``bash -lc``, ``su -c``) takes the rest of the command as **one** quoted string,
because that is what those tools hand to a shell on the far side. Composition folds from the
innermost layer outwards and the result is run with no local shell, so no word is ever
quoted by hand.

``parse_layer`` turns one ``--via`` value into a Layer: it is split with ``shlex.split`` (never
by a shell), its kind is inferred from the first word (``argv:`` / ``shell:`` override it),
and known tools are checked and fixed up before anything runs:

- ssh gets ``-T -o BatchMode=yes``; ``-t``/``-n``/``-N``/``-f`` and words after the
  destination are errors (a tty mangles bytes, ``-n`` eats the program on stdin);
- docker/podman/kubectl exec get ``-i`` and must not have ``-t``;
- pct exec / kubectl exec / lxc-attach end with ``--`` (added when absent; words after it are
  an error, as are words after the VMID/pod, which would be ambiguous);
- srun gets ``-n1`` (another task count would run the program several times);
- ``lxc exec`` / ``incus exec`` end with ``--`` like pct; ``sudo -i``/``-s`` are refused
  (sudo re-joins the words for a shell and leaves ``$`` unescaped);
- ``sh -c`` / ``bash -lc`` / ``su -c`` must end with their ``-c`` option.

Quoting for shell layers is POSIX single-quoting, stricter than ``shlex.quote`` (a bare
``=word`` is quoted too, since zsh expands it), so the far shell may be sh, dash, bash, ksh or
zsh (not csh or fish). Tests replace ``Transport`` or point layers at faithful fakes on PATH.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

from envbisect.model.errors import TransportError
from envbisect.transport.bundle import Bundle, build_bundle, find_frame

# Linux refuses a single exec argument longer than this (MAX_ARG_STRLEN, 32 pages, incl. NUL).
MAX_ARG_BYTES = 131072 - 1

# Words made only of these need no quotes in any POSIX-family shell. '=' may not lead (zsh
# expands '=cmd' to a path) and, in the first word, not appear at all (an assignment).
_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+:,./-][A-Za-z0-9_@%+=:,./-]*")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "yash"})
# An option cluster that contains -c, e.g. -c, -lc, -ec (bash/sh/su: the command follows it).
_DASH_C = re.compile(r"-[A-Za-z]*c[A-Za-z]*")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


class LayerKind(str, Enum):
    """How a layer passes the inner command on."""

    ARGV = "argv"  # inner words follow the prefix as separate arguments
    SHELL = "shell"  # inner words are joined into one shell-quoted string


def shell_quote(word: str) -> str:
    """``word`` quoted for any POSIX-family shell (sh, dash, bash, ksh, zsh)."""
    if _SAFE_WORD.fullmatch(word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


def shell_join(argv: Sequence[str]) -> str:
    """The words of ``argv`` as one command line that a POSIX-family shell splits back."""
    words = [shell_quote(w) for w in argv]
    if words and "=" in words[0] and not words[0].startswith("'"):
        words[0] = "'" + words[0] + "'"
    return " ".join(words)


@dataclass(frozen=True)
class Layer:
    """One hop of a chain: an argv prefix; a ``shell`` layer takes the rest as one string."""

    argv: tuple[str, ...]
    kind: LayerKind = LayerKind.ARGV

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "kind", LayerKind(self.kind))

    @classmethod
    def parse(cls, text: str) -> Layer:
        """Same as :func:`parse_layer`."""
        return parse_layer(text)

    @property
    def tool(self) -> str:
        """The basename of the layer's program (``ssh`` for ``/usr/bin/ssh``)."""
        return os.path.basename(self.argv[0]) if self.argv else ""

    def wrap(self, inner: Sequence[str]) -> list[str]:
        if self.kind is LayerKind.SHELL:
            return [*self.argv, shell_join(inner)]
        return [*self.argv, *inner]

    def describe(self) -> str:
        return shell_join(self.argv)

    def as_dict(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "kind": self.kind.value}


def parse_layer(text: str) -> Layer:
    """One ``--via`` value as a validated, fixed-up Layer; TransportError if it cannot work."""
    body = text.strip()
    forced: LayerKind | None = None
    for kind in LayerKind:
        if body.startswith(kind.value + ":"):
            forced, body = kind, body[len(kind.value) + 1 :]
            break
    try:
        words = shlex.split(body)
    except ValueError as exc:
        raise _bad(text, f"cannot split it into words ({exc})") from None
    if not words:
        raise _bad(text, "the layer is empty")
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0], re.DOTALL):
        raise _bad(
            text,
            f"layers run without a shell, so {words[0]!r} is not an assignment; "
            "write 'env NAME=value' instead",
        )
    tool = os.path.basename(words[0])
    shell = _non_posix_shell(words)
    if shell is not None and forced is not LayerKind.ARGV:
        raise _bad(
            text,
            f"{shell} is not a POSIX-family shell: envbisect quotes the command for sh, dash, "
            f"bash, ksh and zsh, and {shell} would read those quotes differently; use "
            "'sh -c' or 'bash -lc' in its place",
        )
    if tool == "ssh":
        if forced is LayerKind.ARGV:
            raise _bad(
                text,
                "ssh hands its command to the remote login shell, so it is always "
                "a shell layer; drop 'argv:'",
            )
        return _fix_ssh(words, text)
    if forced is not None:
        return Layer(tuple(words), forced)
    fixer = _FIXERS.get(tool)
    if fixer is not None:
        return fixer(words, text)
    if _ends_in_shell_c(words[1:]):
        # e.g. 'sudo -u bob bash -lc': the last program is a shell that takes one string.
        return Layer(tuple(words), LayerKind.SHELL)
    return Layer(tuple(words), LayerKind.ARGV)


_NON_POSIX_SHELLS = frozenset({"csh", "tcsh", "fish"})


def _non_posix_shell(words: Sequence[str]) -> str | None:
    """csh/tcsh/fish when the layer is (or ends in) one of them: the program itself, or the
    last program before trailing options such as ``-c`` (``sudo -u bob fish -c``)."""
    if os.path.basename(words[0]) in _NON_POSIX_SHELLS:
        return os.path.basename(words[0])
    for word in reversed(words[1:]):
        if word.startswith("-"):
            continue
        name = os.path.basename(word)
        return name if name in _NON_POSIX_SHELLS and _DASH_C.fullmatch(words[-1]) else None
    return None


def _bad(text: str, why: str) -> TransportError:
    return TransportError(f"--via {text.strip()!r}: {why}")


def _check_dashdash_last(words: Sequence[str], at: int, text: str) -> None:
    """A layer's ``--`` (at ``words[at]``) must end it: words after it would be a command."""
    if at + 1 < len(words):
        raise _bad(
            text,
            f"words after '--' ({shell_join(words[at + 1 :])}) would be a "
            "command; give it its own --via",
        )


def _tty_error(text: str, tool: str, option: str) -> TransportError:
    return _bad(
        text,
        f"{tool} exec must not get {option}: a tty mangles the program on stdin; envbisect adds -i",
    )


def _ends_in_shell_c(words: Sequence[str]) -> bool:
    if not words or not _DASH_C.fullmatch(words[-1]):
        return False
    return any(os.path.basename(w) in _SHELLS or os.path.basename(w) == "su" for w in words[:-1])


# ---- ssh -------------------------------------------------------------------------------

_SSH_FLAGS = frozenset("46AaCfGgKkMNnqsTtVvXxYy")
_SSH_WITH_VALUE = frozenset("BbcDEeFIiJLlmOoPpQRSWw")
# Options that cannot work for a program sent on stdin, and why (checked before anything else).
_SSH_REFUSED = {
    "W": "ssh -W forwards a port and runs no remote command; drop it",
    "t": "ssh must not get -t: a tty mangles the program on stdin and the result; "
    "envbisect adds -T",
    "n": "ssh must not get -n: it would cut off the program that envbisect sends on stdin",
    **{c: f"ssh -{c} runs no remote command; drop it" for c in "Nfs"},
}


def _fix_ssh(words: list[str], text: str) -> Layer:
    opts = words[1:]
    given: set[str] = set()  # "T" and/or "BatchMode", when the layer already has them
    dest_at = _ssh_destination_at(opts, text, given)
    if dest_at is None:
        raise _bad(text, "ssh names no destination (e.g. 'ssh root@10.1.2.6')")
    if dest_at + 1 < len(opts):
        rest = shell_join(opts[dest_at + 1 :])
        raise _bad(
            text,
            f"words after the ssh destination ({rest}) would be a remote command; "
            "give each hop its own --via, e.g. --via 'ssh host' --via 'pct exec 200 --'",
        )
    added = ([] if "T" in given else ["-T"]) + (
        [] if "BatchMode" in given else ["-o", "BatchMode=yes"]
    )
    return Layer((words[0], *added, *opts), LayerKind.SHELL)


def _next_value(words: Sequence[str], i: int, tool: str, option: str, text: str) -> str:
    """The word after ``words[i]``: the value of ``option``, which is missing at the end."""
    if i + 1 >= len(words):
        raise _bad(text, f"{tool} option {option} needs a value")
    return words[i + 1]


def _ssh_destination_at(opts: list[str], text: str, given: set[str]) -> int | None:
    """Index of the destination in ``opts`` after checking every option before it."""
    i = 0
    while i < len(opts):
        word = opts[i]
        if word == "--":
            return i + 1 if i + 1 < len(opts) else None
        if not (word.startswith("-") and len(word) > 1):
            return i
        i += _ssh_option_cluster(opts, i, text, given)
    return None


def _ssh_option_cluster(opts: list[str], i: int, text: str, given: set[str]) -> int:
    """Check one option word (``-TAo BatchMode=yes``); returns how many words it took."""
    word = opts[i]
    for j, c in enumerate(word[1:], 1):
        if c in _SSH_REFUSED:
            raise _bad(text, _SSH_REFUSED[c])
        if c in _SSH_WITH_VALUE:
            value = word[j + 1 :]
            taken = 1 if value else 2
            value = value or _next_value(opts, i, "ssh", f"-{c}", text)
            if c == "o" and _ssh_config_option(value, text) == "batchmode":
                given.add("BatchMode")
            return taken
        if c not in _SSH_FLAGS:
            raise _bad(text, f"unknown ssh option -{c}")
        if c == "T":
            given.add("T")
    return 1


def _ssh_config_option(value: str, text: str) -> str:
    """The key of an ``-o Key=value``, lower-cased; a tty request is refused."""
    key, _, val = value.replace("=", " ", 1).partition(" ")
    if key.lower() == "requesttty" and val.strip().lower() in ("yes", "force"):
        raise _bad(
            text,
            "ssh must not request a tty (RequestTTY): a tty "
            "mangles the program on stdin and the result",
        )
    return key.lower()


# ---- container and scheduler layers -----------------------------------------------------


def _fix_pct(words: list[str], text: str) -> Layer:
    if len(words) < 2 or words[1] != "exec":
        sub = words[1] if len(words) > 1 else "nothing"
        raise _bad(text, f"a pct layer must be 'pct exec VMID --' (got {sub!r} after pct)")
    if len(words) < 3 or not words[2].isdigit():
        raise _bad(text, "pct exec needs a numeric VMID, e.g. 'pct exec 200 --'")
    rest = words[3:]
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--":
            _check_dashdash_last(rest, i, text)
            return Layer(tuple(words), LayerKind.ARGV)
        if word == "--keep-env":
            i += 2
            continue
        if word.startswith("--keep-env="):
            i += 1
            continue
        if word.startswith("-"):
            raise _bad(text, f"unknown pct exec option {word!r}")
        raise _bad(
            text,
            f"{word!r} after the VMID is ambiguous (command or argument?); end "
            "the layer with '--' and give the command its own --via",
        )
    return Layer((*words, "--"), LayerKind.ARGV)


_KUBECTL_VALUE = _words(
    "-n --namespace -c --container --context --kubeconfig --cluster --user -f --filename "
    "--pod-running-timeout -s --server --request-timeout --token --as --as-group --cache-dir "
    "--certificate-authority --client-certificate --client-key --tls-server-name -v --v "
    "--username --password"
)


def _fix_kubectl(words: list[str], text: str) -> Layer:
    out, positional_at, has_i = _scan_kubectl(words, text)
    positional = [out[k] for k in positional_at]
    if not positional or positional[0] != "exec":
        raise _bad(text, "a kubectl layer must be 'kubectl exec -i POD --'")
    if len(positional) < 2:
        raise _bad(text, "kubectl exec names no pod, e.g. 'kubectl exec -i trainer-0 --'")
    if len(positional) > 2:
        raise _bad(
            text,
            f"{positional[2]!r} after the pod is ambiguous (command or "
            "argument?); end the layer with '--' and give the command its own --via",
        )
    if not has_i:
        out.insert(positional_at[0] + 1, "-i")
    out.append("--")  # a given '--' was left out of `out`: it always goes last
    return Layer(tuple(out), LayerKind.ARGV)


def _scan_kubectl(words: list[str], text: str) -> tuple[list[str], list[int], bool]:
    """The layer's words without a final ``--``, where its positional words are in them,
    and whether it asks for stdin (``-i``/``--stdin``)."""
    out = [words[0]]
    positional_at: list[int] = []
    stdin: list[bool] = []

    def take(i: int) -> int:
        word = words[i]
        if word.startswith("-") and len(word) > 1:
            taken, is_stdin = _kubectl_option(words, i, text)
            out.extend(words[i : i + taken])
            stdin.append(is_stdin)
            return taken
        positional_at.append(len(out))
        out.append(word)
        return 1

    _walk_to_dashdash(words, text, take)
    return out, positional_at, any(stdin)


def _walk_to_dashdash(words: list[str], text: str, take: Callable[[int], int]) -> None:
    """Hand each word after the program to ``take(i)`` (which returns how many words it
    took: an option's value is skipped) up to a ``--``, which must end the layer."""
    i = 1
    while i < len(words):
        if words[i] == "--":
            _check_dashdash_last(words, i, text)
            return
        i += take(i)


def _kubectl_option(words: list[str], i: int, text: str) -> tuple[int, bool]:
    """Check the option at ``words[i]``: how many words it takes, whether it is stdin."""
    word = words[i]
    if word.startswith("--"):
        name, eq, value = word.partition("=")
        on = value.lower() not in ("false", "0")
        if name == "--tty" and on:
            raise _tty_error(text, "kubectl", "--tty")
        takes_value = name in _KUBECTL_VALUE and not eq
        if takes_value:
            _next_value(words, i, "kubectl", name, text)
        return 1 + takes_value, name == "--stdin" and on
    if word[:2] in _KUBECTL_VALUE:
        if len(word) == 2:
            _next_value(words, i, "kubectl", word, text)
            return 2, False
        return 1, False
    for c in word[1:]:  # a cluster of flags: only -i and -q are known
        if c == "t":
            raise _tty_error(text, "kubectl", "-t")
        if c not in "iq":
            raise _bad(text, f"unknown kubectl option -{c} in {word!r}")
    return 1, "i" in word[1:]


_DOCKER_EXEC_VALUE = _words("-e --env --env-file -u --user -w --workdir --detach-keys")
_DOCKER_GLOBAL_VALUE = _words("-H --host -c --context --config -l --log-level")


def _fix_container_exec(words: list[str], text: str) -> Layer:
    tool = os.path.basename(words[0])
    i = 1
    while i < len(words) and words[i].startswith("-"):
        name, eq, _ = words[i].partition("=")
        i += 2 if name in _DOCKER_GLOBAL_VALUE and not eq else 1
    if i >= len(words) or words[i] != "exec":
        raise _bad(text, f"a {tool} layer must be '{tool} exec -i CONTAINER'")
    sub_at = i
    container_at, has_i = _container_at(words, sub_at + 1, tool, text)
    if container_at is None:
        raise _bad(text, f"{tool} exec names no container, e.g. '{tool} exec -i trainer'")
    if container_at + 1 < len(words):
        raise _bad(
            text,
            f"words after the container ({shell_join(words[container_at + 1 :])}) would be a "
            "command; give it its own --via",
        )
    out = list(words)
    if not has_i:
        out.insert(sub_at + 1, "-i")
    return Layer(tuple(out), LayerKind.ARGV)


def _container_at(words: list[str], i: int, tool: str, text: str) -> tuple[int | None, bool]:
    """Index of the container after exec's options (from ``words[i]``), and whether they
    include ``-i``/``--interactive``."""
    has_i = False
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            taken, interactive = _container_long_option(word, tool, text)
        elif word.startswith("-") and len(word) > 1:
            taken, interactive = _container_short_options(word, tool, text)
        else:
            return i, has_i
        has_i = has_i or interactive
        i += taken
    return None, has_i


def _container_long_option(word: str, tool: str, text: str) -> tuple[int, bool]:
    """Check one ``--name[=value]``: how many words it takes, whether it is --interactive."""
    name, eq, value = word.partition("=")
    on = value.lower() not in ("false", "0")
    if name == "--tty" and on:
        raise _tty_error(text, tool, "--tty")
    if name == "--detach" and on:
        raise _bad(text, f"{tool} exec must not get --detach: the result would be lost")
    return 1 + (name in _DOCKER_EXEC_VALUE and not eq), name == "--interactive" and on


def _container_short_options(word: str, tool: str, text: str) -> tuple[int, bool]:
    """Check one ``-flags`` cluster: how many words it takes, whether it holds -i."""
    has_i = False
    for j, c in enumerate(word[1:], 1):
        if c == "t":
            raise _tty_error(text, tool, "-t")
        if c == "d":
            raise _bad(text, f"{tool} exec must not get -d: the result would be lost")
        if c == "i":
            has_i = True
        elif c in "euw":  # takes a value: the rest of the word, or the next word
            return 1 + (j == len(word) - 1), has_i
        elif c != "P":  # --privileged
            raise _bad(text, f"unknown {tool} exec option -{c} in {word!r}")
    return 1, has_i


_SRUN_SHORT_VALUE = frozenset("ABCDGJLMNSTWbcdeimnopqrtwx")
_SRUN_LONG_VALUE = _words(
    "--account --begin --constraint --cpus-per-task --chdir --dependency --error --gres "
    "--gpus --gpus-per-node --gpus-per-task --input --job-name --licenses --cluster "
    "--distribution --mem --mem-per-cpu --mem-per-gpu --nodes --ntasks --ntasks-per-node "
    "--output --partition --qos --relative --time --nodelist --exclude --export --mpi "
    "--reservation --cpu-bind --container --time-min --nice --network --signal --wckey "
    "--comment --jobid --het-group --gpu-bind --cpus-per-gpu --tmp --mail-type --mail-user "
    "--gres-flags --hint --threads --kill-on-bad-exit --switches --cores-per-socket "
    "--sockets-per-node --threads-per-core --extra-node-info --profile --prolog --epilog "
    "--task-prolog --task-epilog --ntasks-per-core --ntasks-per-socket --ntasks-per-gpu "
    "--mincpus --open-mode --propagate --uid --gid --wait"
)


def _fix_srun(words: list[str], text: str) -> Layer:
    ntasks = _srun_ntasks(words, text)
    if ntasks is None:
        return Layer((words[0], "-n1", *words[1:]), LayerKind.ARGV)
    if ntasks.strip() != "1":
        raise _bad(
            text,
            f"srun must run one task (-n1), not {ntasks}: more would run the program several times",
        )
    return Layer(tuple(words), LayerKind.ARGV)


def _srun_ntasks(words: list[str], text: str) -> str | None:
    """The task count the layer's options ask for (the last one given), None if none."""
    given: list[str] = []

    def take(i: int) -> int:
        word = words[i]
        if not (word.startswith("-") and len(word) > 1):
            raise _bad(
                text,
                f"{word!r} is not an srun option, so it would be the command; "
                "give the command its own --via",
            )
        taken, ntasks = _srun_option(words, i, text)
        if ntasks is not None:
            given.append(ntasks)
        return taken

    _walk_to_dashdash(words, text, take)
    return given[-1] if given else None


def _srun_option(words: list[str], i: int, text: str) -> tuple[int, str | None]:
    """Check the option at ``words[i]``: how many words it takes, and the task count when
    it is ``-n``/``--ntasks``."""
    word = words[i]
    if word.startswith("--"):
        name, eq, value = word.partition("=")
        if name == "--pty":
            raise _bad(text, "srun must not get --pty: a tty mangles the program on stdin")
        taken = 1
        if name in _SRUN_LONG_VALUE and not eq:
            value, taken = _next_value(words, i, "srun", name, text), 2
        return taken, value if name == "--ntasks" else None
    for j, c in enumerate(word[1:], 1):
        if c in _SRUN_SHORT_VALUE:
            value, taken = word[j + 1 :], 1
            if not value:
                value, taken = _next_value(words, i, "srun", f"-{c}", text), 2
            return taken, value if c == "n" else None
    return 1, None


def _fix_lxc_attach(words: list[str], text: str) -> Layer:
    if "--" in words:
        _check_dashdash_last(words, words.index("--"), text)
        return Layer(tuple(words), LayerKind.ARGV)
    return Layer((*words, "--"), LayerKind.ARGV)


def _fix_lxd_exec(words: list[str], text: str) -> Layer:
    tool = os.path.basename(words[0])
    if len(words) < 3 or words[1] != "exec":
        raise _bad(text, f"a {tool} layer must be '{tool} exec INSTANCE --'")
    return _fix_lxc_attach(words, text)


_SUDO_WITH_VALUE = frozenset("CDghprtuUTR")


def _fix_sudo(words: list[str], text: str) -> Layer:
    i = 1
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        word = {"--login": "-i", "--shell": "-s"}.get(words[i], words[i])
        if not word.startswith("--"):
            for j, c in enumerate(word[1:], 1):
                if c in "is":
                    raise _bad(
                        text,
                        f"sudo -{c} re-joins the command for a shell and leaves '$' unescaped, "
                        "so arguments would be expanded; use 'sudo -u USER' and, for a login "
                        "shell, add 'bash -lc' as its own --via",
                    )
                if c in _SUDO_WITH_VALUE:
                    i += j == len(word) - 1  # the value is the next word
                    break
        i += 1
    kind = LayerKind.SHELL if _ends_in_shell_c(words[1:]) else LayerKind.ARGV
    return Layer(tuple(words), kind)


def _fix_posix_shell(words: list[str], text: str) -> Layer:
    tool = os.path.basename(words[0])
    if len(words) >= 2 and _DASH_C.fullmatch(words[-1]):
        return Layer(tuple(words), LayerKind.SHELL)
    if any(_DASH_C.fullmatch(w) for w in words[1:]):
        raise _bad(text, f"{tool}'s -c must be the last word of the layer (the command follows it)")
    raise _bad(
        text,
        f"a {tool} layer needs -c as its last option (e.g. '{tool} -c' or "
        "'bash -lc'); prefix the layer with 'argv:' if you really mean a script path",
    )


def _fix_su(words: list[str], text: str) -> Layer:
    if words[-1] in ("--command", "--session-command") or _DASH_C.fullmatch(words[-1]):
        return Layer(tuple(words), LayerKind.SHELL)
    raise _bad(
        text,
        "a su layer must end with -c (e.g. 'su - bob -c'): su runs the command "
        "given to -c with the user's shell",
    )


_FIXERS: dict[str, Callable[[list[str], str], Layer]] = {
    "pct": _fix_pct,
    "kubectl": _fix_kubectl,
    "docker": _fix_container_exec,
    "podman": _fix_container_exec,
    "nerdctl": _fix_container_exec,
    "srun": _fix_srun,
    "lxc-attach": _fix_lxc_attach,
    "lxc": _fix_lxd_exec,
    "incus": _fix_lxd_exec,
    "sudo": _fix_sudo,
    "su": _fix_su,
    **{name: _fix_posix_shell for name in _SHELLS},
}


def _private_log(path: Path) -> IO[bytes]:
    """A run's output file, readable by its owner only (a smoke command's output may hold
    what the user's own training prints: tokens, paths); never written through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "wb")


@dataclass(frozen=True)
class ProcessResult:
    """What one process run returned; stdout/stderr are kept in full under ``log_dir``.

    ``killed``: the processes it left behind that had to be ended (``pid command``), also
    listed in ``<name>.killed`` next to the logs.
    """

    argv: tuple[str, ...]
    returncode: int
    timed_out: bool
    elapsed_s: float
    stdout_path: Path
    stderr_path: Path
    killed: tuple[str, ...] = ()

    def stdout(self) -> bytes:
        return self.stdout_path.read_bytes()

    def stderr_tail(self, lines: int = 20) -> str:
        data = self.stderr_path.read_bytes()[-65536:]
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


@dataclass(frozen=True)
class Transport:
    """A layer chain, outermost first. The empty chain runs locally."""

    layers: tuple[Layer, ...] = field(default_factory=tuple)

    @classmethod
    def from_specs(cls, via: Sequence[str]) -> Transport:
        """A chain from ``--via`` values (outermost first), each checked by :func:`parse_layer`."""
        if isinstance(via, str):
            raise TypeError("from_specs takes a sequence of layer strings, not one string")
        return cls(tuple(parse_layer(text) for text in via))

    def with_env(self, env: Mapping[str, str]) -> Transport:
        """This chain plus an innermost ``env NAME=value ...`` layer, so the variables reach
        the far process (``run(env=...)`` only sets the environment of the first hop)."""
        if not env:
            return self
        bad = [name for name in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
        if bad:
            raise TransportError(f"environment variable name {bad[0]!r} cannot be passed on")
        words = ("env", *(f"{name}={value}" for name, value in sorted(env.items())))
        return Transport((*self.layers, Layer(words, LayerKind.ARGV)))

    def compose(self, argv: Sequence[str]) -> list[str]:
        """Fold from the innermost layer outwards; the result runs with no local shell."""
        out = list(argv)
        for layer in reversed(self.layers):
            out = layer.wrap(out)
        return out

    def command_line(self, argv: Sequence[str]) -> str:
        """The composed command as one line, safe to paste into bash or zsh."""
        return shell_join(self.compose(argv))

    def describe(self) -> str:
        return " → ".join(layer.describe() for layer in self.layers) or "local"

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        timeout_s: float | None = None,
        log_dir: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        name: str = "run",
    ) -> ProcessResult:
        """Run the composed argv; kill its whole process group at the timeout.

        ``env`` and ``cwd`` apply to the first, local process only; through layers use
        :meth:`with_env` (and absolute paths). Raises TransportError before starting anything
        when an argument is longer than Linux allows.
        """
        full = self.compose(argv)
        self._check_fits(full)
        log_dir.mkdir(parents=True, exist_ok=True)
        out_path = log_dir / f"{name}.stdout"
        err_path = log_dir / f"{name}.stderr"
        start = time.monotonic()
        tag = secrets.token_hex(8)
        run_env = dict(os.environ if env is None else env)
        run_env[RUN_TAG_ENV] = tag  # inherited by everything the run starts: found after it
        _become_subreaper()
        _in_flight(+1)
        with _private_log(out_path) as out, _private_log(err_path) as err:
            proc = self._start(full, out, err, run_env, cwd)
            timed_out, killed = _wait_and_end_leftovers(
                proc, stdin, timeout_s, tag, log_dir / f"{name}.killed"
            )
        return ProcessResult(
            argv=tuple(full),
            returncode=proc.returncode,
            timed_out=timed_out,
            elapsed_s=time.monotonic() - start,
            stdout_path=out_path,
            stderr_path=err_path,
            killed=tuple(killed),
        )

    def _start(
        self,
        full: list[str],
        out: IO[bytes],
        err: IO[bytes],
        env: dict[str, str],
        cwd: Path | None,
    ) -> subprocess.Popen[bytes]:
        """Start ``full`` in a session of its own; a start that fails ends the in-flight count."""
        try:
            return subprocess.Popen(
                full,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            _in_flight(-1)
            raise TransportError(
                f"cannot start {full[0]!r} (via {self.describe()}): {exc.strerror}"
            ) from None

    def run_agent(
        self,
        python: str,
        module: str,
        params: dict[str, Any],
        *,
        timeout_s: float,
        log_dir: Path,
        env: dict[str, str] | None = None,
        name: str = "agent",
    ) -> dict[str, Any]:
        """Ship ``module`` to ``python -`` through the chain and return its framed result."""
        bundle: Bundle = build_bundle(module, params, deadline_s=timeout_s)
        result = self.run(
            [python, "-"],
            stdin=bundle.source,
            timeout_s=timeout_s + 5,
            log_dir=log_dir,
            env=env,
            name=name,
        )
        payload = find_frame(result.stdout(), bundle.nonce)
        if payload is None:
            why = "timed out" if result.timed_out else f"exit code {result.returncode}"
            if result.returncode == 255 and self.layers and self.layers[0].tool == "ssh":
                why += " (ssh itself failed)"
            tail = result.stderr_tail(5).replace("\n", " | ")
            raise TransportError(
                f"no result from {python} via {self.describe()}: {why}; "
                f"stderr tail: {tail or '(empty)'}; full log: {result.stderr_path}"
            )
        if "__agent_error__" in payload:
            raise TransportError(
                f"agent {module} failed in {python} via {self.describe()}: "
                f"{payload['__agent_error__']}; full log: {result.stderr_path}"
            )
        return payload

    def _check_fits(self, full: Sequence[str]) -> None:
        longest = max(full, key=lambda w: len(os.fsencode(w)), default="")
        size = len(os.fsencode(longest))
        if size > MAX_ARG_BYTES:
            raise TransportError(
                f"the command composed via {self.describe()} has an argument of {size} bytes; "
                f"Linux allows {MAX_ARG_BYTES} per argument (shell layers quote the whole "
                "inner command into one): pass large data on stdin or in a file"
            )


def _wait_and_end_leftovers(
    proc: subprocess.Popen[bytes],
    stdin: bytes,
    timeout_s: float | None,
    tag: str,
    killed_path: Path,
) -> tuple[bool, list[str]]:
    """Feed and wait for ``proc`` (killing its group at the timeout or on any exception),
    then end what it left behind, listed in ``killed_path``; whether it timed out, and the
    ``pid command`` of each process ended."""
    with _LIVE_LOCK:
        _LIVE[proc.pid] = proc
    first = _proc_stat(proc.pid)
    with _ACTIVE_LOCK:
        _ACTIVE[proc.pid] = tag
    killed: list[str] = []
    try:
        timed_out = not _feed_and_wait(proc, stdin, timeout_s)
        if timed_out:
            _kill_group(proc)
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.pop(proc.pid, None)
        killed = _end_leftovers(proc.pid, tag, first.start if first else None)
        _in_flight(-1, proc.pid)
        if killed:
            with contextlib.suppress(OSError):
                killed_path.write_text("".join(f"{line}\n" for line in killed), encoding="utf-8")
    return timed_out, killed


def _feed_and_wait(proc: subprocess.Popen[bytes], data: bytes, timeout_s: float | None) -> bool:
    """Feed stdin and wait for the exit; False when ``timeout_s`` passed first.

    Both happen in threads: the write must not block past the timeout (a hop that hangs
    before reading must not hold a large program's write forever; a reader that went away
    is ignored), and a blocking ``waitpid`` returns the moment the child exits, where
    ``Popen.wait(timeout=...)`` polls with sleeps of up to 50 ms.
    """

    def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            proc.stdin.write(data)
        with contextlib.suppress(OSError):
            proc.stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    waiter = threading.Thread(target=proc.wait, daemon=True)
    feeder.start()
    waiter.start()
    waiter.join(timeout_s)
    return not waiter.is_alive()


# Processes started by Transport.run that have not been reaped yet (several at once when the
# trials of one round run in threads): kill_running() ends them all, e.g. on Ctrl-C.
_LIVE: dict[int, subprocess.Popen[bytes]] = {}
_LIVE_LOCK = threading.Lock()


def kill_running() -> int:
    """Kill the process group of every program Transport.run is waiting for (in any thread);
    returns how many. The waiting calls then return as killed."""
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return len(procs)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# ---- what a run leaves behind ----------------------------------------------------------------
#
# A command that exits normally may leave children running (``sleep 30 &``), and a ``setsid``
# child leaves the process group that the timeout kills. After every run, everything it
# started is ended: its process group, every process that still carries the run's tag in its
# environment (set in the run's env and inherited unless a child clears it), and — with this
# process a child subreaper on Linux (``PR_SET_CHILD_SUBREAPER``), so orphans are re-parented
# to envbisect instead of init — any re-parented orphan in another session, when no other run
# is in flight that it could belong to. Through a layer chain this covers the local hop
# (ssh, docker exec, ...); what a far side leaves is that side's own. An ssh ControlPersist
# master is the one thing left running: it exists to outlive the call that started it.

RUN_TAG_ENV = "ENVBISECT_RUN_TAG"
_PR_SET_CHILD_SUBREAPER = 36
_SUBREAPER: bool | None = None
_ACTIVE: dict[int, str] = {}  # pid of a run's first process -> its tag, while it runs
_IN_FLIGHT = 0  # runs between their start and their cleanup (counted before the fork)
_ACTIVE_LOCK = threading.Lock()


def _in_flight(delta: int, pid: int | None = None) -> None:
    global _IN_FLIGHT
    with _ACTIVE_LOCK:
        _IN_FLIGHT += delta
        if pid is not None:
            _ACTIVE.pop(pid, None)


def _become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux; once)."""
    global _SUBREAPER
    if _SUBREAPER is None:
        _SUBREAPER = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _SUBREAPER = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                _SUBREAPER = False
    return _SUBREAPER


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start: int  # clock ticks after boot


def _proc_stat(pid: int) -> _Proc | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return _Proc(
            pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode(), int(fields[19])
        )
    except (IndexError, ValueError):
        return None


def _has_tag(pid: int, tag: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{RUN_TAG_ENV}={tag}".encode() in environ.split(b"\0")


def _cmdline(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode("utf-8", "replace") for w in words if w)
    return text[:200] or "?"


def _leftovers(pgid: int, tag: str, since: int | None) -> list[_Proc]:
    """Processes of the run started as ``pgid`` (and tagged ``tag``) that still exist.

    An untagged orphan (its environment cleared) counts only when it was re-parented to this
    process, sits in another session, started after the run did (``since``) and no other run
    is in flight that it could belong to.
    """
    me, my_sid, uid = os.getpid(), os.getsid(0), os.getuid()
    with _ACTIVE_LOCK:
        others = {pid for pid in _ACTIVE if pid != pgid}
        alone = _IN_FLIGHT <= 1
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me or pid in others:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        st = _proc_stat(pid)
        if st is None:
            continue
        orphan = (
            _SUBREAPER
            and alone
            and st.ppid == me
            and st.sid != my_sid
            and since is not None
            and st.start >= since
        )
        if (st.pgid == pgid or orphan or _has_tag(pid, tag)) and not _shared_helper(pid):
            found.append(st)
    return found


def _shared_helper(pid: int) -> bool:
    """An ssh ControlPersist master ("ssh: <socket> [mux]"): started by one call on purpose
    to serve the next ones (README: per-call overhead ~0.3 s → ~0.03 s), so it is left be."""
    cmd = _cmdline(pid)
    return cmd.startswith("ssh: ") and cmd.endswith("[mux]")


def _end_leftovers(pgid: int, tag: str, since: int | None) -> list[str]:
    """End (SIGKILL) and reap whatever the run left; returns ``pid command`` per process."""
    if not sys.platform.startswith("linux"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        return []
    killed: list[str] = []
    seen: set[int] = set()
    for _ in range(5):  # a child may fork while its parent is being ended: look again
        procs = _leftovers(pgid, tag, since)
        alive = [p for p in procs if p.state != "Z" and p.pid not in seen]
        for p in alive:
            killed.append(f"{p.pid} {_cmdline(p.pid)}")
            seen.add(p.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _reap(p.pid for p in procs if p.ppid == os.getpid())
        if not alive:
            break
    return killed


def _reap(pids: Iterable[int]) -> None:
    """Collect the exit status of re-parented orphans (only those: never a Popen's child)."""
    for pid in pids:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.005)
