"""Percentiles, medians and bootstrap intervals shared by the runtime's reports and the benches."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike

BOOTSTRAP_RESAMPLES = 10_000
# Figures in reports carry microsecond resolution on millisecond values.
DIGITS = 3


def percentile(values: ArrayLike, q: float) -> float:
    """The ``q``-th percentile (linear interpolation) of a non-empty sample."""
    return percentiles(values, (q,))[0]


def percentile_or_none(values: ArrayLike, q: float, digits: int = DIGITS) -> float | None:
    """``percentile`` rounded to ``digits``; None where the sample is empty."""
    return percentiles_or_none(values, (q,), digits)[0]


def percentiles(values: ArrayLike, qs: Sequence[float]) -> list[float]:
    """``percentile`` at each of ``qs``, to the bit, from one partial sort of a non-empty sample.

    ``np.percentile`` costs some 50 microseconds a call before it touches the data, which
    made the small samples of a diagnostics snapshot cost more than their sorting.
    """
    data = np.asarray(values, dtype=np.float64).ravel()
    n = data.size
    if n == 0:
        raise ValueError("percentiles of an empty sample")
    # NumPy's linear method: the virtual index (n - 1) * q / 100 between its two neighbours,
    # both the last entry from n - 1 on (where NumPy's weight counts from index -1), and a
    # lerp that counts from the upper neighbour from a weight of 0.5 on.
    spots = []
    for q in qs:
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"percentiles lie in [0, 100], got {q}")
        virtual = (n - 1) * (q / 100.0)
        if virtual >= n - 1:
            spots.append((n - 1, n - 1, virtual + 1))
        else:
            low = math.floor(virtual)
            spots.append((low, low + 1, virtual - low))
    ordered = np.partition(data, sorted({n - 1, *(i for s in spots for i in s[:2])}))
    if math.isnan(ordered[n - 1]):
        return [math.nan] * len(spots)
    result = []
    for below, above, t in spots:
        a, b = float(ordered[below]), float(ordered[above])
        diff = b - a
        result.append(b - diff * (1 - t) if t >= 0.5 else a + diff * t)
    return result


def percentiles_or_none(
    values: ArrayLike, qs: Sequence[float], digits: int = DIGITS
) -> list[float | None]:
    """``percentiles`` rounded to ``digits``; all None where the sample is empty."""
    data = np.asarray(values, dtype=np.float64)
    if not data.size:
        return [None] * len(qs)
    return [round(v, digits) for v in percentiles(data, qs)]


def masked_percentile(values: ArrayLike, mask: np.ndarray, q: float) -> float:
    """``percentile`` over the entries the boolean ``mask`` selects from the start of ``values``."""
    data = np.asarray(values, dtype=np.float64)
    return percentile(data[: len(mask)][mask], q)


def median(values: ArrayLike) -> float:
    """``np.median``, to the bit, without its fixed cost per call (see ``percentiles``)."""
    data = np.asarray(values, dtype=np.float64).ravel()
    n = data.size
    if n == 0:
        return float(np.median(data))
    half = n // 2
    ordered = np.partition(data, sorted({half - 1 if n % 2 == 0 else half, half, n - 1}))
    if math.isnan(ordered[n - 1]):
        return math.nan
    # np.median's mean of the middle one or two, summed from 0.0 as NumPy's sum is: a
    # median of -0.0 comes out 0.0.
    if n % 2:
        return 0.0 + float(ordered[half])
    return (0.0 + float(ordered[half - 1]) + float(ordered[half])) / 2


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
