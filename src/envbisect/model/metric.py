"""Reading a throughput from what a smoke or user command left behind.

A run reports tokens per second in one of four ways, tried in this order:

1. the file named by the env var ``ENVBISECT_RESULT`` (set by envbisect per run): JSON;
2. the framed agent channel (the built-in smoke test shipped with ``Transport.run_agent``);
3. the last ``ENVBISECT_RESULT {json}`` line on stdout;
4. ``--metric-regex``: a regular expression with one group holding the number, whose unit is
   read from the text right after the group (``"([0-9.]+) Ktok/s"`` → ×1000). A training
   log prints a throughput per step: every matched line after the first W (``--warmup-lines
   W``; default: the first third are warm-up) is one sample, so one process gives a trial
   all its samples, as the built-in drafter's timed windows do; the run's figure is their
   median.

The JSON form is the smoke result: ``{"ok": bool, "tok_per_s": float|null, "error":
{"class", "message"}|null, ...}``. Whatever cannot give a number becomes a ``failure``
string (``crash: ...``, ``timeout``, ``oom: ...``, ``no metric: ...``) so a trial can be
judged per ``--on-crash``.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envbisect.model.errors import UsageError
from envbisect.model.failure import Failure
from envbisect.model.units import TOKENS, Unit, parse_unit, shown

# How many timed windows a trial asks one run for (the built-in drafter reads it; any smoke
# command may, and report them as a ``samples`` list in its result).
SAMPLES_ENV = "ENVBISECT_SAMPLES"
RESULT_ENV = "ENVBISECT_RESULT"
RESULT_LINE = re.compile(rb"^ENVBISECT_RESULT (\{.*\})\s*$", re.MULTILINE)

# What follows the number group in a --metric-regex: regex spacing, then the unit's text.
_AFTER_GROUP = re.compile(r"^\)\s*(?:\\s[*+?]?|\s|\\ )*(?P<unit>(?:\\/|\\%|[A-Za-z%µ/_])+)")
# A figure named before its number: train_samples_per_second, "steps per second".
_PER_SECOND_BEFORE = re.compile(r"(?P<what>[A-Za-z]+)[_ ]per[_ ]sec(?:ond)?\W*$")

_OOM_MARKERS = (
    b"CUDA out of memory",
    b"OutOfMemoryError",
    b"MemoryError",
    b"Cannot allocate memory",
    b"out of memory",
)


@dataclass(frozen=True)
class MetricSpec:
    """How to read a run's figure from a command that only logs text: ``pattern``'s group
    is the number, ``unit`` says what it is and which way is better (``model.units``);
    every figure read becomes the engine's rate (higher is better)."""

    pattern: re.Pattern[str]
    unit: Unit = TOKENS
    warmup: int | None = None  # matched lines dropped as warm-up (None: the first third)
    label: str | None = None  # a recognized log form's name (``recognize``), None: typed

    @property
    def scale(self) -> float:
        return self.unit.scale

    @classmethod
    def parse(cls, regex: str, direction: str | None = None) -> MetricSpec:
        """``"([0-9.]+) Ktok/s"`` → tokens scaled by 1000; ``"time ([0-9.]+)ms"`` → a time
        per step, lower is better. The unit is read right after the number group (or, for
        ``train_samples_per_second': ([0-9.]+)``, from the name before it); ``direction``
        (``lower``/``higher``: --lower-is-better / --higher-is-better) overrides its way
        round, and names it for a unit this cannot tell."""
        try:
            pattern = re.compile(regex)
        except re.error as exc:
            raise UsageError(f"--metric-regex {regex!r}: not a regular expression: {exc}") from None
        if pattern.groups < 1:
            raise UsageError(f"--metric-regex {regex!r}: needs one group around the number")
        unit = _regex_unit(regex)
        if direction is not None:
            name = unit.name if unit is not None else "(figure)"
            scale = unit.scale if unit is not None else 1.0
            unit = Unit(name, scale, lower_is_better=direction == "lower")
        if unit is None:
            raise UsageError(
                f"--metric-regex {regex!r}: which way is better cannot be told from the text "
                "after the number group: put its unit there (e.g. '([0-9.]+) tok/s', "
                "'time ([0-9.]+)ms', '([0-9.]+)it/s'), or say --higher-is-better or "
                "--lower-is-better"
            )
        return cls(pattern=pattern, unit=unit)

    def read(self, text: str) -> float | None:
        """tok/s from the last match in ``text``, or None."""
        values = self.values(text)
        return values[-1] if values else None

    def values(self, text: str) -> list[float]:
        """The engine's rate of every match in ``text``, in order (a match that holds its
        own unit in a second group, ``it/s`` or ``s/it``, is read in that unit)."""
        out: list[float] = []
        for match in self.pattern.finditer(text):
            raw = match.group(1).replace(",", "").replace("_", "")
            unit = self.unit
            if self.pattern.groups >= 2 and match.group(2):
                unit = parse_unit(match.group(2)) or unit
            try:
                value = float(raw)
            except ValueError:
                continue
            if value > 0 or not unit.lower_is_better:
                out.append(unit.rate(value))
        return out

    def samples(self, text: str) -> list[float]:
        """One sample per match after the first ``warmup`` (None: the first third, rounded
        down); a log with no more matches than that gives its last one."""
        values = self.values(text)
        skip = len(values) // 3 if self.warmup is None else self.warmup
        kept = values[skip:]
        return kept if kept else values[-1:]


