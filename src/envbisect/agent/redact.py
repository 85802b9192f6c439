"""What counts as a secret, and how it is kept off disk: one implementation for both sides.

Stdlib only, Python 3.8+ syntax: the snapshot collector ships this module to the target
Python (see ``AGENT_REQUIRES`` in ``envbisect.agent.collector``), and the host imports it
for everything it writes itself (diffs, session log, reports, JSON, trial logs).

Two rules, by **name** and by **value shape**:

- :func:`is_secret_name`: a variable (or a ``key=`` inside a value) whose name says it holds a
  secret: TOKEN, SECRET, PASSWORD, CREDENTIAL(S), COOKIE, SESSION, PRIVATE, ``API_KEY``,
  ``ACCESS_KEY``, ``AUTH`` (not AUTHOR), ``AWS_*``, and the words KEY, PAT, PWD, CREDS as whole
  words of the name (``NCCL_IB_KEY``, ``GITHUB_PAT``, ``DB_PWD``; not ``PATH``, not ``PWD``
  itself, not ``TOKENIZERS_PARALLELISM`` or ``MAX_TOKENS``).
- :func:`find_secrets`: well-known token formats anywhere inside a value (GitHub, Hugging
  Face, ``sk-`` API keys, AWS access key ids, Slack, JWTs, PEM private keys, bearer tokens),
  credentials in any URL (``scheme://user:pass@``), and ``name=value`` / ``--name value``
  pairs whose name is a secret name — also inside ``PATH``-like lists and option strings.

The public functions:

- :func:`redact_env` — the value to record for one environment variable:
  the value itself, or ``{"redacted": <sha256[:8]>}`` (by name), or
  ``{"redacted": ..., "reason": ..., "masked": ...}`` (by shape: ``reason`` says which shape,
  ``masked`` is the value with each secret replaced by ``<redacted>`` when the rest is worth
  reading).
- :func:`redact_env_mapping` — the same for a whole environment (e.g. a trial's env diff).
- :func:`redact_text` — free text with every secret-shaped span replaced by ``<redacted>``.
- :func:`redact_argv` — the same for a command line given as words.
- :func:`redact_tree` — :func:`redact_text` on every string of a JSON-like structure.
"""

from __future__ import annotations

import hashlib
import re

PLACEHOLDER = "<redacted>"

# -- names ---------------------------------------------------------------------------------

# Matched anywhere in the name: each of these is a secret whatever surrounds it.
_SECRET_IN_NAME = re.compile(
    r"SECRET|PASSW|PASSPHRASE|CREDENTIAL|COOKIE|SESSION|PRIVATE|API_?KEY|ACCESS_?KEY"
    r"|ACCOUNT_?KEY|AUTH(?!OR(?!I))|^AWS_",
    re.IGNORECASE,
)
# Matched as whole words of the name (split at ``_ - .``): short words that are
# harmless inside longer ones (PATH, TOKENIZERS, KEYBOARD).
_SECRET_WORDS = frozenset({"KEY", "KEYS", "PAT", "PWD", "CREDS", "CRED", "JWT", "SIG"})
# A word that is, or ends in, TOKEN (HFTOKEN, GH_TOKEN) -- but not TOKENS (a count).
_TOKEN_WORD = re.compile(r"TOKEN$", re.IGNORECASE)
# The shell's working directory variables are paths, not passwords.
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})
# Words split at non-alphanumerics only: camelCase is not split, or ssh's
# StrictHostKeyChecking=yes would be a "KEY" (apiKey still is, by API_?KEY).
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")


def is_secret_name(name: str) -> bool:
    """True when ``name`` (an env var, or the key of a ``key=value`` pair) names a secret."""
    if name.upper() in _NOT_SECRET:
        return False
    if _SECRET_IN_NAME.search(name):
        return True
    for word in _WORD_SPLIT.split(name):
        upper = word.upper()
        if upper in _SECRET_WORDS or _TOKEN_WORD.search(upper):
            return True
    return False


# -- value shapes --------------------------------------------------------------------------

