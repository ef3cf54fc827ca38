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
