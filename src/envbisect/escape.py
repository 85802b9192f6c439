"""Recorded data made safe to print: every control character escaped.

A manifest, a session log or a trial's output may hold anything: an OSC 52 escape sets the
terminal's clipboard, a newline in a file name breaks out of a report's code block, a
surrogate stands for a byte that was not UTF-8. Every renderer passes data through here:
:func:`printable` for one value (newlines escaped too), :func:`terminal` for finished text
(its own layout newlines and tabs kept; the colours envbisect itself adds kept on request).
Escapes are lossless: ``\\n``, ``\\t``, ``\\r``, ``\\xNN`` for other C0/DEL/C1 characters and
for the bytes a non-UTF-8 name carried (surrogateescape), ``\\uNNNN`` for bidi overrides;
a backslash itself is left alone.
"""

from __future__ import annotations

import re

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
# C0, DEL, C1, bidi embeddings/overrides/isolates, line/paragraph separators, surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_TEXT = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_SGR = re.compile("\x1b\\[[0-9;]*m")


def _one(match: re.Match[str]) -> str:
    ch = match.group(0)
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def printable(value: object) -> str:
    """``str(value)`` on one line with every control character escaped."""
    return _UNSAFE.sub(_one, str(value))


def terminal(text: str, *, keep_colors: bool = False) -> str:
    """Finished output with control characters escaped; newlines and tabs kept, and with
    ``keep_colors`` the SGR colour codes (``ESC [ ... m``) too."""
    if not keep_colors:
        return _UNSAFE_TEXT.sub(_one, text)
    parts = []
    last = 0
    for m in _SGR.finditer(text):
        parts.append(_UNSAFE_TEXT.sub(_one, text[last : m.start()]))
        parts.append(m.group(0))
        last = m.end()
    parts.append(_UNSAFE_TEXT.sub(_one, text[last:]))
    return "".join(parts)