# Each shape: (reason, pattern, replacement, needles). The secret is the whole match, or the
# group ``v`` where the pattern has one. Tokens are replaced by ``<redacted>``; URL
# credentials are cut out (``https://u:p@host/x`` -> ``https://host/x``), as the URL is then
# still the one to use. A pattern is tried only on a text holding all its needles: cheap
# substring tests keep a 20,000-unit diff (hundreds of thousands of short strings) fast, and
# no pattern starts with a lookbehind, which would make the engine try every position.
_SHAPES = (
    (
        "a PEM private key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----"
        r"(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|.*)",
        PLACEHOLDER,
        ("-----BEGIN",),
    ),
    (
        "a GitHub token",
        r"g(?:h[pousr]_[A-Za-z0-9]{30,255}|ithub_pat_[A-Za-z0-9_]{20,255})",
        PLACEHOLDER,
        ("g", "_"),
    ),
    ("a GitLab token", r"glpat-[A-Za-z0-9_\-]{20,}", PLACEHOLDER, ("glpat-",)),
    ("a Hugging Face token", r"hf_[A-Za-z0-9]{30,}", PLACEHOLDER, ("hf_",)),
    # Not inside a word: "task-..." and "disk-..." are not keys.
    (
        "an API key (sk-...)",
        r"sk-(?<![A-Za-z0-9]sk-)[A-Za-z0-9_\-]{20,}",
        PLACEHOLDER,
        ("sk-",),
    ),
    ("a Google API key", r"AIza[0-9A-Za-z_\-]{35}", PLACEHOLDER, ("AIza",)),
    (
        "an AWS access key id",
        r"A(?:KIA|SIA|BIA|CCA|GPA|IDA|IPA|NPA|NVA|PKA|ROA|SCA)[A-Z0-9]{16}",
        PLACEHOLDER,
        ("A",),
    ),
    ("a Slack token", r"xox[abposr]-[A-Za-z0-9\-]{10,}", PLACEHOLDER, ("xox",)),
    ("an npm token", r"npm_[A-Za-z0-9]{30,}", PLACEHOLDER, ("npm_",)),
    ("a PyPI token", r"pypi-[A-Za-z0-9_\-]{40,}", PLACEHOLDER, ("pypi-",)),
    ("a Databricks token", r"dapi[0-9a-f]{32}(?:-[0-9]+)?", PLACEHOLDER, ("dapi",)),
    ("a Stripe key", r"[rs]k_(?:live|test)_[A-Za-z0-9]{16,}", PLACEHOLDER, ("k_",)),
    (
        "a SendGrid key",
        r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}",
        PLACEHOLDER,
        ("SG.",),
    ),
    ("a Google OAuth token", r"ya29\.[A-Za-z0-9_\-]{20,}", PLACEHOLDER, ("ya29.",)),
    ("a Hugging Face org token", r"api_org_[A-Za-z0-9]{20,}", PLACEHOLDER, ("api_org_",)),
    ("a Docker token", r"dckr_pat_[A-Za-z0-9_\-]{20,}", PLACEHOLDER, ("dckr_pat_",)),
    (
        "an Azure SAS signature",
        r"[?&;]sig=(?P<v>[A-Za-z0-9%+/]{10,}=*)",
        PLACEHOLDER,
        ("sig=",),
    ),
    (
        "an Azure account key",
        r"(?:Account|SharedAccess)Key=(?P<v>[A-Za-z0-9+/]{16,}=*)",
        PLACEHOLDER,
        ("Key=",),
    ),
    ("basic credentials", r"[Bb]asic (?P<v>[A-Za-z0-9+/]{8,}=*)", PLACEHOLDER, ("asic ",)),
    (
        "a secret after a secret-named key:",
        # An auth scheme word is not the secret: the bearer/basic shapes take what follows it.
        r"(?P<n>[A-Za-z][A-Za-z0-9_.\-]*)[ \t]*:[ \t]+[\"']?"
        r"(?![Bb]earer |[Bb]asic |[Tt]oken |[Dd]igest )(?P<v>[^\s,;&\"'<>\\]+)",
        PLACEHOLDER,
        (": ",),
    ),
    (
        "a JWT",
        r"eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*",
        PLACEHOLDER,
        ("eyJ",),
    ),
    (
        "a bearer token",
        r"[Bb]earer (?P<v>[A-Za-z0-9._~+/\-]{8,}=*)",
        PLACEHOLDER,
        ("earer ",),
    ),
    # scheme://userinfo@ -- any userinfo (user:pass or a bare token) is a credential.
    ("credentials in a URL", r"://(?P<v>[^/@\s?#\"'<>\\]+@)", "", ("://", "@")),
)
# ``name: value`` (YAML, config files, headers) is a secret only after these names: a
# variable named in prose ("HF_TOKEN: the good value ...") is not followed by its value.
_COLON_NAMES = re.compile(
    r"(?i)(?:password|passwd|pass|pwd|passphrase|secret|client[_-]?secret|token"
    r"|auth[_-]?token|access[_-]?token|api[_-]?key|apikey|access[_-]?key|private[_-]?key)\Z"
)
_SHAPE_RES = tuple(
    (why, re.compile(pattern, re.DOTALL), needles) for why, pattern, _r, needles in _SHAPES
)
# One search that every shape needs to succeed: most strings (versions, paths, ids) stop here.
_ANY_SHAPE = re.compile(
    r"-----BEGIN|_|glpat-|sk-|AIza|A[A-Z]{3}[A-Z0-9]{16}|xox|eyJ|earer |://"
    r"|pypi-|dapi|SG\.|ya29\.|sig=|Key=|asic |:[ \t]"
)
# name=value pairs (also --name=value) inside a value or a text, and --name value options:
# the value is a secret when the name is. A value ends at whitespace, a list separator or a
# quote (a quote may also open it: shlex.join writes --password 'a b$c'); a ":" stays inside
# it (a password may hold one). Values are matched in lookaheads so that "a=1:token=x" still
# finds token=; the name before a "=" is read backwards from it.
_EQ_RE = re.compile(r"=(?=[ \t]*[\"']?(?P<value>[^\s,;&\"'<>\\]+))")
_NAME_BEFORE = re.compile(r"(?<![A-Za-z0-9_])(?P<name>[A-Za-z][A-Za-z0-9_.\-]*)[ \t]*\Z")
_OPTION_RE = re.compile(
    r"-(?<![^\s]-)-?(?P<name>[A-Za-z][A-Za-z0-9_.\-]*)"
    r"(?=[ \t]+[\"']?(?P<value>[^\s\-\"'<>\\][^\s\"'<>\\]*))"
)
_OPTION_WORD = re.compile(r"--?(?P<name>[A-Za-z][A-Za-z0-9_.\-]*)")


