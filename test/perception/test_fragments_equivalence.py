"""merge_fragments gives, bit for bit, the boxes of the algorithm frozen here (scipy's
connected components, one structured row set field by field per joined group)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.clustering import ClusterParams, cluster_obstacles, size_label
from dynshape_perception.perception.fragments import (
    FRAGMENT_MAX_CELLS,
    _corners,
    _nearest_in_reach,
    merge_fragments,
)
from dynshape_perception.perception.ground import fit_ground_plane
from dynshape_perception.perception.records import OBSTACLE_DTYPE
from dynshape_perception.perception.scan import SURROUND_ROI, ScanParams, prepare_scan
from dynshape_perception.tools.sim.scenes import driving_scene


def reference_merge_fragments(boxes: np.ndarray, cell_size_m: float, gap_rad: float) -> np.ndarray:
    n = boxes.shape[0]
    if n < 2 or gap_rad <= 0.0:
        return boxes
    small = FRAGMENT_MAX_CELLS * cell_size_m
    fragment = (boxes["length"] <= small) & (boxes["width"] <= small)
    if not fragment.any():
        return boxes
    corners = _corners(boxes).astype(np.float64)
    centre = np.stack([boxes["x"], boxes["y"]], axis=1).astype(np.float64)
    reach = 0.5 * np.hypot(boxes["length"], boxes["width"]).astype(np.float64)
    cos, sin = np.cos(boxes["yaw"]), np.sin(boxes["yaw"])
    half_length = boxes["length"].astype(np.float64) / 2.0
    half_width = boxes["width"].astype(np.float64) / 2.0
    rows, cols = _nearest_in_reach(
        centre, cos, sin, half_length, half_width, reach, fragment, gap_rad
    )
    if rows.size == 0:
        return boxes
    graph = coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    _, root = connected_components(graph, directed=False)
    _, first, sizes = np.unique(root, return_index=True, return_counts=True)
    out = boxes[first].copy()
    by_group = np.argsort(root, kind="stable")
    ends = np.cumsum(sizes)
    top = boxes["z"] + boxes["height"] / 2.0
    bottom = boxes["z"] - boxes["height"] / 2.0
    for i in np.flatnonzero(sizes > 1).tolist():
        members = by_group[ends[i] - sizes[i] : ends[i]]
        rect = cv2.minAreaRect(corners[members].reshape(-1, 2).astype(np.float32))
        pts = cv2.boxPoints(rect).astype(np.float64)
        a, b = pts[1] - pts[0], pts[2] - pts[1]
        la, lb = float(np.hypot(*a)), float(np.hypot(*b))
        long_edge = a if la >= lb else b
        yaw = float(np.arctan2(long_edge[1], long_edge[0]))
        yaw = yaw + np.pi if yaw <= -np.pi / 2 else yaw - np.pi if yaw > np.pi / 2 else yaw
        count = boxes["num_points"][members].astype(np.float64)
        row = out[i]
        row["x"], row["y"] = pts.mean(axis=0)
        row["length"], row["width"], row["yaw"] = max(la, lb), min(la, lb), yaw
        hi, lo = float(top[members].max()), float(bottom[members].min())
        row["z"], row["height"] = (hi + lo) / 2.0, hi - lo
        row["score"] = float((boxes["score"][members] * count).sum() / count.sum())
        row["num_points"] = int(count.sum())
        out[i] = row
    out["label"] = size_label(out["length"], out["width"], out["height"])
    nearest_first: np.ndarray = out[np.argsort(np.hypot(out["x"], out["y"]), kind="stable")]
    return nearest_first


def _assert_same(boxes: np.ndarray, cell_size_m: float, gap_rad: float) -> int:
    """Asserts the bytes agree; the number of boxes joined away."""
    expected = reference_merge_fragments(boxes, cell_size_m, gap_rad)
    got = merge_fragments(boxes, cell_size_m, gap_rad, size_label)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    for name in OBSTACLE_DTYPE.names or ():
        assert got[name].tobytes() == expected[name].tobytes(), f"field {name} differs"
    return boxes.shape[0] - got.shape[0]


GAPS = (0.03, 0.08, 0.2)


def test_kitti_clusters_join_as_the_reference(kitti_bin: Path) -> None:
    raw = read_kitti_bin(kitti_bin, allow_empty=False)
    points = prepare_scan(raw, np.eye(4), ScanParams()).points
    ground = fit_ground_plane(points[:, :3])
    scores = (ground.height(points) > 0.3).astype(np.float32)
    joined = 0
    for cell, min_points in ((0.15, 5), (0.1, 2), (0.2, 1)):
        params = ClusterParams(
            roi=SURROUND_ROI, cell_size_m=cell, min_points=min_points, fragment_gap_rad=0.0
        )
        boxes = cluster_obstacles(points, scores, params, ground)
        for gap in GAPS:
            joined += _assert_same(boxes, cell, gap)
    assert joined >= 20


@pytest.mark.parametrize("seed", range(3))
def test_generated_scenes_join_as_the_reference(seed: int) -> None:
    scene = driving_scene(seed=seed, fov_deg=360.0, roi=SURROUND_ROI)
    ground = fit_ground_plane(scene.points, seed=seed)
    params = ClusterParams(roi=SURROUND_ROI, min_points=1, fragment_gap_rad=0.0)
    boxes = cluster_obstacles(scene.points, scene.is_obstacle.astype(np.float32), params, ground)
    assert sum(_assert_same(boxes, params.cell_size_m, gap) for gap in GAPS) >= 1


@pytest.mark.parametrize("seed", range(8))
def test_crowds_of_fragments_join_as_the_reference(seed: int) -> None:
    # Far columns in lines and clumps: chains, pairs nearest to each other, rings.
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 120))
    out = np.zeros(n, OBSTACLE_DTYPE)
    bearing = rng.uniform(-np.pi, np.pi, 6)[rng.integers(0, 6, n)] + rng.normal(0, 0.01, n)
    distance = rng.uniform(20.0, 60.0, n)
    out["x"], out["y"] = distance * np.cos(bearing), distance * np.sin(bearing)
    out["z"] = rng.uniform(-1.5, 0.0, n)
    out["length"] = np.where(rng.random(n) < 0.7, 0.15, rng.uniform(0.15, 4.5, n))
    out["width"] = np.minimum(out["length"], np.where(rng.random(n) < 0.5, 0.15, 1.8))
    out["height"] = rng.uniform(0.2, 2.0, n)
    out["yaw"] = rng.uniform(-np.pi / 2, np.pi / 2, n)
    out["score"] = rng.uniform(0.5, 1.0, n)
    out["num_points"] = rng.integers(1, 60, n)
    out["label"] = size_label(out["length"], out["width"], out["height"])
    boxes = out[np.argsort(np.hypot(out["x"], out["y"]), kind="stable")]
    assert sum(_assert_same(boxes, 0.15, gap) for gap in GAPS) >= 3
