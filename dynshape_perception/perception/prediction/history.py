"""Resample track histories to the predictor's step and pack them into a padded batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dynshape_perception.errors import (
    BoundError,
    ConfigError,
    DataError,
    InputValueError,
    ShapeError,
)

# Per track id: its annotated frames and their (x, y) positions.
Tracks = Mapping[int, tuple[np.ndarray, np.ndarray]]
PREDICTOR_STEP_S = 0.4
# Float error in ``end - k * step`` must not drop the sample that lands on the first stamp.
STAMP_TOLERANCE_S = 1e-6


# Positions are float32 on output: a finite float64 beyond this would become inf.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _numeric(name: str, values: object) -> np.ndarray:
    """As float64, refusing strings, objects and bools rather than coercing them."""
    array = np.asarray(values)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.number):
        raise ShapeError(f"{name} must hold numbers, got dtype {array.dtype}")
    return array.astype(np.float64)


def _check_track(stamps_s: np.ndarray, xy: np.ndarray) -> None:
    if stamps_s.ndim != 1 or stamps_s.shape[0] < 1:
        raise ShapeError(f"stamps_s must be a non-empty 1-D array, got shape {stamps_s.shape}")
    if xy.shape != (stamps_s.shape[0], 2):
        raise ShapeError(f"xy must have shape ({stamps_s.shape[0]}, 2), got {xy.shape}")
    if not (np.isfinite(stamps_s).all() and np.isfinite(xy).all()):
        raise InputValueError("track history holds non-finite stamps or positions")
    if xy.size and np.abs(xy).max() > FLOAT32_MAX:
        raise InputValueError("track history holds positions beyond float32 range")
    if stamps_s.shape[0] > 1 and not (np.diff(stamps_s) > 0.0).all():
        first_bad = int(np.flatnonzero(np.diff(stamps_s) <= 0.0)[0]) + 1
        raise InputValueError(
            f"history stamps must be strictly increasing; stamp {first_bad} "
            f"({stamps_s[first_bad]:.6f} s) follows {stamps_s[first_bad - 1]:.6f} s"
        )


def resample_history(
    stamps_s: np.ndarray,
    xy: np.ndarray,
    *,
    num_steps: int,
    step_s: float = PREDICTOR_STEP_S,
    end_stamp_s: float | None = None,
) -> tuple[np.ndarray, int]:
    """Interpolate a track at ``end, end - step, ...``, at most ``num_steps`` samples.

    The track may be recorded at any rate. ``end_stamp_s`` defaults to the newest stamp and
    must lie inside the recorded span: samples are never extrapolated on either side, so
    the result covers only as far back as the first stamp. Returns the samples oldest first,
    as float32 ``[L, 2]``, and ``L``.
    """
    if not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise ConfigError(f"num_steps must be a positive integer, got {num_steps!r}")
    if isinstance(step_s, bool) or not isinstance(step_s, (int, float, np.floating, np.integer)):
        raise ConfigError(f"step_s must be a number of seconds, got {step_s!r}")
    if not (np.isfinite(step_s) and step_s > 0.0):
        raise ConfigError(f"step_s must be a positive number of seconds, got {step_s!r}")
    stamps = _numeric("stamps_s", stamps_s)
    points = _numeric("xy", xy)
    _check_track(stamps, points)
    first, last = float(stamps[0]), float(stamps[-1])
    end = last if end_stamp_s is None else float(end_stamp_s)
    if not (first - STAMP_TOLERANCE_S <= end <= last + STAMP_TOLERANCE_S):
        raise InputValueError(
            f"end_stamp_s {end:.6f} s lies outside the recorded span "
            f"[{first:.6f}, {last:.6f}] s; resampling never extrapolates"
        )
    end = min(max(end, first), last)
    steps = (end - first) / step_s
    if not np.isfinite(steps):
        raise ConfigError(f"step_s {step_s!r} s is too small for a {end - first:.6f} s span")
    span_steps = int(np.floor(steps + STAMP_TOLERANCE_S))
    length = min(int(num_steps), span_steps + 1)
    targets = end - step_s * np.arange(length - 1, -1, -1, dtype=np.float64)
    targets = np.clip(targets, first, last)
    out = np.empty((length, 2), dtype=np.float32)
    out[:, 0] = np.interp(targets, stamps, points[:, 0])
    out[:, 1] = np.interp(targets, stamps, points[:, 1])
    return out, length


def pack_histories(
    histories: Sequence[np.ndarray], num_steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Pack ``[L_i, 2]`` histories left-aligned, zero-padded, into float32 ``[A, T, 2]``.

    Returns the batch and the int32 lengths ``[A]``; a history longer than T raises.
    """
    if not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise ConfigError(f"num_steps (T) must be a positive integer, got {num_steps!r}")
    parts = []
    for agent, item in enumerate(histories):
        points = _numeric(f"history {agent}", item)
        if points.ndim != 2 or points.shape[1] != 2:
            raise ShapeError(f"history {agent} must have shape [L, 2], got {points.shape}")
        if points.shape[0] > num_steps:
            raise BoundError(
                f"history {agent} has {points.shape[0]} steps, above the bound T={num_steps}"
            )
        if not np.isfinite(points).all() or (points.size and np.abs(points).max() > FLOAT32_MAX):
            raise InputValueError(f"history {agent} holds non-finite or out-of-range positions")
        parts.append(points)
    lengths = np.fromiter((len(p) for p in parts), np.int32, len(parts))
    rows = np.concatenate(parts) if parts else np.zeros((0, 2), np.float64)
    return pad_histories(rows, lengths, int(num_steps)), lengths


def pad_histories(rows: np.ndarray, lengths: np.ndarray, num_steps: int) -> np.ndarray:
    """Histories given one after another (``rows`` ``[sum L, 2]``, ``lengths`` ``[A]``, each
    at most ``num_steps``), left-aligned and zero-padded into float32 ``[A, num_steps, 2]``."""
    count = lengths.size
    agent = np.repeat(np.arange(count), lengths)
    step = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    batch = np.zeros((count, num_steps, 2), np.float32)
    batch[agent, step] = rows
    return batch


def detect_frame_step(tracks: Tracks) -> int:
    """The scene's annotation step: the most common positive frame difference within tracks."""
    diffs = [np.diff(np.asarray(frames, dtype=np.int64)) for frames, _ in tracks.values()]
    pooled = np.concatenate(diffs) if diffs else np.zeros(0, dtype=np.int64)
    pooled = pooled[pooled > 0]
    if pooled.size == 0:
        raise DataError("cannot detect the frame step: no track has two annotated frames")
    values, counts = np.unique(pooled, return_counts=True)
    return int(values[np.argmax(counts)])