def _pair_reason(name: str, sep: str) -> str:
    # The name goes into the reason only when it cannot itself be the secret.
    if len(name) > 24 or _shape_spans(name):
        return "a secret after a secret-named key"
    return f"a secret after {name}=" if sep == "=" else f"a secret after --{name}"


def _shape_spans(text: str) -> list[tuple[int, int, str]]:
    spans: list[tuple[int, int, str]] = []
    if _ANY_SHAPE.search(text) is None:
        return spans
    for why, regex, needles in _SHAPE_RES:
        if not all(needle in text for needle in needles):
            continue
        group = "v" if "v" in regex.groupindex else 0
        for m in regex.finditer(text):
            # ``name: value`` counts only where the name is a secret's (password: x).
            if "n" in regex.groupindex and not _COLON_NAMES.match(m.group("n")):
                continue
            spans.append((m.start(group), m.end(group), why))
    return spans


def find_secrets(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, reason)`` of every secret-shaped span in ``text``, in order, disjoint."""
    spans = _shape_spans(text)
    if "=" in text:
        for m in _EQ_RE.finditer(text):
            before = _NAME_BEFORE.search(text, max(0, m.start() - 64), m.start())
            if before and is_secret_name(before.group("name")):
                why = _pair_reason(before.group("name"), "=")
                spans.append((m.start("value"), m.end("value"), why))
    if "-" in text:
        for m in _OPTION_RE.finditer(text):
            if is_secret_name(m.group("name")):
                why = _pair_reason(m.group("name"), " ")
                spans.append((m.start("value"), m.end("value"), why))
    if len(spans) < 2:
        return spans
    spans.sort()
    merged = [spans[0]]
    for start, end, why in spans[1:]:
        last = merged[-1]
        if start < last[1]:
            merged[-1] = (last[0], max(last[1], end), last[2])
        else:
            merged.append((start, end, why))
    return merged


_CUT = {shape[0] for shape in _SHAPES if shape[2] == ""}


def _mask(text: str, spans: list[tuple[int, int, str]]) -> str:
    out, pos = [], 0
    for start, end, why in spans:
        out.append(text[pos:start])
        out.append("" if why in _CUT else PLACEHOLDER)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def redact_text(text: str) -> str:
    """``text`` with every secret-shaped span (see :func:`find_secrets`) replaced."""
    spans = find_secrets(text)
    return _mask(text, spans) if spans else text


def digest8(value: str) -> str:
    """The sha256 prefix recorded for a redacted value: a diff can still say "changed"."""
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def redact_env(name: str, value: str) -> str | dict[str, str]:
    """What to record for env var ``name``: ``value``, or a ``{redacted: ...}`` entry.

    By name: ``{"redacted": <sha256[:8]>}``. By shape: also ``reason`` (which shapes were
    found, so a false positive explains itself) and, unless the secret is the whole value,
    ``masked`` (the value with each secret replaced by ``<redacted>``).
    """
    if is_secret_name(name):
        return {"redacted": digest8(value)}
    spans = find_secrets(value)
    if not spans:
        return value
    reasons = []
    for _start, _end, why in spans:
        if why not in reasons:
            reasons.append(why)
    entry = {"redacted": digest8(value), "reason": "value holds " + ", ".join(reasons)}
    masked = _mask(value, spans)
    if masked.strip() != PLACEHOLDER:
        entry["masked"] = masked
    return entry


def redact_env_mapping(env: dict[str, str | None]) -> dict[str, object]:
    """:func:`redact_env` for every variable of ``env`` (``None``, "unset", stays ``None``)."""
    return {k: (v if v is None else redact_env(k, v)) for k, v in env.items()}


def is_redacted(value: object) -> bool:
    """True for a ``{redacted: ...}`` entry as :func:`redact_env` makes it."""
    return isinstance(value, dict) and "redacted" in value


def redact_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """An argv with every word redacted (:func:`redact_text`), and the word after an option
    named like a secret (``--token``, ``-password``) replaced by ``<redacted>``."""
    out = []
    secret_next = False
    for word in argv:
        out.append(PLACEHOLDER if secret_next else redact_text(word))
        option = None if secret_next else _OPTION_WORD.fullmatch(word)
        secret_next = option is not None and is_secret_name(option.group("name"))
    return out


def redact_tree(obj: object) -> object:
    """:func:`redact_text` applied to every string (keys too) of a JSON-like structure;
    lists of strings are treated as argv (:func:`redact_argv`)."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        return {redact_tree(k): redact_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(v, str) for v in obj):
            return redact_argv(obj)
        return [redact_tree(v) for v in obj]
    return obj


