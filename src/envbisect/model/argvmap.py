"""How a user's command names the state's copy of every path it mentions.

A state moves bisected repos into worktrees and old datasets to where ``data_map`` says;
the user's command was typed against the live paths, from the directory they ran envbisect
in. :class:`PathMapper` rewrites it so that it runs the same program in every state:

- a word that names a path inside a moved tree — absolute, or relative to the directory the
  user ran from — names the state's copy; a relative word is left as typed when it already
  resolves there from the command's cwd (the cwd is mapped into the worktree when the user
  ran from inside the repo), else it becomes the absolute path of the copy;
- ``--opt=path`` maps its value; ``--opt path`` is two words, each mapped on its own;
- a shell's ``-c`` script maps each of its words that is a path (textually, so quoting,
  pipes and ``$VARS`` stay as written); ``sh script.sh`` is an ordinary word;
- ``PYTHONPATH`` entries map the same way, so ``python -m pkg.mod`` imports the state's
  package (through the cwd it does so already, the cwd being mapped);
- ``python -m repo.mod`` typed from the repo's parent (the cwd stays there, and a package
  cannot be renamed to the worktree's directory) runs as ``python -c FINDER repo.mod``:
  a few lines that put a finder first on ``sys.meta_path`` importing ``repo`` (each
  dotted prefix of the module that names a moved tree from the cwd) from the state's copy,
  then run the module as ``-m`` would (``runpy._run_module_as_main``: ``__main__``,
  ``sys.argv[0]`` the module's file, the cwd first on ``sys.path``);
- a bare ``python``/``python3``/``python3.12`` as the program is the state's interpreter,
  never whatever ``python`` comes first on PATH;
- on a target (no ``origin``: the command runs in the repo's worktree there), a relative
  word stays as typed unless the map moves the live path it names somewhere other than the
  worktree's copy (a ``data:`` file inside the repo): then it names that path.

A relative word that names nothing on disk (``0.1``, ``train``) is never touched: a word is
taken for a path only when it exists, or has a ``/`` and its parent exists. Pure functions
over strings plus those existence checks; no other I/O.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PYTHON_NAME = re.compile(r"python(\d+(\.\d+)*)?")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash"})
# Characters that end a word of a shell script (whitespace, quotes, operators, `=`).
_EDGE = r"""\s'"=;&|()<>`"""


