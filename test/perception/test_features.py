"""Tests of the association feature layout."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.errors import InputValueError, ShapeError
from dynshape_perception.perception.features import (
    ASSOC_FEATURES,
    obstacle_features,
)
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE


def _rows(dtype: np.dtype, yaw: list[float]) -> np.ndarray:
    rows = np.zeros(len(yaw), dtype=dtype)
    rows["x"] = np.arange(len(yaw)) + 1.0
    rows["y"] = -2.0
    rows["z"] = 0.5
    rows["length"], rows["width"], rows["height"] = 4.0, 1.8, 1.5
    rows["yaw"] = yaw
    return rows


def test_layout_and_values() -> None:
    feats = obstacle_features(_rows(OBSTACLE_DTYPE, [0.0, np.pi / 4]))
    assert ASSOC_FEATURES == 8
    assert feats.shape == (2, ASSOC_FEATURES) and feats.dtype == np.float32
    np.testing.assert_allclose(feats[:, :6], [[1, -2, 0.5, 4, 1.8, 1.5], [2, -2, 0.5, 4, 1.8, 1.5]])
    np.testing.assert_allclose(feats[:, 6:], [[1.0, 0.0], [0.0, 1.0]], atol=1e-6)


def test_yaw_is_taken_modulo_pi() -> None:
    yaw = [0.3, 0.3 + np.pi, 0.3 - np.pi]
    feats = obstacle_features(_rows(OBSTACLE_DTYPE, yaw))
    np.testing.assert_allclose(feats[1, 6:], feats[0, 6:], atol=1e-6)
    np.testing.assert_allclose(feats[2, 6:], feats[0, 6:], atol=1e-6)


def test_track_rows_and_empty() -> None:
    track_feats = obstacle_features(_rows(TRACK_DTYPE, [0.1]))
    obstacle_rows = obstacle_features(_rows(OBSTACLE_DTYPE, [0.1]))
    np.testing.assert_array_equal(track_feats, obstacle_rows)
    assert obstacle_features(np.zeros(0, dtype=OBSTACLE_DTYPE)).shape == (0, ASSOC_FEATURES)


def test_errors() -> None:
    bad = _rows(OBSTACLE_DTYPE, [0.0, 0.0])
    bad["x"][1] = np.nan
    with pytest.raises(InputValueError, match="rows \\[1\\]"):
        obstacle_features(bad)
    with pytest.raises(ShapeError, match="lack fields"):
        obstacle_features(np.zeros(3, dtype=[("x", "<f4"), ("y", "<f4")]))
    with pytest.raises(ShapeError, match="1-D"):
        obstacle_features(np.zeros((2, 2), dtype=OBSTACLE_DTYPE))