@dataclass(frozen=True)
class Measurement:
    """One run's throughput, or why there is none."""

    tok_per_s: float | None
    failure: Failure | None = None
    source: str | None = None  # "file" | "frame" | "line" | "regex"
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None and self.tok_per_s is not None

    @property
    def samples(self) -> tuple[float, ...]:
        """The run's samples: its timed windows (``samples`` in a smoke-style result, one
        process, one warm-up) or, where it reported none, its one throughput."""
        if not self.ok:
            return ()
        windows = self.result.get("samples")
        if isinstance(windows, list) and windows and all(_rate(x) for x in windows):
            return tuple(float(x) for x in windows)
        assert self.tok_per_s is not None
        return (self.tok_per_s,)

    def as_dict(self) -> dict[str, Any]:
        return {"tok_per_s": self.tok_per_s, "failure": self.failure, "source": self.source}


def _regex_unit(regex: str) -> Unit | None:
    """The unit a --metric-regex names right after its first capturing group, or before it
    in a ``..._per_second`` name; None when neither tells."""
    span = _first_group(regex)
    if span is None:
        return None
    start, end = span
    found = _AFTER_GROUP.match(regex[end:])
    if found is not None:
        text = re.sub(r"\\(.)", r"\1", found.group("unit"))
        unit = parse_unit(text)
        if unit is not None:
            return unit
    before = re.sub(r"\\(.)", r"\1", regex[:start])
    named = _PER_SECOND_BEFORE.search(before)
    if named is not None:
        return Unit(f"{named.group('what')}/s")
    return None


