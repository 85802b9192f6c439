"""The unit of a run's figure: what it is read in, which way is better, how it is shown.

The engine judges one kind of number: a rate, higher is better (tokens per second for the
built-in drafter). A user's log prints what it prints: ``time 120.33ms`` per iteration
(nanoGPT, lower is better), ``3.2it/s`` or ``1.4s/it`` (tqdm and Lightning's bar, which
switches between the two as the rate crosses one per second), ``train_samples_per_second``
(Hugging Face Trainer), ``samples/s``, ``images/s``, ``%``. A ``Unit`` turns a figure into
the engine's rate (``rate``: a time per step becomes steps per second) and back
(``figure``), so that every verdict is read the same way round while every line a user reads
says the figure in the unit their log printed (``shown`` / ``showing``: the unit of the
figures of the command being judged, set for the length of one command).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    """A figure's unit: ``name`` as the log prints it; ``scale``: a rate's figure times it is
    a count per second, a time's figure times it is seconds; ``lower_is_better``: a time."""

    name: str
    scale: float = 1.0
    lower_is_better: bool = False

    @property
    def tokens(self) -> bool:
        """Tokens per second: shown as Ktok/s, as every table always has."""
        return not self.lower_is_better and "tok" in self.name.lower()

    def rate(self, figure: float) -> float:
        """The engine's number (higher is better) for ``figure`` in this unit."""
        if self.lower_is_better:
            return 1.0 / (figure * self.scale) if figure > 0 else float("inf")
        return figure * self.scale

    def figure(self, rate: float) -> float:
        """The figure in this unit for the engine's ``rate``."""
        if self.lower_is_better:
            return 1.0 / (rate * self.scale) if rate > 0 else float("inf")
        return rate / self.scale

    def label(self) -> str:
        """The unit as tables head their figures: ``Ktok/s`` for tokens, else its name."""
        return "Ktok/s" if self.tokens else self.name

    def show(self, rate: float) -> str:
        """``120`` (in ``ms``), ``3.21``: three significant digits, no unit."""
        value = self.figure(rate)
        if value >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}"

    def direction(self) -> str:
        return "lower is better" if self.lower_is_better else "higher is better"


TOKENS = Unit("tok/s")
STEPS = Unit("steps/s")  # the probe's own timing of the optimizer's steps

# Time units, seconds per unit.
_TIMES = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
}
_TIME_WORD = "|".join(sorted((re.escape(k) for k in _TIMES), key=len, reverse=True))
# "ms", "s/it", "sec/iter", "ms/step", "s per batch": a time (per something).
_TIME = re.compile(rf"^(?P<t>{_TIME_WORD})(?:\s*(?:/|per\s+)\s*(?P<per>[A-Za-z_]+))?$")
# "tok/s", "Ktok/s", "it/s", "samples/sec", "images per second", "steps/s": a rate.
_RATE = re.compile(
    r"^(?P<k>[KkMmGg]?)(?P<what>[A-Za-z_%][\w%-]*)\s*(?:/|per\s+)\s*"
    r"(?P<t>s|sec|secs|second|seconds|min|minute|h|hr|hour)$"
)
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_unit(text: str) -> Unit | None:
    """The unit ``text`` names (``ms``, ``s/it``, ``Ktok/s``, ``it/s``, ``samples/sec``,
    ``%``, ``mfu``...), or None when it names none this knows. A bare word that is no time
    (``tokens``, ``loss``) is None: its direction cannot be told."""
    raw = text.strip()
    if raw == "%":
        return Unit("%")
    found = _TIME.match(raw)
    if found is not None:
        return Unit(raw, _TIMES[found.group("t")], lower_is_better=True)
    found = _RATE.match(raw)
    if found is not None:
        per = _TIMES[found.group("t")]
        k = found.group("k").lower()
        what = found.group("what")
        if k and not re.match(r"(?i)tok|token|sample|example|image|img|step|it|seq|frame", what):
            # "ms/s" is not milli-something: only a count's K/M/G prefix is a prefix
            what, k = found.group("k") + what, ""
        return Unit(raw, _PREFIX.get(k, 1.0) / per)
    return None


# One slot per ``showing`` block, innermost last (``show_as`` fills the innermost).
_SHOWN: list[list[Unit]] = []
_SHOWN_LOCK = threading.Lock()


def shown() -> Unit:
    """The unit figures are shown in now (``showing``); tokens per second by default."""
    with _SHOWN_LOCK:
        return _SHOWN[-1][0] if _SHOWN else TOKENS


@contextlib.contextmanager
def showing(unit: Unit | None = None) -> Iterator[None]:
    """Figures shown in ``unit`` for the length of one command (None: tokens per second
    until a recognized log says otherwise, ``show_as``)."""
    slot = [unit or TOKENS]
    with _SHOWN_LOCK:
        _SHOWN.append(slot)
    try:
        yield
    finally:
        with _SHOWN_LOCK:
            _SHOWN[:] = [s for s in _SHOWN if s is not slot]


def show_as(unit: Unit) -> None:
    """Within the current ``showing`` block, figures are shown in ``unit`` from now on: the
    unit a recognized log turned out to print (``metric.recognize``). Outside one: nothing."""
    with _SHOWN_LOCK:
        if _SHOWN:
            _SHOWN[-1][0] = unit
