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


def excerpt(value: object, limit: int = 80) -> str:
    """:func:`printable` of ``value``, cut to ``limit`` characters with how many were left
    out: what a message echoes of a value a user (or a file) gave."""
    text = printable(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


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


_SURROGATE = re.compile("[\udc80-\udcff]")


def has_raw_bytes(text: str) -> bool:
    """True when ``text`` carries bytes that were not UTF-8 (surrogateescape)."""
    return _SURROGATE.search(text) is not None


def bytes_escaped(text: str) -> str:
    """``text`` with each byte that was not UTF-8 written ``\\xNN`` (the text YAML can hold).
    Every byte is kept; a name that also holds a literal ``\\x`` reads back ambiguously."""
    return _SURROGATE.sub(lambda m: f"\\x{ord(m.group(0)) - 0xDC00:02x}", text)


def escape_raw_bytes(tree: object, where: str, found: list[str]) -> object:
    """``tree`` (JSON-like) with every string's non-UTF-8 bytes escaped; appends to ``found``
    the dotted place of each string that had some."""
    if isinstance(tree, str):
        if has_raw_bytes(tree):
            found.append(where)
            return bytes_escaped(tree)
        return tree
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            new_key = key
            if isinstance(key, str) and has_raw_bytes(key):
                new_key = bytes_escaped(key)
                found.append(f"{where}.{printable(new_key)}")
            out[new_key] = escape_raw_bytes(value, f"{where}.{printable(new_key)}", found)
        return out
    if isinstance(tree, list):
        return [escape_raw_bytes(v, f"{where}[{i}]", found) for i, v in enumerate(tree)]
    return tree
