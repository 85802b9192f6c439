"""Samples → verdict: is a measured state good, bad, or too close to call?

Throughput noise on a training box is multiplicative (a 5% jitter at 12 Ktok/s is 600 tok/s,
at 4 Ktok/s it is 200), so everything here works on the logarithm of the samples: the spread
of log-samples is (for small values) the coefficient of variation, and a threshold band in
log space is a relative band.

Public API:

- ``Verdict``: ``GOOD`` / ``BAD`` / ``UNRESOLVED`` (higher throughput is good).
- ``Noise.from_groups(groups)``: the pooled, winsorised log-spread of repeated samples of
  several states (one group per state), shrunk towards a small prior so that three identical
  samples do not claim perfect precision.
- ``Judge(threshold, noise, threshold_se)``: ``verdict(samples)`` calls a state good or bad
  only when its median lies outside the noise band around the threshold; the band narrows
  as samples accumulate (standard error of a median) and never gets below ``min_band``.
  ``needs_more(samples, cap)`` says whether another sample could still settle it.
- ``default_threshold(good, bad, noise)``: the geometric mean of the two endpoint medians,
  with its own standard error (it is estimated from noisy samples too).
- ``median``, ``ratio``: small helpers the search and renderers share.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum


class Verdict(str, Enum):
    """What one measured state says about the regression."""

    GOOD = "good"
    BAD = "bad"
    UNRESOLVED = "unresolved"


# The standard error of a sample median is about sqrt(pi/2) times that of the mean
# (normal noise); using it for every n errs on the wide, safe side for small n.
_MEDIAN_SE = math.sqrt(math.pi / 2)
# A throughput of 0 (a stalled run) has no logarithm; clamp instead of failing.
_FLOOR = 1e-9


def median(samples: Sequence[float]) -> float:
    """The median of non-empty samples."""
    if not samples:
        raise ValueError("median of no samples")
    xs = sorted(samples)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def ratio(good: Sequence[float], bad: Sequence[float]) -> float | None:
    """How many times slower ``bad`` is than ``good`` (median over median); None if unknown."""
    if not good or not bad:
        return None
    return median(good) / max(median(bad), _FLOOR)


def _logs(samples: Iterable[float]) -> list[float]:
    return [math.log(max(float(x), _FLOOR)) for x in samples]


@dataclass(frozen=True)
class Noise:
    """Multiplicative measurement noise: the standard deviation of log-samples.

    ``dof`` counts the degrees of freedom that came from data (the prior's are not included).
    """

    sigma: float
    dof: int = 0

    @classmethod
    def from_groups(
        cls,
        groups: Iterable[Sequence[float]],
        *,
        prior_sigma: float = 0.03,
        prior_dof: int = 3,
    ) -> Noise:
        """Pool the spread of several states' repeated samples (each group: one state).

        Residuals are taken around each group's median; a residual further out than four
        robust (MAD-based) standard deviations is clipped there, so one stray sample (a
        compile hiccup) widens the band a little rather than a lot. The prior keeps three
        identical samples from claiming zero noise.
        """
        residuals: list[float] = []
        dof = 0
        for group in groups:
            if len(group) < 2:
                continue
            logs = _logs(group)
            centre = median(logs)
            residuals.extend(x - centre for x in logs)
            dof += len(logs) - 1
        ss = prior_dof * prior_sigma**2
        if residuals:
            nonzero = sorted(abs(r) for r in residuals if r != 0.0)
            if nonzero:
                robust = 1.4826 * median(nonzero)
                clip = 4.0 * robust
                residuals = [max(-clip, min(clip, r)) for r in residuals]
            ss += sum(r * r for r in residuals)
        total = prior_dof + dof
        return cls(sigma=math.sqrt(ss / total) if total else prior_sigma, dof=dof)

    def median_se(self, n: int) -> float:
        """Standard error (log space) of the median of ``n`` samples."""
        return _MEDIAN_SE * self.sigma / math.sqrt(max(n, 1))


@dataclass(frozen=True)
class Judge:
    """Turns a state's samples into a verdict against a throughput threshold.

    A median more than ``band(n)`` (log space, i.e. relative) above the threshold is good,
    that far below is bad, anything in between is unresolved. ``band(n)`` is ``z`` standard
    errors of the difference between the state's median and the threshold, never less than
    ``min_band``.
    """

    threshold: float
    noise: Noise
    threshold_se: float = 0.0
    z: float = 2.5
    min_band: float = 0.02

    def band(self, n: int) -> float:
        se = math.hypot(self.noise.median_se(n), self.threshold_se)
        return max(self.min_band, self.z * se)

    def distance(self, samples: Sequence[float]) -> float:
        """log(median / threshold): positive is faster than the threshold."""
        return math.log(max(median(samples), _FLOOR)) - math.log(self.threshold)

    def verdict(self, samples: Sequence[float]) -> Verdict:
        if not samples:
            return Verdict.UNRESOLVED
        d = self.distance(samples)
        b = self.band(len(samples))
        if d > b:
            return Verdict.GOOD
        if d < -b:
            return Verdict.BAD
        return Verdict.UNRESOLVED

    def needs_more(self, samples: Sequence[float], cap: int) -> bool:
        """True while the median sits inside the band and the sample cap is not reached."""
        return len(samples) < cap and self.verdict(samples) is Verdict.UNRESOLVED


# Processes a state inside the noise band may take when each gives the sample cap's worth.
BULK_PROCESSES = 3


def sample_cap(samples: int, runs: int, max_samples: int) -> int:
    """The samples a state may grow to: ``max_samples``; or, once its ``runs`` processes
    gave that many between them (a probe's timed steps, a log's lines: several a process),
    one process more, up to ``BULK_PROCESSES`` in all: one process's spread alone cannot
    settle a state, nor tell its figure from the next process's (found as a user: "within
    the noise after 20 samples", one process a state)."""
    if samples >= max_samples and runs < BULK_PROCESSES:
        return samples + 1
    return max_samples


def more_wanted(samples: int, max_samples: int) -> int:
    """How many samples the next call asks for: up to two below the cap; two past it (a
    process asked for one gives its figure alone, not its steps)."""
    return min(2, max_samples - samples) if samples < max_samples else 2


def default_threshold(
    good: Sequence[float], bad: Sequence[float], noise: Noise
) -> tuple[float, float]:
    """Geometric mean of the endpoint medians, and its standard error in log space."""
    g, b = median(good), max(median(bad), _FLOOR)
    se = 0.5 * math.hypot(noise.median_se(len(good)), noise.median_se(len(bad)))
    return math.sqrt(g * b), se
