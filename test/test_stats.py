"""The shared statistics helper: percentiles, bootstrap intervals and verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynshape_perception import stats


def test_percentiles_interpolate_and_an_empty_sample_has_none() -> None:
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert stats.percentile_or_none([0.0, 1.0], 99, digits=2) == 0.99
    assert stats.percentile_or_none([], 50) is None
    assert stats.median([3, 1, 2]) == 2.0
    mask = np.array([True, False, True])
    assert stats.masked_percentile([10.0, 1000.0, 30.0, 5000.0], mask, 100) == 30.0


def test_percentiles_match_numpy_to_the_bit_on_random_samples() -> None:
    rng = np.random.default_rng(7)
    qs = (0, 1, 2.5, 12.345, 25, 50, 75, 90, 97.5, 99, 99.9, 100)
    for i in range(600):
        n = int(rng.integers(1, 400)) if i % 50 else 20_000
        sample: np.ndarray
        if i % 3 == 0:
            sample = rng.random(n) * float(rng.choice([1e-3, 1.0, 1e6]))
        elif i % 3 == 1:
            # Ties and repeated values: latencies rounded to a coarse clock.
            sample = rng.integers(0, 5, n).astype(np.float64) * 0.1
        else:
            sample = np.round(rng.lognormal(1.0, 1.0, n), 3)
        assert stats.percentiles(sample, qs) == [float(np.percentile(sample, q)) for q in qs]
        rounded = [stats.percentile_or_none(sample, q) for q in qs]
        assert stats.percentiles_or_none(sample, qs) == rounded
        assert rounded == [round(float(np.percentile(sample, q)), stats.DIGITS) for q in qs]


def test_percentiles_follow_numpy_on_non_finite_samples_and_refuse_bad_input() -> None:
    qs = (0, 50, 99, 100)
    for sample in ([1.0, math.nan, 2.0], [1.0, math.inf, 3.0], [-math.inf, 1.0, 2.0]):
        with np.errstate(invalid="ignore"):
            want = [float(np.percentile(sample, q)) for q in qs]
        got = stats.percentiles(sample, qs)
        assert [math.isnan(v) for v in got] == [math.isnan(v) for v in want]
        assert [v for v in got if not math.isnan(v)] == [v for v in want if not math.isnan(v)]
    assert stats.percentiles_or_none([], qs) == [None] * 4
    with pytest.raises(ValueError, match="empty"):
        stats.percentiles([], qs)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        stats.percentiles([1.0], (101,))


def test_median_matches_numpy_to_the_bit_zero_signs_and_nan_included() -> None:
    rng = np.random.default_rng(11)
    for i in range(600):
        sample = rng.random(int(rng.integers(1, 1200))) * float(rng.choice([1e-3, 1.0, 1e6]))
        if i % 2:
            sample = np.round(sample - sample.mean(), 2)
        assert stats.median(sample) == float(np.median(sample))
    for zeros in ([-0.0], [-0.0, -0.0], [-0.0, 1.0, -0.0]):
        assert math.copysign(1.0, stats.median(zeros)) == math.copysign(1.0, np.median(zeros))
        got = stats.percentiles(zeros, (0, 50, 100))
        want = [float(np.percentile(zeros, q)) for q in (0, 50, 100)]
        assert [math.copysign(1.0, v) for v in got] == [math.copysign(1.0, v) for v in want]
    assert math.isnan(stats.median([1.0, math.nan, 2.0]))
    assert stats.median([1.0, math.inf]) == math.inf


def test_latency_stats_are_rounded_and_zero_for_no_samples() -> None:
    assert stats.latency_stats([]) == {"mean_ms": 0.0, "p50_ms": 0.0, "p99_ms": 0.0}
    got = stats.latency_stats(float(v) for v in range(1, 101))
    assert got == {"mean_ms": 50.5, "p50_ms": 50.5, "p99_ms": 99.01}


def test_bootstrap_is_seeded_and_the_central_interval_holds_the_mean() -> None:
    sample = np.random.default_rng(1).normal(5.0, 1.0, size=200)
    means = stats.bootstrap_means(sample, resamples=2000, seed=3)
    assert np.array_equal(means, stats.bootstrap_means(sample, resamples=2000, seed=3))
    assert not np.array_equal(means, stats.bootstrap_means(sample, resamples=2000, seed=4))
    low, high = stats.central_interval(means, 0.95)
    assert low < sample.mean() < high
    # The standard error of the mean of 200 draws of unit spread is about 0.07.
    assert 0.15 < high - low < 0.45


def test_geomean_interval_brackets_the_mean_and_needs_two_ratios() -> None:
    mean, low, high = stats.geomean_ci([2.0, 8.0])
    assert mean == pytest.approx(4.0)
    assert low is not None and high is not None and low <= mean <= high
    assert stats.geomean_ci([3.0]) == (pytest.approx(3.0), None, None)
    row = stats.geomean_row([1.0, 1.0, 1.0], 3)
    assert row == {"geomean": 1.0, "ci95": [1.0, 1.0]}
    assert math.isclose(stats.geomean_ci([0.5, 2.0])[0], 1.0)


@pytest.mark.parametrize(
    ("interval", "expected"),
    [([0.5, 0.9], "met"), ([1.1, 1.3], "missed"), ([0.9, 1.1], "undecided"), (None, "undecided")],
)
def test_verdict_reads_the_whole_interval_against_the_bound(
    interval: list[float] | None, expected: str
) -> None:
    assert stats.verdict(interval, 1.0) == expected