def _first_group(regex: str) -> tuple[int, int] | None:
    """(start, end) of the first capturing group's parentheses: ``(?m)`` and ``(?:…)`` are
    not one, ``(?P<name>…)`` is; escaped parentheses and character classes are skipped."""
    i, start, depth, in_class = 0, None, 0, False
    while i < len(regex):
        ch = regex[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            if start is not None:
                depth += 1
            elif not regex.startswith("?", i + 1) or regex.startswith("?P<", i + 1):
                start, depth = i, 1
        elif ch == ")" and start is not None:
            depth -= 1
            if depth == 0:
                return start, i
        i += 1
    return None


def _rate(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


_TOK_UNIT = re.compile(r"^(?P<num>[0-9.eE+-]+)\s*(?P<unit>[kKmM]?)(?P<tok>\s*tok(?:en)?s?/s)?$")


def parse_ktoks(text: str, flag: str = "--until-ktoks") -> float:
    """A throughput as people write it → tokens per second.

    ``12000`` (tok/s), ``12k`` / ``12.8k`` / ``12.8K`` / ``12.8 Ktok/s`` (thousands),
    ``1.2M``, ``15tok/s`` (explicitly tok/s). A bare number below 1,000 is refused: whether
    ``15`` means 15 tok/s or 15 Ktok/s cannot be told, and guessing wrong makes every state
    "good" (the line says how to write either).
    """
    raw = str(text).strip().replace(",", "").replace("_", "")
    found = _TOK_UNIT.match(raw)
    value = None
    if found is not None:
        with contextlib.suppress(ValueError):
            value = float(found.group("num"))
    if found is None or value is None:
        raise UsageError(
            f"{flag} {text!r}: expected a throughput like 12000, 12k, 12.8k or 12.8 Ktok/s"
        )
    unit = found.group("unit").lower()
    value *= {"k": 1e3, "m": 1e6}.get(unit, 1.0)
    if not value > 0 or not math.isfinite(value):
        raise UsageError(f"{flag} {text!r}: must be a positive throughput")
    if not unit and not found.group("tok") and value < 1000:
        raise UsageError(
            f"{flag} {text!r}: a bare number below 1,000 is ambiguous — write {raw}k for "
            f"{format_tok(value * 1000)}, or {raw}tok/s if you mean {raw} tokens per second"
        )
    return value


@dataclass(frozen=True)
class Threshold:
    """What "good" means: at least ``value`` (the engine's rate: tok/s, or a figure in
    ``unit`` turned into a rate, so ``--until 150ms`` is at least 1/0.150 s), or at least
    ``fraction`` of the good state's measured speed (``--until 70%``, either way round:
    70% of its rate), or (neither) the engine's default, midway between the measured
    endpoints. ``source`` says where it came from; ``text`` is what was typed."""

    value: float | None = None
    fraction: float | None = None
    source: str = "default"
    unit: Unit | None = None  # the unit ``value`` was given in (None: tokens per second)
    text: str | None = None

    @classmethod
    def parse(cls, text: Any, source: str, flag: str, unit: Unit | None = None) -> Threshold:
        """``70%`` → a fraction of the good state; ``150ms``, ``2.5it/s`` → that figure; a
        bare number a figure in ``unit`` when the command's figure is read in one (not
        tokens); anything else a throughput as in ``parse_ktoks``."""
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            text = f"{text:g}" if text < 1000 else f"{float(text):.0f}"
        raw = str(text).strip()
        if raw.endswith("%"):
            try:
                pct = float(raw[:-1])
            except ValueError:
                raise UsageError(
                    f"{flag} {text!r}: not a percentage: a number then one %, e.g. 70%"
                ) from None
            if not 0 < pct < 100:
                raise UsageError(
                    f"{flag} {text!r}: a percentage of the good state's speed is between "
                    "0% and 100%, e.g. 70%"
                )
            return cls(fraction=pct / 100, source=source, text=raw)
        figure = _FIGURE_WITH_UNIT.match(raw)
        named = parse_unit(figure.group("unit")) if figure is not None else None
        bare = _number(raw)
        if figure is not None and named is not None and not named.tokens:
            number = float(figure.group("num"))
        elif bare is not None and unit is not None and not unit.tokens:
            number, named = bare, unit
        else:
            return cls(value=parse_ktoks(raw, flag), source=source, text=raw)
        if not number > 0 or not math.isfinite(number):
            raise UsageError(f"{flag} {text!r}: must be a positive figure")
        return cls(value=named.rate(number), source=source, unit=named, text=raw)

    def in_unit(self, unit: Unit, flag: str) -> Threshold:
        """This threshold for figures read in ``unit``: a bare number is a figure in it; a
        figure given in a unit of the other way round (a time for a rate) is refused."""
        if self.value is None or unit.tokens:
            if self.unit is not None and unit.tokens:
                raise UsageError(
                    f"{self.source}: a figure in {self.unit.name}, but the command's figure "
                    f"is read in {unit.name}: give it in {unit.name}, or a percentage"
                )
            return self
        raw = (self.text or "").replace(",", "").replace("_", "")
        if self.unit is None:
            try:
                number = float(raw)
            except ValueError:
                raise UsageError(
                    f"{self.source}: a token rate, but the command's figure is read in "
                    f"{unit.name} ({unit.direction()}): give it in {unit.name}, e.g. "
                    f"{flag} 150{unit.name}, or a percentage"
                ) from None
            return replace(self, value=unit.rate(number), unit=unit)
        if self.unit.lower_is_better != unit.lower_is_better:
            raise UsageError(
                f"{self.source}: a figure in {self.unit.name} ({self.unit.direction()}), but "
                f"the command's figure is read in {unit.name} ({unit.direction()})"
            )
        return self

    def describe(self) -> str:
        """``good means ≥ 12,000 tok/s (12.0 Ktok/s), from --until-ktoks``; ``good means ≤
        150 ms, from --until 150ms``."""
        if self.value is not None and self.unit is not None:
            sign = "≤" if self.unit.lower_is_better else "≥"
            return (
                f"good means {sign} {self.unit.show(self.value)} {self.unit.name}, "
                f"from {self.source}"
            )
        if self.value is not None:
            return f"good means ≥ {format_tok(self.value)}, from {self.source}"
        if self.fraction is not None:
            return (
                f"good means ≥ {self.fraction:.0%} of the good state's measured speed, "
                f"from {self.source}"
            )
        return "good means faster than midway between the endpoints (no threshold given)"


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").replace("_", ""))
    except ValueError:
        return None


_FIGURE_WITH_UNIT = re.compile(r"^(?P<num>[0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*(?P<unit>\S.*)$")


def format_tok(value: float | None) -> str:
    """``12,000 tok/s (12.0 Ktok/s)``: the one way a single throughput is written; a figure
    in another unit (``units.shown``) as ``120 ms``."""
    if value is None:
        return "-"
    unit = shown()
    if not unit.tokens:
        return f"{unit.show(value)} {unit.name}"
    return f"{value:,.0f} tok/s ({format_ktok(value)} Ktok/s)"


def figure_unit() -> str:
    """What tables and sentences call their figures: ``Ktok/s``, or the user's own unit."""
    return shown().label()


def format_ktok(value: float | None) -> str:
    """Ktok/s for tables and lists: ``12.6``; three significant digits below 1 Ktok/s
    (``0.125``) so slow states do not all read ``0.1``; ``-`` for no value. A figure in
    another unit (``units.shown``: ``ms``, ``it/s``) in that unit, three digits."""
    if value is None:
        return "-"
    unit = shown()
    if not unit.tokens:
        return unit.show(value)
    k = value / 1000
    return f"{k:.1f}" if abs(k) >= 1 else f"{k:.3g}"


def ktok_list(
    samples: Sequence[float], flags: Sequence[bool] = (), *, sep: str = ", ", most: int = 8
) -> str:
    """``12.6, 12.4*`` (``*``: a flagged sample); past ``most`` samples the first ones, the
    last and the count (``12.6, 12.4, …, 12.5 (133 samples)``: a threaded script's step
    windows number in the hundreds; ``--json`` keeps them all); ``-`` for none."""
    marks = [*flags, *[False] * len(samples)]
    parts = [format_ktok(s) + ("*" if m else "") for s, m in zip(samples, marks, strict=False)]
    if len(parts) > most:
        return sep.join([*parts[: most - 2], "…", parts[-1]]) + f" ({len(parts)} samples)"
    return sep.join(parts) or "-"


def from_result(result: dict[str, Any], source: str) -> Measurement:
    """A smoke-style JSON result → Measurement."""
    error = result.get("error")
    tok = result.get("tok_per_s")
    if result.get("ok") is False or (tok is None and error):
        if isinstance(error, dict):
            why = f"{error.get('class') or 'Error'}: {error.get('message') or ''}".strip()
        else:
            why = str(error or "ok is false")
        if "OutOfMemory" in why or "out of memory" in why:
            return Measurement(None, _oom(why), source, result)
        return Measurement(None, Failure.crash(why), source, result)
    if isinstance(tok, (int, float)) and not isinstance(tok, bool):
        if not math.isfinite(float(tok)):
            # Infinity, 1e999 or NaN: no run is that fast; counting it good or bad would
            # decide a verdict on a broken number.
            return Measurement(None, _non_finite(tok), source, result)
        if tok >= 0:
            return Measurement(float(tok), None, source, result)
    return Measurement(None, _no_metric(f"result has no tok_per_s ({source})"), source, result)


def read_result_file(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when missing/empty/partial."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_result_line(stdout: bytes) -> dict[str, Any] | None:
    """The last ``ENVBISECT_RESULT {json}`` line, or None."""
    for raw in reversed(RESULT_LINE.findall(stdout)):
        try:
            data = json.loads(raw)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def measure(
    *,
    stdout: bytes,
    stderr: bytes,
    returncode: int | None,
    timed_out: bool,
    timeout_s: float | None = None,
    result_file: Path | None = None,
    frame: dict[str, Any] | None = None,
    spec: MetricSpec | None = None,
) -> Measurement:
    """Judge one finished run from everything it left behind.

    A timeout wins over any number (the run did not finish); otherwise a result that says
    ``ok: false`` or a non-zero exit is a crash even when a number was logged before it.
    """
    if timed_out:
        return Measurement(None, Failure.timeout(f"after {timeout_s:g}s" if timeout_s else ""))
    candidates: list[tuple[str, dict[str, Any] | None]] = [
        ("file", read_result_file(result_file) if result_file is not None else None),
        ("frame", frame),
        ("line", read_result_line(stdout)),
    ]
    found: Measurement | None = None
    for source, data in candidates:
        if data is not None:
            found = from_result(data, source)
            break
    if found is None and spec is not None:
        found = _from_log(spec, stdout, stderr)
    if returncode not in (0, None):
        if found is not None and found.failure is not None:
            return found
        return Measurement(None, _crash_reason(returncode, stderr), found.source if found else None)
    if found is None:
        how = (
            f"no match for --metric-regex {spec.pattern.pattern!r}"
            if spec
            else ("no ENVBISECT_RESULT (file, line or frame); use --metric-regex for a log line")
        )
        figure = suggested_regex(_text(stdout, stderr, tail=65536))
        if figure is not None:
            how += f"; {FIGURE_SEEN}, read with --metric-regex {figure}"
        return Measurement(None, _no_metric(how), None)
    return found


FIGURE_SEEN = "its output has a throughput line"
_FIGURE = re.compile(
    r"(?P<num>\d[\d,_]*(?:\.\d+)?)(?P<gap>\s*)(?P<unit>[KkMm]?tok(?:en)?s?/s(?:ec)?)(?![A-Za-z])"
)
_REGEX_SPECIAL = re.compile(r"([\\.^$*+?{}\[\]|()])")


def suggested_regex(text: str) -> str | None:
    """A ``--metric-regex`` (shell-quoted) for the last line of ``text`` that prints a
    figure in tok/s, Ktok/s or tokens/s: the words since the line's previous number, the
    number's group, the unit. None when no line does."""
    for line in reversed(text.splitlines()):
        figures = list(_FIGURE.finditer(line))
        if not figures:
            continue
        last = figures[-1]
        label = re.split(r"\d", line[: last.start()])[-1].lstrip()[-40:]
        number = r"([0-9.,]+)" if "," in last.group("num") else r"([0-9.]+)"
        gap = " " if last.group("gap") else ""
        regex = _REGEX_SPECIAL.sub(r"\\\1", label) + number + gap + last.group("unit")
        return shlex.quote(regex)
    return None


def _text(stdout: bytes, stderr: bytes, tail: int | None = None) -> str:
    """A run's stdout then its stderr, as text (``tail``: each one's last bytes only)."""
    out, err = (stdout, stderr) if tail is None else (stdout[-tail:], stderr[-tail:])
    return out.decode("utf-8", "replace") + "\n" + err.decode("utf-8", "replace")


def _from_log(spec: MetricSpec, stdout: bytes, stderr: bytes) -> Measurement | None:
    """The samples of a log's matched lines (see ``MetricSpec.samples``), or None."""
    values = spec.samples(_text(stdout, stderr))
    if not values:
        return None
    bad = next((v for v in values if not math.isfinite(v)), None)
    if bad is not None:
        return Measurement(None, _non_finite(bad), "regex")
    value = statistics.median(values)
    return Measurement(value, None, "regex", {"samples": values})


def _crash_reason(returncode: int, stderr: bytes) -> Failure:
    tail = stderr[-65536:]
    last = ""
    for line in reversed(tail.decode("utf-8", "replace").splitlines()):
        if line.strip():
            last = line.strip()[:200]
            break
    signal_note = f"killed by signal {-returncode}" if returncode < 0 else f"exit {returncode}"
    detail = signal_note + (f": {last}" if last else "")
    if any(marker in tail for marker in _OOM_MARKERS) or returncode in (-9, 137):
        return _oom(detail)
    return Failure.crash(detail)


# Out of memory and a run that reported no number have no FailureKind of their own: their
# text keeps the prefix users know (kind OTHER), which never reads as a build failure.
def _oom(detail: str) -> Failure:
    return Failure(f"oom: {detail}")


def _no_metric(how: str) -> Failure:
    return Failure(f"no metric: {how}")


def _non_finite(value: object) -> Failure:
    return Failure.crash(f"non-finite throughput ({value} tok/s)")
