"""A jumping cluster centre moves a track but changes its velocity by a bounded acceleration."""

from __future__ import annotations

from typing import TypedDict, Unpack

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.records import OBSTACLE_DTYPE
from dynshape_perception.perception.tracking import Tracker, TrackerParams, reference_affinity

DT = 0.1


def _walk(tracker: Tracker, xs: list[float], ys: list[float]) -> np.ndarray:
    tracks = np.zeros(0)
    for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
        row = np.zeros(1, OBSTACLE_DTYPE)
        row["x"], row["y"], row["z"] = x, y, -0.9
        row["length"], row["width"], row["height"] = 0.6, 0.6, 1.7
        row["score"], row["num_points"] = 0.9, 40
        tracks = tracker.update(row, k * DT)
    return tracks


class Tuning(TypedDict, total=False):
    max_acceleration_mps2: float


def _tracker(**params: Unpack[Tuning]) -> Tracker:
    return Tracker(reference_affinity, TrackerParams(min_hits_to_confirm=1, **params))


def test_steady_motion_keeps_its_velocity() -> None:
    xs = [20.0 + 1.4 * DT * k for k in range(8)]
    tracks = _walk(_tracker(), xs, [3.0] * 8)
    assert tracks["vx"][0] == pytest.approx(1.4, abs=1e-4)
    assert tracks["vy"][0] == pytest.approx(0.0, abs=1e-6)


def test_a_sideways_jump_of_the_centre_is_bounded() -> None:
    # Walking along x at 1.4 m/s; in the last scan the cluster merges with a neighbour's and
    # its centre jumps 0.45 m sideways (4.5 m/s in 0.1 s).
    xs = [20.0 + 1.4 * DT * k for k in range(8)]
    ys = [3.0] * 7 + [3.45]
    bounded = _walk(_tracker(), xs, ys)
    free = _walk(_tracker(max_acceleration_mps2=1000.0), xs, ys)
    assert bounded["y"][0] == pytest.approx(3.45, abs=1e-5)
    # Smoothing at 0.5: half of a change of at most 10 m/s2 * 0.1 s.
    assert bounded["vy"][0] == pytest.approx(0.5, abs=1e-4)
    assert free["vy"][0] == pytest.approx(2.25, abs=1e-3)


def test_a_bad_acceleration_is_a_config_error() -> None:
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match="max_acceleration_mps2"):
            TrackerParams(max_acceleration_mps2=bad)