# -- file contents ----------------------------------------------------------------------------

# Shapes that mark a file as holding a secret: the key and token formats, not the looser
# ``name: value`` / bearer / URL forms (common in code and docs that hold no secret).
_WEAK_SHAPES = frozenset(
    {
        "a secret after a secret-named key:",
        "a bearer token",
        "basic credentials",
        "credentials in a URL",
    }
)
_STRONG_RES = tuple(entry for entry in _SHAPE_RES if entry[0] not in _WEAK_SHAPES)
# A dotenv line: ``NAME=value`` (or ``export NAME=value``), no blank around the ``=``.
_DOTENV_LINE = re.compile(r"(?m)^[ \t]*(?:export[ \t]+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)=\S")
CONTENT_SCAN_BYTES = 1 << 20


def secret_in_content(data: bytes) -> str | None:
    """Why file content ``data`` must not be stored as a blob: it holds a private key, a
    token of a known format, or a dotenv line of a secret-named variable (None: it holds
    none of those). Only the first ``CONTENT_SCAN_BYTES`` are read."""
    text = data[:CONTENT_SCAN_BYTES].decode("utf-8", "replace")
    if _ANY_SHAPE.search(text) is not None:
        for why, regex, needles in _STRONG_RES:
            if all(n in text for n in needles) and regex.search(text):
                return why
    if "=" in text:
        for m in _DOTENV_LINE.finditer(text):
            if is_secret_name(m.group("name")):
                return f"a secret-named variable ({m.group('name')}=)"
    return None
