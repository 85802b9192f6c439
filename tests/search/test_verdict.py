"""Samples → verdicts: noise estimate, band, threshold."""

from __future__ import annotations

import math
import random

import pytest

from envbisect.search.verdict import Judge, Noise, Verdict, default_threshold, median, ratio


def lognormal(rng: random.Random, centre: float, cv: float, n: int) -> list[float]:
    sigma = math.sqrt(math.log1p(cv**2))
    return [centre * math.exp(rng.gauss(0.0, sigma)) for _ in range(n)]


def test_median_odd_even_and_empty() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_ratio_is_good_over_bad_and_none_without_samples() -> None:
    assert ratio([12.0, 12.0, 12.0], [4.0, 4.0, 4.0]) == pytest.approx(3.0)
    assert ratio([12.0], []) is None


@pytest.mark.parametrize("cv", [0.05, 0.10, 0.20])
def test_noise_recovers_the_cv_of_many_states(cv: float) -> None:
    rng = random.Random(7)
    groups = [lognormal(rng, rng.choice([4000.0, 12000.0]), cv, 5) for _ in range(200)]
    noise = Noise.from_groups(groups)
    # Residuals around a group median underestimate a little; the prior barely matters here.
    assert 0.8 * cv < noise.sigma < 1.15 * cv
    assert noise.dof == 200 * 4


def test_identical_samples_do_not_claim_zero_noise() -> None:
    noise = Noise.from_groups([[100.0] * 3, [50.0] * 3])
    assert 0.0 < noise.sigma < 0.03
    assert Noise.from_groups([]).sigma == pytest.approx(0.03)


def test_one_stray_sample_widens_the_noise_only_a_little() -> None:
    rng = random.Random(3)
    groups = [lognormal(rng, 1000.0, 0.05, 5) for _ in range(20)]
    clean = Noise.from_groups(groups).sigma
    groups[0] = [*groups[0][:4], 100.0]  # a 10x stall, e.g. a recompile
    stray = Noise.from_groups(groups).sigma
    unclipped = math.sqrt(clean**2 + math.log(10) ** 2 / (20 * 4 + 3))
    assert clean < stray < unclipped


def test_judge_calls_far_medians_and_leaves_close_ones_unresolved() -> None:
    judge = Judge(threshold=8000.0, noise=Noise(sigma=0.05))
    assert judge.verdict([12000.0, 12100.0, 11900.0]) is Verdict.GOOD
    assert judge.verdict([4000.0, 4100.0, 3900.0]) is Verdict.BAD
    assert judge.verdict([8200.0, 8100.0, 8300.0]) is Verdict.UNRESOLVED
    assert judge.verdict([]) is Verdict.UNRESOLVED


def test_band_narrows_with_samples_but_never_below_the_minimum() -> None:
    judge = Judge(threshold=1000.0, noise=Noise(sigma=0.05))
    assert judge.band(1) > judge.band(3) > judge.band(9)
    quiet = Judge(threshold=1000.0, noise=Noise(sigma=0.0))
    assert quiet.band(100) == quiet.min_band
    # 1% above the threshold is inside the minimum band however many samples agree.
    assert quiet.verdict([1010.0] * 50) is Verdict.UNRESOLVED


def test_threshold_uncertainty_widens_the_band() -> None:
    loose = Judge(threshold=1000.0, noise=Noise(sigma=0.05), threshold_se=0.05)
    tight = Judge(threshold=1000.0, noise=Noise(sigma=0.05))
    assert loose.band(9) > tight.band(9)
    samples = [1100.0] * 9
    assert tight.verdict(samples) is Verdict.GOOD
    assert loose.verdict(samples) is Verdict.UNRESOLVED


def test_needs_more_stops_at_the_cap_or_when_settled() -> None:
    judge = Judge(threshold=1000.0, noise=Noise(sigma=0.05))
    close = [1040.0, 1030.0, 1050.0]
    assert judge.needs_more(close, cap=9)
    assert not judge.needs_more(close, cap=3)
    assert not judge.needs_more([2000.0, 2000.0, 2000.0], cap=9)


def test_default_threshold_is_the_geometric_mean_with_its_error() -> None:
    noise = Noise(sigma=0.1)
    thr, se = default_threshold([12000.0] * 3, [3000.0] * 3, noise)
    assert thr == pytest.approx(6000.0)
    _, se9 = default_threshold([12000.0] * 9, [3000.0] * 9, noise)
    assert se > se9 > 0


def test_the_sample_cap_grows_by_a_process_where_each_gave_the_caps_worth() -> None:
    from envbisect.search.verdict import BULK_PROCESSES, more_wanted, sample_cap

    assert sample_cap(3, 1, 9) == 9 and sample_cap(8, 4, 9) == 9  # below the cap: the cap
    assert sample_cap(20, 1, 9) == 21 and sample_cap(40, 2, 9) == 41  # one process more
    assert sample_cap(60, BULK_PROCESSES, 9) == 9  # and no more than that
    assert [more_wanted(n, 9) for n in (3, 7, 8, 9, 20)] == [2, 2, 1, 2, 2]
