"""Transport layers: parsing a ``--via`` value into a checked :class:`Layer`, and quoting.

How layers are written, inferred and fixed up is described in :mod:`envbisect.transport`.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from envbisect.model.errors import TransportError

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
