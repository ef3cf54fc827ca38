"""Far fragments of one object join their nearest cluster; near ones and two objects stay apart."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.clustering import (
    ClusterParams,
    cluster_obstacles,
    size_label,
)
from dynshape_perception.perception.fragments import merge_fragments
from dynshape_perception.perception.records import LABEL_CAR, LABEL_PEDESTRIAN, OBSTACLE_DTYPE

CELL = 0.15
GAP_RAD = 0.03


def _boxes(*rows: tuple[float, ...]) -> np.ndarray:
    """Boxes at (x, y) of length x width (yaw 0 unless given), 1.45 m tall, 5 points each,
    nearest first."""
    out = np.zeros(len(rows), OBSTACLE_DTYPE)
    for i, (x, y, length, width, *yaw) in enumerate(rows):
        out[i] = (x, y, -1.0, length, width, 1.45, yaw[0] if yaw else 0.0, 0.9, 0, 5)
    out["label"] = size_label(out["length"], out["width"], out["height"])
    return out[np.argsort(np.hypot(out["x"], out["y"]), kind="stable")]


def test_the_columns_of_a_far_car_side_join_its_end() -> None:
    # A car 48 m out seen at a grazing angle: its back (1.8 m across) and a column of its
    # side every 1.2 m, each one cell that the size rule calls a pedestrian.
    back = (46.0, -6.0, 1.8, CELL, np.pi / 2)
    boxes = _boxes(back, (47.3, -5.2, CELL, CELL), (48.5, -5.2, CELL, CELL))
    assert (boxes["label"] == LABEL_PEDESTRIAN).sum() == 2
    merged = merge_fragments(boxes, CELL, GAP_RAD, size_label)
    assert merged.shape == (1,) and merged["label"][0] == LABEL_CAR
    assert merged["num_points"][0] == 15
    assert merged["length"][0] == pytest.approx(2.65, abs=0.01)
    assert merged["width"][0] == pytest.approx(1.8, abs=0.01)


def test_near_fragments_and_whole_objects_stay_apart() -> None:
    # At 10 m the allowed gap is 0.3 m: a cell 1.2 m from a car is its own cluster.
    near = _boxes((10.0, 0.0, 4.4, 1.8), (12.9, 0.0, CELL, CELL))
    np.testing.assert_array_equal(merge_fragments(near, CELL, GAP_RAD, size_label), near)
    # Two pedestrians 50 m out, 0.8 m apart, are no fragments.
    pair = _boxes((50.0, 0.0, 0.5, 0.4), (50.0, 0.8, 0.5, 0.4))
    np.testing.assert_array_equal(merge_fragments(pair, CELL, GAP_RAD, size_label), pair)
    np.testing.assert_array_equal(merge_fragments(pair, CELL, 0.0, size_label), pair)


def test_a_fragment_between_two_cars_joins_one_only() -> None:
    boxes = _boxes((40.0, 0.0, 4.4, 1.8), (43.0, 0.0, CELL, CELL), (46.5, 0.0, 4.4, 1.8))
    merged = merge_fragments(boxes, CELL, GAP_RAD, size_label)
    assert merged.shape == (2,)
    assert sorted(merged["num_points"].tolist()) == [5, 10]


def test_the_clustering_joins_far_columns_of_points() -> None:
    # Three columns of returns 45 m out, 1 m apart (more than the closing bridges).
    z = np.linspace(-1.5, -0.3, 6)
    columns = [np.c_[np.full(6, 45.0 + k), np.full(6, 2.0), z, np.zeros(6)] for k in range(3)]
    points = np.concatenate(columns).astype(np.float32)
    scores = np.ones(points.shape[0], np.float32)
    apart = cluster_obstacles(points, scores, ClusterParams(fragment_gap_rad=0.0))
    joined = cluster_obstacles(points, scores, ClusterParams())
    assert apart.shape == (3,) and joined.shape == (1,)
    assert joined["num_points"][0] == 18 and joined["length"][0] == pytest.approx(2.15, abs=0.01)


def test_a_bad_gap_is_a_config_error() -> None:
    for bad in (-0.01, 0.5, float("nan")):
        with pytest.raises(ConfigError, match="fragment_gap_rad"):
            ClusterParams(fragment_gap_rad=bad)