@dataclass(frozen=True)
class PathMapper:
    """Rewrites paths into a state: ``path_map`` (live prefix → the state's copy, longest
    first), ``origin`` (where the user ran the command; None: map absolute paths only) and
    ``cwd`` (where the command runs in the state)."""

    path_map: tuple[tuple[str, str], ...] = ()
    origin: str | None = None
    cwd: str | None = None

    def mapped(self, path: str) -> str | None:
        """The state's copy of the absolute ``path``, or None when no prefix holds it."""
        for old, new in self.path_map:
            rest = _below(path, old)
            if rest is not None:
                return new + rest
        return None

    def path(self, word: str, *, must_exist: bool = True) -> str:
        """``word`` as the state must see it (unchanged when it is no path into the state)."""
        if not word or "\0" in word:
            return word
        if word.startswith("/"):
            return self.mapped(word) or self.mapped(posixpath.normpath(word)) or word
        if "://" in word:
            return word
        if self.origin is None:
            return self._relative_on_target(word)
        live = posixpath.normpath(posixpath.join(self.origin, word))
        if must_exist and not _looks_like_path(word, live):
            return word
        want = self.mapped(live) or live
        here = posixpath.normpath(posixpath.join(self.cwd or self.origin, word))
        return word if here == want else want

    def _relative_on_target(self, word: str) -> str:
        """A relative word of a command that runs on a target, in a worktree (``cwd``): as
        typed, unless the live path it names from the live repo is mapped elsewhere than
        the worktree's copy (a dataset inside the repo), then that path. Only the map is
        consulted: this machine's files say nothing about the target's."""
        live_cwd = self.live(self.cwd) if self.cwd is not None else None
        if self.cwd is None or live_cwd is None:
            return word
        want = self.mapped(posixpath.normpath(posixpath.join(live_cwd, word)))
        here = posixpath.normpath(posixpath.join(self.cwd, word))
        return word if want is None or want == here else want

    def live(self, copy: str) -> str | None:
        """The live path whose state's copy is ``copy`` (a worktree path back to its repo's),
        or None when no entry moved a tree there."""
        for old, new in self.path_map:
            rest = _below(copy, new) if old != new else None
            if rest is not None:
                return (old.rstrip("/") or "/") + rest
        return None

    def word(self, word: str) -> str:
        """One argv word: a path, or ``--opt=path``."""
        if word.startswith("-") and "=" in word:
            name, value = word.split("=", 1)
            new = self.path(value)
            return word if new == value else f"{name}={new}"
        return self.path(word)

    def script(self, text: str) -> str:
        """A shell script (``sh -c TEXT``) with every word that is a path mapped."""
        try:
            words = shlex.split(text, comments=False)
        except ValueError:
            return text  # unbalanced quotes: the shell will say so, in its own words
        for w in dict.fromkeys(words):
            new = self.word(w)
            if new == w:
                continue
            pattern = rf"(?<![^{_EDGE}]){re.escape(w)}(?![^{_EDGE}])"
            quoted = shlex.quote(new)
            text = re.sub(pattern, lambda _m: quoted, text)  # noqa: B023 - used at once
        return text

    def argv(self, argv: Sequence[str], python: str | None = None) -> list[str]:
        """The command's argv in the state: paths mapped, shell ``-c`` scripts mapped, and a
        bare ``python…`` program replaced by ``python`` (the state's interpreter)."""
        out = list(argv)
        if not out:
            return out
        shell = posixpath.basename(out[0]) in SHELLS
        for i, arg in enumerate(out):
            if i > 0 and shell and _is_c_flag(out[i - 1]):
                out[i] = self.script(arg)
            elif i > 0 or "/" in arg:
                out[i] = self.word(arg)
        program = posixpath.basename(out[0])
        if PYTHON_NAME.fullmatch(program) or (python and out[0] == python):
            out = self.module(out)
        if python and PYTHON_NAME.fullmatch(out[0]):
            out[0] = python
        return out

    def module(self, argv: list[str]) -> list[str]:
        """A Python argv whose ``-m`` module sits in a moved tree seen from the command's
        cwd, run from the state's copy (see the module doc); else ``argv`` unchanged."""
        found = _dash_m(argv)
        base = self.cwd or self.origin
        if found is None or base is None:
            return argv
        at, name = found
        roots: dict[str, str] = {}
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            live = posixpath.join(base, *parts[:i])
            copy = self.mapped(live)
            if copy is not None and copy != live:
                roots[".".join(parts[:i])] = copy
                break  # the outer tree moves everything below it
        if not roots:
            return argv
        return [*argv[:at], "-c", _finder_code(roots), name, *argv[at + 2 :]]

    def search_path(self, value: str) -> str:
        """A ``PYTHONPATH``-style list with each entry mapped (entries are paths by name,
        so they are mapped whether or not they exist)."""
        parts = value.split(os.pathsep)
        return os.pathsep.join(self.path(p, must_exist=False) if p else p for p in parts)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with ``PYTHONPATH`` mapped."""
        out = dict(env)
        if out.get("PYTHONPATH"):
            out["PYTHONPATH"] = self.search_path(out["PYTHONPATH"])
        return out


def live_cd(argv: Sequence[str], roots: Sequence[str]) -> str | None:
    """The directory a shell ``-c`` script of ``argv`` changes into with ``cd DIR`` when
    ``DIR`` is absolute and above one of ``roots`` (a bisected repo): the script's relative
    paths after it then name the live tree. Locally they are mapped from where the user ran
    envbisect; through layers nothing maps them (see the README's table), so the run says
    so. None when there is no such ``cd``."""
    if not argv or posixpath.basename(argv[0]) not in SHELLS:
        return None
    for i in range(1, len(argv)):
        if not _is_c_flag(argv[i - 1]):
            continue
        try:
            words = shlex.split(argv[i], comments=False)
        except ValueError:
            return None
        for w, target in zip(words, words[1:], strict=False):
            if w != "cd" or not target.startswith("/"):
                continue
            here = posixpath.normpath(target)
            for root in roots:
                root = posixpath.normpath(root)
                if root.startswith(here.rstrip("/") + "/"):  # into the repo itself: mapped
                    return here
    return None


_PY_VALUE_OPTS = frozenset(("-W", "-X", "--check-hash-based-pycs"))


def _dash_m(argv: Sequence[str]) -> tuple[int, str] | None:
    """(index of a separate ``-m`` word, the module) of a Python argv; None when the program
    is a script, ``-c`` code, stdin, or ``-m`` is glued to its value or to other options."""
    i = 1
    while i < len(argv):
        w = argv[i]
        if w == "-m" and i + 1 < len(argv):
            return i, argv[i + 1]
        if not w.startswith("-") or w == "-" or w.startswith("-c") or w.startswith("-m"):
            return None
        i += 2 if w in _PY_VALUE_OPTS else 1
    return None


# Run as ``python -c CODE MODULE ARGS``; ``R``: dotted package name → the state's copy.
_FINDER = """def _state_copy_main(roots):
    import importlib.machinery, importlib.util, os, runpy, sys

    class StateCopy:
        @staticmethod
        def find_spec(name, path=None, target=None):
            d = roots.get(name)
            if d is None:
                return None
            init = os.path.join(d, "__init__.py")
            if os.path.isfile(init):
                return importlib.util.spec_from_file_location(
                    name, init, submodule_search_locations=[d]
                )
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [d]
            return spec

    sys.meta_path.insert(0, StateCopy)
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.getcwd()
    main = sys.modules["__main__"].__dict__
    for key in list(main):
        if key not in ("__builtins__", "__name__"):
            del main[key]  # this code's names: the module starts with a clean __main__
    del sys.argv[0]
    runpy._run_module_as_main(sys.argv[0], alter_argv=True)


_state_copy_main({roots!r})
"""


def _finder_code(roots: Mapping[str, str]) -> str:
    return _FINDER.format(roots=dict(roots))


def _is_c_flag(word: str) -> bool:
    """``-c``, or a short-option cluster ending in it (``-lc``, ``-ec``)."""
    return len(word) >= 2 and word[0] == "-" and word[1] != "-" and word.endswith("c")


def _below(path: str, root: str) -> str | None:
    """What follows ``root`` in ``path`` ("" for the root itself, "/x" below it), or None
    when ``path`` is not under ``root``."""
    root = root.rstrip("/") or "/"
    if path == root or path.startswith(root.rstrip("/") + "/"):
        return path[len(root) :]
    return None


def _looks_like_path(word: str, live: str) -> bool:
    """A relative word is a path when it exists, or names a file in a directory that does
    (an output file not yet written); a bare word that exists nowhere is an argument."""
    if os.path.lexists(live):
        return True
    return "/" in word.rstrip("/") and os.path.isdir(posixpath.dirname(live))
