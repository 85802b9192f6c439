"""The one error root. Only cli.py maps these to exit codes.

Every message is a single line that names the file, field, host or layer at fault.
"""

from __future__ import annotations

from envbisect.model.escape import printable


class EnvBisectError(Exception):
    """Base of every error envbisect raises on purpose; exit code 2 unless stated."""

    exit_code = 2


class UsageError(EnvBisectError):
    """A command-line value that cannot be used."""


class ConfigError(EnvBisectError):
    """envbisect.yaml is missing a field, has a wrong type or cannot be parsed."""


class ManifestError(EnvBisectError):
    """A manifest file is malformed, of another schema, or has a field of the wrong type.
    Its message is one line whatever the file held: a key read from it is escaped
    (``packages.\\n``), never a line break in the message."""

    def __init__(self, message: str) -> None:
        super().__init__(printable(message))


_YAML_KINDS = {
    "NoneType": "null",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true/false",
    "dict": "a mapping",
    "list": "a list",
}


def yaml_kind(value: object) -> str:
    """What a value read from YAML is, in the file's words: ``null``, ``a list``."""
    return yaml_type(type(value))


def yaml_type(kind: type) -> str:
    """A Python type in a YAML file's words: ``a string``, ``a mapping``."""
    return _YAML_KINDS.get(kind.__name__, kind.__name__)


class ScopeError(EnvBisectError):
    """A manifest names a path outside what the user's envbisect.yaml lets a run touch."""


class TrustError(EnvBisectError):
    """A manifest from someone else holds entries that can run code; --trust not given."""


class CollectError(EnvBisectError):
    """The collector agent could not produce a manifest at all."""


class ReconstructError(EnvBisectError):
    """A past state cannot be reconstructed: a bad or future time, or one before any history."""


class TransportError(EnvBisectError):
    """A layer chain is invalid, or a program run through it returned no framed result."""


class ActuationError(EnvBisectError):
    """An in-between state could not be realized (venv, worktree, file, cache)."""


class SmokeError(EnvBisectError):
    """The smoke test could not be started or its result could not be read."""


class CommandFailed(SmokeError):
    """The user's command cannot run: it fails at start in the good state, or the same way
    in both endpoints (said in its own words, before anything is bisected)."""


class SessionError(EnvBisectError):
    """A bisection session directory is missing, locked or inconsistent."""


class WorkerError(EnvBisectError):
    """A worker is not the same kind of machine as the target, or cannot run a trial."""

    def __init__(self, message: str, worker: str | None = None) -> None:
        super().__init__(message)
        self.worker = worker  # the worker at fault, when one is


class Interrupted(EnvBisectError):
    """The user interrupted a long run; state was saved."""

    exit_code = 130
