"""Percentiles, medians and bootstrap intervals shared by the runtime's reports and the benches."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import ArrayLike

BOOTSTRAP_RESAMPLES = 10_000
# Figures in reports carry microsecond resolution on millisecond values.
DIGITS = 3


def percentile(values: ArrayLike, q: float) -> float:
    """The ``q``-th percentile (linear interpolation) of a non-empty sample."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def percentile_or_none(values: ArrayLike, q: float, digits: int = DIGITS) -> float | None:
    """``percentile`` rounded to ``digits``; None where the sample is empty."""
    data = np.asarray(values, dtype=np.float64)
    return round(percentile(data, q), digits) if data.size else None


def masked_percentile(values: ArrayLike, mask: np.ndarray, q: float) -> float:
    """``percentile`` over the entries the boolean ``mask`` selects from the start of ``values``."""
    data = np.asarray(values, dtype=np.float64)
    return percentile(data[: len(mask)][mask], q)


def median(values: ArrayLike) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64)))


def bootstrap_means(
    values: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> np.ndarray:
    """The means of ``resamples`` seeded resamples (with replacement) of a 1-D sample."""
    picks = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
    return np.asarray(values[picks].mean(axis=1))


def central_interval(samples: ArrayLike, level: float) -> tuple[float, float]:
    """The percentiles that hold the central ``level`` share of ``samples`` between them."""
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(np.asarray(samples, dtype=np.float64), [tail, 100.0 - tail])
    return float(low), float(high)


def latency_stats(values: Iterable[float]) -> dict[str, float]:
    """Mean, p50 and p99 in milliseconds, rounded; all 0 for an empty sample."""
    data = np.fromiter(values, dtype=np.float64)
    if data.size == 0:
        return {"mean_ms": 0.0, "p50_ms": 0.0, "p99_ms": 0.0}
    return {
        "mean_ms": round(float(data.mean()), DIGITS),
        "p50_ms": round(percentile(data, 50), DIGITS),
        "p99_ms": round(percentile(data, 99), DIGITS),
    }


def geomean_ci(
    ratios: Iterable[float], resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float | None, float | None]:
    """Geometric mean of positive ratios and its 95 % percentile-bootstrap interval (seeded,
    so a report is reproducible from its ratios); no interval from fewer than two."""
    logs = np.log(np.asarray(list(ratios), float))
    mean = float(np.exp(logs.mean()))
    if len(logs) < 2:
        return mean, None, None
    means = bootstrap_means(logs, resamples)
    low, high = np.exp(np.percentile(means, [2.5, 97.5]))
    return mean, float(low), float(high)


def geomean_row(ratios: list[float], digits: int) -> dict[str, float | list[float] | None]:
    """``geomean`` and ``ci95`` (None from one ratio) of ``geomean_ci``, rounded."""
    mean, low, high = geomean_ci(ratios)
    interval = None if low is None or high is None else [round(low, digits), round(high, digits)]
    return {"geomean": round(mean, digits), "ci95": interval}


def verdict(interval: list[float] | None, bound: float) -> str:
    """``met`` where the whole interval is at or below ``bound``, ``missed`` where it is all
    above, else ``undecided`` (as it is without an interval)."""
    if interval is None:
        return "undecided"
    low, high = interval
    if high <= bound:
        return "met"
    return "missed" if low > bound else "undecided"
