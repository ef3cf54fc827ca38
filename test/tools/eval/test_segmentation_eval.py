"""Segmentation metrics against the RANSAC ground reference, and the bird's-eye-view plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.config import Roi
from dynshape_perception.errors import ConfigError, DataError, ShapeError
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.clustering import cluster_obstacles
from dynshape_perception.perception.ground import fit_ground_plane
from dynshape_perception.perception.records import OBSTACLE_DTYPE
from dynshape_perception.tools.eval.segmentation import (
    check_plot_path,
    evaluate_segmentation,
    plot_bev,
)

GROUND_Z_M = -1.73
KEYS = {"ground_excluded", "raised_detected", "clusters", "num_points", "roi_points"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _flat_street() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Flat ground (4000 points), 800 raised box points, 100 in the 0.2-0.3 m band, 50 far raised.

    Returns the points and the masks of the ground, raised-in-ROI and band points.
    """
    rng = np.random.default_rng(0)
    ground = np.c_[rng.uniform(0, 50, (4000, 2)) - [0, 25], np.full(4000, GROUND_Z_M)]
    boxes = np.concatenate(
        [
            np.c_[
                rng.uniform(x, x + 4, 400), rng.uniform(y, y + 2, 400), rng.uniform(0.35, 1.5, 400)
            ]
            for x, y in ((10.0, 3.0), (25.0, -6.0))
        ]
    )
    boxes[:, 2] += GROUND_Z_M
    band = np.c_[rng.uniform([5.0, -20.0], [40.0, 20.0], (100, 2)), np.full(100, GROUND_Z_M + 0.25)]
    far = np.c_[rng.uniform(70, 80, 50), rng.uniform(-5, 5, 50), np.full(50, GROUND_Z_M + 1.0)]
    xyz = np.concatenate([ground, boxes, band, far])
    points = np.c_[xyz, np.zeros(xyz.shape[0])].astype(np.float32)
    kind = np.repeat([0, 1, 2, 3], [4000, 800, 100, 50])
    return points, kind == 0, kind == 1, kind == 2


def test_perfect_scorer_scores_one() -> None:
    points, ground, _, _ = _flat_street()
    scores = (~ground).astype(np.float32)
    result = evaluate_segmentation(points, scores, 0.5, np.zeros(0, OBSTACLE_DTYPE))
    assert set(result) == KEYS
    assert result["ground_excluded"] == 1.0
    assert result["raised_detected"] == 1.0
    assert result["num_points"] == points.shape[0]
    # Everything but the 50 points 70-80 m ahead lies in the default ROI.
    assert result["roi_points"] == points.shape[0] - 50
    assert result["clusters"] == []


def test_partial_scorer_gives_known_shares() -> None:
    points, ground, raised, band = _flat_street()
    scores = np.zeros(points.shape[0], dtype=np.float32)
    ground_index = np.flatnonzero(ground)
    scores[ground_index[::4]] = 0.9  # a quarter of the ground wrongly called obstacle
    raised_index = np.flatnonzero(raised)
    scores[raised_index[: raised_index.size * 3 // 8]] = 0.8  # 3/8 of the raised points found
    scores[band] = 1.0  # neither ground nor raised: must not count anywhere
    result = evaluate_segmentation(points, scores, 0.5, np.zeros(0, OBSTACLE_DTYPE))
    assert result["ground_excluded"] == pytest.approx(0.75)
    assert result["raised_detected"] == pytest.approx(3 / 8)
    # The threshold is exclusive: a score equal to it is not an obstacle.
    at_threshold = evaluate_segmentation(
        points, np.where(scores > 0, 0.8, 0.0), 0.8, np.zeros(0, OBSTACLE_DTYPE)
    )
    assert at_threshold["ground_excluded"] == 1.0 and at_threshold["raised_detected"] == 0.0


def test_clusters_are_plain_dicts() -> None:
    points, ground, _, _ = _flat_street()
    scores = (~ground).astype(np.float32)
    clusters = cluster_obstacles(points, scores, None, fit_ground_plane(points))
    result = evaluate_segmentation(points, scores, 0.5, clusters)
    assert len(result["clusters"]) == clusters.shape[0] >= 2
    for entry in result["clusters"]:
        assert set(entry) == {"x", "y", "z", "length", "width", "height", "yaw", "num_points"}
        assert isinstance(entry["num_points"], int)
        assert all(isinstance(entry[k], float) for k in entry if k != "num_points")
    first = result["clusters"][0]
    assert first["x"] == pytest.approx(float(clusters["x"][0]))


def test_no_raised_points_gives_nan() -> None:
    xy = np.random.default_rng(1).uniform(0, 20, (500, 2))
    points = np.c_[xy, np.full(500, GROUND_Z_M), np.zeros(500)]
    result = evaluate_segmentation(points, np.zeros(500), 0.5, np.zeros(0, OBSTACLE_DTYPE))
    assert result["ground_excluded"] == 1.0 and np.isnan(result["raised_detected"])


def test_shape_errors() -> None:
    with pytest.raises(ShapeError):
        evaluate_segmentation(np.zeros((5, 4)), np.zeros(4), 0.5, np.zeros(0, OBSTACLE_DTYPE))


def test_plot_bev_writes_a_png(tmp_path: Path) -> None:
    points, ground, _, _ = _flat_street()
    scores = (~ground).astype(np.float32)
    clusters = cluster_obstacles(points, scores)
    path = plot_bev(tmp_path / "bev.png", points, scores, clusters, Roi())
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 20_000
    empty = plot_bev(tmp_path / "empty.png", points[:0], scores[:0], clusters[:0], Roi())
    assert empty.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(DataError, match="cannot write plot"):
        plot_bev(tmp_path / "missing" / "bev.png", points, scores, clusters, Roi())


def test_kitti_perfect_segmenter(kitti_bin: Path, tmp_path: Path) -> None:
    points = read_kitti_bin(kitti_bin)
    ground = fit_ground_plane(points)
    scores = (ground.height(points) > 0.3).astype(np.float32)
    clusters = cluster_obstacles(points, scores, None, ground)
    result = evaluate_segmentation(points, scores, 0.5, clusters)
    assert result["ground_excluded"] == 1.0 and result["raised_detected"] == 1.0
    assert result["num_points"] == 17_238
    assert 15_000 < result["roi_points"] < 17_238
    assert len(result["clusters"]) == clusters.shape[0]
    path = plot_bev(tmp_path / "kitti.png", points, scores, clusters, Roi())
    assert path.stat().st_size > 50_000


def test_plot_bev_refuses_formats_matplotlib_cannot_write(tmp_path: Path) -> None:
    points, ground, _, _ = _flat_street()
    scores = (~ground).astype(np.float32)
    clusters = np.zeros(0, OBSTACLE_DTYPE)
    for name in ("bev.xyz", "bev"):
        with pytest.raises(ConfigError, match="suffix must be one of"):
            plot_bev(tmp_path / name, points, scores, clusters, Roi())
        with pytest.raises(ConfigError, match="suffix must be one of"):
            check_plot_path(tmp_path / name)
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(ConfigError, match="is a folder"):
        check_plot_path(tmp_path / "folder.png")
    assert not list(tmp_path.glob("bev*"))


def test_evaluate_segmentation_refuses_a_negative_seed() -> None:
    points, ground, _, _ = _flat_street()
    scores = (~ground).astype(np.float32)
    with pytest.raises(ConfigError, match="seed must be an integer >= 0"):
        evaluate_segmentation(points, scores, 0.5, np.zeros(0, OBSTACLE_DTYPE), seed=-1)
