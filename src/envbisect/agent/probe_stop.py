"""End a long training run once its rate is known (stdlib only, Python 3.8+ syntax; shipped
in the probe's bootstrap as ``_envbisect_probe_stop``).

A user bisects with their real training command: nanoGPT's default is 5,000 iterations,
and a trial needs its rate, not its model. After each timed step (``probe_steps``) the rule
below is checked; once it holds, the probe flushes the program's output, delivers its facts
and ends the process with exit status 0 (``stopped_early`` in the facts says when and why):
not a crash.

The rule (``stop`` in the probe's config, set by the host):

- warm-up: the first third of the steps so far are left out, as the host leaves them out;
- at least ``min_steps`` kept steps spanning ``min_kept_s`` seconds (sub-millisecond steps
  drift with caches and clocks more than their count shows), none of them holding a
  compile (a state still compiling or recompiling is not cut early), and the kept steps'
  median known within ``tolerance`` (the half-width of its 95% interval, from their
  interquartile range, over the median);
- where the figure is the log's (``figure``: the regexes it is read with), at least
  ``min_lines`` of its lines written, so the host has samples of its own figure; where no
  line of any has been written by then, the probe's steps are the figure, unless the regex
  was typed (``require_lines``: a figure printed only at exit keeps the run whole);
- or, whatever the rule says: ``max_steps`` steps (``--steps``), or ``max_s`` seconds of the
  program once it timed a step (``--max-trial-s``).

One process of several ranks (``WORLD_SIZE`` > 1) is never ended alone: the others would
wait on it in their next collective.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import sys
import threading
import time

STOP: dict = {"rule": None, "fn": None, "lines": 0, "said": None}
_LOCK = threading.Lock()


def configure(config, stop_fn):
    """Read ``stop`` from the probe's config; ``stop_fn(why)`` ends the process."""
    rule = config.get("stop") if isinstance(config, dict) else None
    if not isinstance(rule, dict):
        return
    if int(os.environ.get("WORLD_SIZE") or 1) > 1:
        return
    patterns = []
    for text in rule.get("figure") or ():
        with contextlib.suppress(re.error, TypeError):
            patterns.append(re.compile(text))
    rule["patterns"] = patterns
    STOP["rule"], STOP["fn"] = rule, stop_fn
    if patterns:
        sys.stdout = _Counting(sys.stdout, patterns)
        sys.stderr = _Counting(sys.stderr, patterns)


class _Counting:
    """A text stream that counts the figure's lines written through it (tqdm's ``\\r``
    refreshes included), forwarding everything else as it is."""

    def __init__(self, stream, patterns):
        self._stream = stream
        self._patterns = patterns

    def write(self, text):
        if isinstance(text, str) and text:
            found = max(len(p.findall(text)) for p in self._patterns)
            if found:
                with _LOCK:
                    STOP["lines"] += found
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def check(ends, compiles, t0):
    """After a step end: end the process when the rule holds (``ends``: the timed source's
    step ends, ``compiles``: compile spans, both from ``t0``)."""
    rule = STOP["rule"]
    if rule is None or STOP["said"] is not None or len(ends) < 3:
        return
    why = _why(rule, ends, compiles, t0)
    if why is not None:
        STOP["said"] = {"at_step": len(ends), "why": why}
        STOP["fn"](why)


def _why(rule, ends, compiles, t0):
    n = len(ends)
    if rule.get("max_steps") and n >= int(rule["max_steps"]):
        return f"--steps {rule['max_steps']}"
    if rule.get("max_s") and time.perf_counter() - t0 >= float(rule["max_s"]):
        return f"--max-trial-s {rule['max_s']}"
    times = [ends[i + 1] - ends[i] for i in range(len(ends) - 1)]
    kept = times[len(times) // 3 :]
    if len(kept) < int(rule.get("min_steps") or 20):
        return None
    if sum(kept) < float(rule.get("min_kept_s") or 0):
        return None  # a few ms of steps: too short for the machine's own drift to average
    start = ends[len(ends) - len(kept) - 1]
    if any(end > start for _s, end in compiles):
        return None  # compiled inside the kept steps: not steady yet
    lines, least = STOP["lines"], int(rule.get("min_lines") or 6)
    if rule.get("patterns") and lines < least and (lines or rule.get("require_lines")):
        return None  # the log's figure has too few lines yet (a typed regex needs them)
    mid = statistics.median(kept)
    ordered = sorted(kept)
    iqr = ordered[(3 * len(ordered)) // 4] - ordered[len(ordered) // 4]
    half = 1.96 * 1.2533 * (iqr / 1.349) / (len(kept) ** 0.5)
    if mid <= 0 or half / mid > float(rule.get("tolerance") or 0.03):
        return None
    return f"rate known: {len(kept)} steps, median within ±{100 * half / mid:.1f}%"


def facts():
    """``{"stopped_early": {at_step, why}}`` when the probe ended the run, else {}."""
    return {"stopped_early": STOP["said"]} if STOP["said"] is not None else {}
