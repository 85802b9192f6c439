"""Why a state gave no throughput: one kind from :class:`FailureKind` and a detail.

A :class:`Failure` *is* the text users read (``"build: uv venv failed: ..."``, ``"crash:
exit 1"``, ``"timeout after 600s"``), so it goes into JSON, the session log and messages as
is; code asks :attr:`Failure.kind` instead of comparing string prefixes. Read back from a
session log, :meth:`Failure.of` gives the kind again.
"""

from __future__ import annotations

from enum import Enum


class FailureKind(str, Enum):
    """What went wrong; the value is the prefix the text starts with."""

    BUILD = "build"  # the state could not be realized (venv, worktree, file content, ...)
    CRASH = "crash"  # the command ran and failed, or reported no usable number
    TIMEOUT = "timeout"  # the command ran past its time limit
    OTHER = "other"  # text from elsewhere (an older session log, a test)


# Failures of a run that count towards a state's crash rate (a build failure is no run).
CRASH_KINDS = (FailureKind.CRASH, FailureKind.TIMEOUT)


class Failure(str):
    """A failure's text, carrying its kind. Compare, print and serialize it as a string."""

    __slots__ = ()

    @classmethod
    def make(cls, kind: FailureKind, detail: str = "") -> Failure:
        """``build: <detail>``; a timeout's detail follows with a space (``timeout after 5s``)."""
        if kind is FailureKind.TIMEOUT:
            return cls(f"{kind.value} {detail}" if detail else kind.value)
        return cls(f"{kind.value}: {detail}")

    @classmethod
    def build(cls, detail: str) -> Failure:
        return cls.make(FailureKind.BUILD, detail)

    @classmethod
    def crash(cls, detail: str) -> Failure:
        return cls.make(FailureKind.CRASH, detail)

    @classmethod
    def timeout(cls, detail: str = "") -> Failure:
        return cls.make(FailureKind.TIMEOUT, detail)

    @classmethod
    def of(cls, text: str | None) -> Failure | None:
        """``text`` as a Failure (None stays None)."""
        if text is None or isinstance(text, Failure):
            return text
        return cls(text)

    @property
    def kind(self) -> FailureKind:
        for kind in (FailureKind.BUILD, FailureKind.CRASH):
            if self.startswith(f"{kind.value}:"):
                return kind
        if self == FailureKind.TIMEOUT.value or self.startswith(f"{FailureKind.TIMEOUT.value} "):
            return FailureKind.TIMEOUT
        return FailureKind.OTHER

    @property
    def detail(self) -> str:
        """The text after the kind's prefix."""
        if self.kind is FailureKind.OTHER:
            return str(self)
        return str(self)[len(self.kind.value) :].lstrip(": ").strip()
