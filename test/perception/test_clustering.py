"""BEV clustering: one box per object, gap handling, ROI and ground, and the real KITTI scan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.config import Roi
from dynshape_perception.errors import ConfigError, ShapeError
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.clustering import (
    ClusterParams,
    cluster_obstacles,
    rows_to_score,
)
from dynshape_perception.perception.ground import GroundPlane, fit_ground_plane
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    OBSTACLE_DTYPE,
)
from dynshape_perception.tools.sim.scenes import driving_scene

GROUND_Z_M = -1.73
SPACING_M = 0.05
FLAT = GroundPlane(0.0, 0.0, 1.0, -GROUND_Z_M)


def _box_points(
    x: float, y: float, length: float, width: float, height: float, yaw: float = 0.0
) -> np.ndarray:
    """``[Q, 4]`` points every 5 cm round the sides of an upright box standing on z = -1.73."""
    per_side = [np.arange(0.0, side, SPACING_M) for side in (length, width, length, width)]
    starts = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * [length / 2, width / 2]
    steps = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]], dtype=float)
    ring = np.concatenate(
        [s + np.outer(t, d) for s, t, d in zip(starts, per_side, steps, strict=True)]
    )
    levels = np.r_[np.arange(0.2, height - 1e-6, 0.2), height]
    local = np.repeat(ring, levels.size, axis=0)
    z = np.tile(levels, ring.shape[0]) + GROUND_Z_M
    cos, sin = np.cos(yaw), np.sin(yaw)
    xy = local @ np.array([[cos, sin], [-sin, cos]]) + [x, y]
    return np.c_[xy, z, np.full(xy.shape[0], 0.5)]


def _yaw_error(a: float, b: float) -> float:
    return abs((a - b + np.pi / 2) % np.pi - np.pi / 2)


def _scene(*objects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    points = np.concatenate(objects).astype(np.float32)
    return points, np.ones(points.shape[0], dtype=np.float32)


def test_one_cluster_per_well_separated_box() -> None:
    specs = [
        (10.0, 5.0, 4.2, 1.8, 1.5, 0.3, LABEL_CAR),
        (15.0, -5.0, 0.6, 0.5, 1.7, 0.0, LABEL_PEDESTRIAN),
        (20.0, 2.0, 0.3, 0.3, 2.8, 0.0, LABEL_POLE),
        (30.0, -8.0, 4.5, 1.9, 1.6, -1.2, LABEL_CAR),
    ]
    objects = [_box_points(*spec[:6]) for spec in specs]
    points, scores = _scene(*objects)
    scores[: objects[0].shape[0]] = 0.9
    clusters = cluster_obstacles(points, scores, ClusterParams(), FLAT)
    assert clusters.dtype == OBSTACLE_DTYPE
    assert clusters.shape == (4,)
    # Nearest first.
    assert np.all(np.diff(np.hypot(clusters["x"], clusters["y"])) >= 0)
    for (x, y, length, width, height, yaw, label), obj in zip(specs, objects, strict=True):
        row = clusters[np.argmin(np.hypot(clusters["x"] - x, clusters["y"] - y))]
        assert np.hypot(row["x"] - x, row["y"] - y) < 0.1
        assert abs(row["length"] - length) < 0.1 and abs(row["width"] - width) < 0.1
        assert abs(row["height"] - height) < 1e-4
        assert abs(row["z"] - (GROUND_Z_M + height / 2)) < 1e-4
        assert row["label"] == label
        assert row["num_points"] == obj.shape[0]
        if length - width > 0.5:
            assert np.degrees(_yaw_error(float(row["yaw"]), yaw)) < 2.0
    assert np.isclose(
        clusters[np.argmin(np.hypot(clusters["x"] - 10, clusters["y"] - 5))]["score"], 0.9
    )


@pytest.mark.parametrize("yaw_deg", [-90, -60, -30, 0, 30, 60, 90, 135])
def test_yaw_convention(yaw_deg: float) -> None:
    points, scores = _scene(_box_points(20.0, 0.0, 4.0, 1.8, 1.5, np.deg2rad(yaw_deg)))
    (row,) = cluster_obstacles(points, scores)
    assert -np.pi / 2 < row["yaw"] <= np.pi / 2 + 1e-6
    assert row["length"] >= row["width"]
    assert np.degrees(_yaw_error(float(row["yaw"]), np.deg2rad(yaw_deg))) < 2.0


def test_without_ground_the_box_spans_the_points() -> None:
    points, scores = _scene(_box_points(12.0, 0.0, 4.0, 1.8, 1.5))
    (row,) = cluster_obstacles(points, scores, ClusterParams(), ground=None)
    assert np.isclose(row["height"], 1.5 - 0.2, atol=1e-4)  # lowest points 0.2 m up
    assert np.isclose(row["z"], GROUND_Z_M + (0.2 + 1.5) / 2, atol=1e-4)


def _pair(gap_m: float, shift_m: float) -> tuple[np.ndarray, np.ndarray]:
    """Two cars side by side, ``gap_m`` between their facing sides, shifted along y."""
    y0 = 5.0 + shift_m
    left = _box_points(15.0, y0, 4.2, 1.8, 1.5)
    right = _box_points(15.0, y0 - 1.8 - gap_m, 4.2, 1.8, 1.5)
    return _scene(left, right)


SHIFTS_M = np.linspace(0.0, 0.15, 7)


def test_cars_half_a_metre_apart_stay_apart_with_fine_cells() -> None:
    # Closing with radius r bridges at most 2r empty cells, so a gap g always stays open
    # when floor(g / cell) >= 2r + 2: 0.5 m needs cells of 0.125 m or less at r = 1.
    params = ClusterParams(cell_size_m=0.12)
    for shift in SHIFTS_M:
        assert cluster_obstacles(*_pair(0.5, shift), params).shape == (2,)


def test_default_cells_keep_0_6_m_apart_and_may_merge_0_5_m() -> None:
    # The default 0.15 m cells are chosen so that real KITTI cars, whose returns have
    # 0.3-0.5 m holes, stay whole; the price is that only gaps >= 0.6 m always stay open.
    for shift in SHIFTS_M:
        assert cluster_obstacles(*_pair(0.6, shift)).shape == (2,)
    merged = [cluster_obstacles(*_pair(0.5, shift)).shape[0] for shift in SHIFTS_M]
    assert 1 in merged


def test_small_holes_in_one_object_are_bridged() -> None:
    car = _box_points(15.0, 3.0, 4.2, 1.8, 1.5)
    # A 0.35 m slice through both long sides: the box falls into two U shapes.
    hole = np.abs(car[:, 0] - 15.0) < 0.15
    points, scores = _scene(car[~hole])
    assert cluster_obstacles(points, scores).shape == (1,)
    no_closing = ClusterParams(closing_cells=0, cell_size_m=0.1)
    assert cluster_obstacles(points, scores, no_closing).shape == (2,)


def test_canopy_above_max_height_does_not_bridge_cars() -> None:
    left = _box_points(15.0, 2.0, 4.2, 1.8, 1.5)
    right = _box_points(15.0, -0.8, 4.2, 1.8, 1.5)
    xs, ys = np.meshgrid(np.arange(13.0, 17.0, 0.1), np.arange(-2.0, 3.0, 0.1))
    canopy = np.c_[xs.ravel(), ys.ravel(), np.full(xs.size, GROUND_Z_M + 4.0), np.zeros(xs.size)]
    points, scores = _scene(left, right, canopy)
    assert cluster_obstacles(points, scores, ClusterParams(), FLAT).shape == (2,)
    assert cluster_obstacles(points, scores, ClusterParams(), None).shape == (1,)


def test_threshold_roi_and_min_points_filter() -> None:
    car = _box_points(15.0, 3.0, 4.2, 1.8, 1.5)
    behind = _box_points(-10.0, 0.0, 4.2, 1.8, 1.5)
    wide = _box_points(20.0, 35.0, 4.2, 1.8, 1.5)
    speck = np.array([[30.0, 0.0, -1.0, 0.1], [30.05, 0.0, -1.0, 0.1], [30.0, 0.05, -1.0, 0.1]])
    low_score = _box_points(40.0, -5.0, 4.2, 1.8, 1.5)
    points, scores = _scene(car, behind, wide, speck, low_score)
    scores[-low_score.shape[0] :] = 0.5
    clusters = cluster_obstacles(points, scores)
    assert clusters.shape == (1,) and abs(clusters["x"][0] - 15.0) < 0.1
    tiny = ClusterParams(min_points=3)
    assert cluster_obstacles(points, scores, tiny).shape == (2,)
    wide_roi = ClusterParams(roi=Roi(x_m=(-20.0, 60.0), y_m=(-40.0, 40.0)))
    assert cluster_obstacles(points, scores, wide_roi).shape == (3,)


def test_empty_input_gives_an_empty_table() -> None:
    empty = cluster_obstacles(np.zeros((0, 4), np.float32), np.zeros(0, np.float32))
    assert empty.shape == (0,) and empty.dtype == OBSTACLE_DTYPE
    points, _ = _scene(_box_points(10.0, 0.0, 4.0, 1.8, 1.5))
    assert cluster_obstacles(points, np.zeros(points.shape[0])).shape == (0,)


def test_bad_input_and_roi() -> None:
    with pytest.raises(ShapeError):
        cluster_obstacles(np.zeros((4, 2)), np.zeros(4))
    with pytest.raises(ShapeError):
        cluster_obstacles(np.zeros((4, 4)), np.zeros(3))
    with pytest.raises(ConfigError, match="finite"):
        ClusterParams(roi=Roi(x_m=(0.0, float("inf"))))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"cell_size_m": 0.0}, "cell_size_m"),
        ({"closing_cells": -1}, "closing_cells"),
        ({"min_points": 0}, "min_points"),
        ({"max_height_m": float("nan")}, "max_height_m"),
        ({"min_height_m": 3.0, "max_height_m": 3.0}, "must lie below max_height_m"),
        # A grid that would take gigabytes per frame is a setting error, not a MemoryError later.
        ({"cell_size_m": 1e-4}, "raise cell_size_m"),
    ],
)
def test_bad_params(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ClusterParams(**changes)  # type: ignore[arg-type]


def test_near_cars_of_a_synthetic_scan_are_single_clusters() -> None:
    """Every labelled point of a car joins its one cluster (the road rule is off: the labels
    also mark a car's returns just above the road)."""
    checked = 0
    every_height = ClusterParams(min_height_m=-10.0)
    for seed in range(4):
        scene = driving_scene(seed=seed)
        ground = fit_ground_plane(scene.points, seed=seed)
        clusters = cluster_obstacles(
            scene.points, scene.is_obstacle.astype(np.float32), every_height, ground
        )
        boxes = scene.boxes
        near = (boxes["label"] == LABEL_CAR) & (np.hypot(boxes["x"], boxes["y"]) < 12.0)
        for box in boxes[near & (boxes["num_points"] > 0)]:
            dist = np.hypot(clusters["x"] - box["x"], clusters["y"] - box["y"])
            assert (dist < 3.0).sum() == 1
            assert clusters["num_points"][np.argmin(dist)] == box["num_points"]
            checked += 1
    assert checked >= 4


# The six cars of KITTI frame 000008 within 40 m, Velodyne frame, metres: approximate
# centres of the boxes in KITTI's label file (x = z_cam + 0.27, y = -x_cam), each
# confirmed by a car-shaped blob of obstacle points in this scan.
KITTI_000008_CARS_XY = [
    (3.95, 2.70),
    (8.10, 1.17),
    (6.40, -3.81),
    (14.70, -1.07),
    (20.20, -8.48),
    (33.50, -7.24),
]


def test_kitti_cars_are_one_cluster_each(kitti_bin: Path) -> None:
    points = read_kitti_bin(kitti_bin)
    ground = fit_ground_plane(points)
    # A perfect segmenter: everything more than 0.3 m above the road.
    scores = (ground.height(points) > 0.3).astype(np.float32)
    clusters = cluster_obstacles(points, scores, ClusterParams(), ground)
    assert 30 <= clusters.shape[0] <= 60
    for x, y in KITTI_000008_CARS_XY:
        dist = np.hypot(clusters["x"] - x, clusters["y"] - y)
        assert (dist < 2.5).sum() == 1, f"car at ({x}, {y}) is split or missing"
        row = clusters[np.argmin(dist)]
        assert row["length"] > 1.4 and row["width"] < 2.2 and row["num_points"] >= 30


def test_dropped_small_blobs_do_not_leak_into_their_neighbours() -> None:
    # cv2 numbers blobs in raster order (y rows): the speck's label falls between the cars'.
    near = _box_points(15.0, 0.0, 4.2, 1.8, 1.5)
    speck = np.array([[15.0, 5.0, 1.0, 0.1], [15.05, 5.0, 1.0, 0.1], [15.0, 5.05, 1.0, 0.1]])
    far = _box_points(15.0, 10.0, 4.2, 1.8, 1.2)
    points, scores = _scene(near, speck, far)
    clusters = cluster_obstacles(points, scores, ClusterParams(), FLAT)
    assert clusters.shape == (2,)
    np.testing.assert_allclose(np.sort(clusters["height"]), [1.2, 1.5], atol=1e-4)
    np.testing.assert_allclose(
        np.sort(clusters["z"]), GROUND_Z_M + np.array([0.6, 0.75]), atol=1e-4
    )
    no_ground = cluster_obstacles(points, scores, ClusterParams(), None)
    np.testing.assert_allclose(np.sort(no_ground["height"]), [1.0, 1.3], atol=1e-4)


def _scored_scene(seed: int) -> tuple[np.ndarray, GroundPlane, np.ndarray]:
    """A generated street with its fitted ground and seeded scores in [0, 1] on every point."""
    scene = driving_scene(seed=seed)
    ground = fit_ground_plane(scene.points, seed=seed)
    count = int(scene.points.shape[0])
    scores = np.asarray(np.random.default_rng(seed).random(count), dtype=np.float32)
    return scene.points, ground, scores


@pytest.mark.parametrize("seed", [0, 1])
def test_rows_left_unscored_never_change_the_boxes(seed: int) -> None:
    """The full cloud scores only ``rows_to_score``: whatever the other rows score, the
    boxes are the same bytes."""
    points, ground, scores = _scored_scene(seed)
    params = ClusterParams()
    wanted = rows_to_score(points, params, ground)
    assert wanted is not None and 0 < wanted.size < points.shape[0]
    unscored = np.zeros_like(scores)
    unscored[wanted] = scores[wanted]
    full = cluster_obstacles(points, scores, params, ground)
    assert full.shape[0] > 0
    assert cluster_obstacles(points, unscored, params, ground).tobytes() == full.tobytes()


def test_road_points_join_no_cluster_on_a_fitted_ground_only() -> None:
    """A blob 5 cm above the road, scored 1: road on a fitted ground, an object on the flat
    default (which may lie off the road), where every row is scored."""
    rng = np.random.default_rng(3)
    blob = np.column_stack(
        [rng.uniform(5.0, 6.0, 200), rng.uniform(-0.5, 0.5, 200), np.full(200, -1.68)]
    ).astype(np.float32)
    scores = np.ones(200, np.float32)
    fitted = GroundPlane(0.0, 0.0, 1.0, 1.73)
    assert cluster_obstacles(blob, scores, ClusterParams(), fitted).shape[0] == 0
    assert rows_to_score(blob, ClusterParams(), fitted).size == 0  # type: ignore[union-attr]
    default = GroundPlane.default(1.73)
    assert cluster_obstacles(blob, scores, ClusterParams(), default).shape[0] == 1
    assert rows_to_score(blob, ClusterParams(), default) is None
