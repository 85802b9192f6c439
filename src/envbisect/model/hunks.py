"""A file's change as hunks: split two contents into hunks, apply any subset of them.

Hunks carry no context lines (``git diff -U0``): each is one run of changed lines, and any
subset of the hunks of one change applies to that change's old content, so delta debugging
can test every subset. Applying checks the old lines at the hunk's place; a hunk that does
not match (another base) raises ``HunkError``. Pure functions over text; nothing reads files.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from envbisect.model.errors import EnvBisectError

__all__ = ["Hunk", "HunkError", "apply", "decode", "split"]


class HunkError(EnvBisectError):
    """A hunk does not apply to the content it is applied to."""


@dataclass(frozen=True)
class Hunk:
    """One run of changed lines: ``old`` lines at 0-based line ``at`` of the old content
    become ``new`` (each line with its line ending); ``new_at`` is where they start in the
    new content. ``number`` is 1-based, in file order (across files: in the order the files
    were split)."""

    number: int
    at: int
    old: tuple[str, ...]
    new_at: int
    new: tuple[str, ...]
    path: str = ""  # the file, where hunks of several files are searched together

    @property
    def header(self) -> str:
        """``@@ -10,1 +10,1 @@`` as unified diff writes it (an empty side names the line
        before it)."""
        return f"@@ -{_span(self.at, len(self.old))} +{_span(self.new_at, len(self.new))} @@"

    @property
    def lines(self) -> tuple[str, ...]:
        """The hunk as a unified diff shows it: the header, ``-old`` then ``+new`` lines."""
        return (
            self.header,
            *(f"-{_bare(line)}" for line in self.old),
            *(f"+{_bare(line)}" for line in self.new),
        )

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"number": self.number, "header": self.header, "text": self.text}
        if self.path:
            out["path"] = self.path
        return out


def _span(at: int, n: int) -> str:
    # Unified diff: a side with lines starts at its first line (1-based); an empty side
    # names the line after which the other side's lines go.
    return f"{at + 1 if n else at},{n}"


def _bare(line: str) -> str:
    return line.rstrip("\r\n")


def decode(content: bytes) -> str | None:
    """Text of a file's content, or None when it is not UTF-8 (no hunks for binary files)."""
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        return None


def split(old: str, new: str, *, path: str = "", first: int = 1) -> tuple[Hunk, ...]:
    """The hunks that turn ``old`` into ``new``, in file order (``apply(old, all) == new``),
    numbered from ``first``; ``path`` names the file in each."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    out: list[Hunk] = []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        out.append(Hunk(first + len(out), i1, tuple(a[i1:i2]), j1, tuple(b[j1:j2]), path))
    return tuple(out)


def apply(old: str, hunks: Iterable[Hunk]) -> str:
    """``old`` with ``hunks`` applied (any subset of one ``split``; order does not matter).

    ``HunkError`` when a hunk's old lines are not at its place in ``old`` or two hunks
    overlap: the subset cannot be built, which a search counts as unresolved."""
    a = old.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for hunk in sorted(hunks, key=lambda h: (h.at, h.number)):
        if hunk.at < pos:
            raise HunkError(f"hunk {hunk.header} overlaps the hunk before it")
        if tuple(a[hunk.at : hunk.at + len(hunk.old)]) != hunk.old:
            raise HunkError(f"hunk {hunk.header} does not apply: its old lines are not there")
        out += a[pos : hunk.at]
        out += hunk.new
        pos = hunk.at + len(hunk.old)
    out += a[pos:]
    return "".join(out)


def numbers(hunks: Sequence[Hunk]) -> str:
    """``1, 3, 4`` — hunk numbers for messages."""
    return ", ".join(str(h.number) for h in hunks)
