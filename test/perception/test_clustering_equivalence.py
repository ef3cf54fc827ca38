"""cluster_obstacles gives, bit for bit, the boxes of the whole-grid algorithm frozen here."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from dynshape_perception.config import Roi
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.clustering import (
    ClusterParams,
    cluster_obstacles,
    size_label,
)
from dynshape_perception.perception.fragments import merge_fragments
from dynshape_perception.perception.ground import GroundPlane, fit_ground_plane
from dynshape_perception.perception.records import OBSTACLE_DTYPE, empty
from dynshape_perception.perception.scan import SURROUND_ROI, ScanParams, prepare_scan
from dynshape_perception.tools.sim.scenes import driving_scene


def _reference_rect(xy: np.ndarray) -> tuple[float, float, float, float, float]:
    rect = cv2.minAreaRect(xy.astype(np.float32))
    corners = cv2.boxPoints(rect).astype(np.float64)
    edge_a = corners[1] - corners[0]
    edge_b = corners[2] - corners[1]
    len_a, len_b = float(np.hypot(*edge_a)), float(np.hypot(*edge_b))
    long_edge = edge_a if len_a >= len_b else edge_b
    yaw = float(np.arctan2(long_edge[1], long_edge[0]))
    if yaw <= -np.pi / 2:
        yaw += np.pi
    elif yaw > np.pi / 2:
        yaw -= np.pi
    centre = corners.mean(axis=0)
    return float(centre[0]), float(centre[1]), max(len_a, len_b), min(len_a, len_b), yaw


def _reference_group_reduce(
    ufunc: np.ufunc, sorted_values: np.ndarray, starts: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    out = np.full(counts.size, np.nan)
    filled = np.flatnonzero(counts)
    if filled.size:
        out[filled] = ufunc.reduceat(sorted_values, starts[filled])
    return out


def reference_cluster_obstacles(
    points: np.ndarray,
    scores: np.ndarray,
    params: ClusterParams,
    ground: GroundPlane | None,
) -> np.ndarray:
    """The algorithm as it was before the grid was cropped: a float64 copy of the points,
    the whole ROI grid, cv2.connectedComponentsWithStats and one minAreaRect per blob; then
    the far fragments joined."""
    xyz = points[:, :3].astype(np.float64)
    (x_lo, x_hi), (y_lo, y_hi), (z_lo, z_hi) = params.roi.x_m, params.roi.y_m, params.roi.z_m
    keep = (
        (scores > params.score_threshold)
        & (xyz[:, 0] >= x_lo)
        & (xyz[:, 0] < x_hi)
        & (xyz[:, 1] >= y_lo)
        & (xyz[:, 1] < y_hi)
        & (xyz[:, 2] >= z_lo)
        & (xyz[:, 2] < z_hi)
    )
    heights = ground.height(xyz) if ground is not None else None
    if heights is not None:
        keep &= heights <= params.max_height_m
        if ground is not None and not ground.is_default:
            keep &= heights >= params.min_height_m
    if not keep.any():
        return empty(OBSTACLE_DTYPE)
    xyz, member_scores = xyz[keep], scores[keep].astype(np.float64)
    heights = heights[keep] if heights is not None else None

    rows, cols = params.grid_shape
    col = np.minimum(((xyz[:, 0] - x_lo) / params.cell_size_m).astype(np.int64), cols - 1)
    row = np.minimum(((xyz[:, 1] - y_lo) / params.cell_size_m).astype(np.int64), rows - 1)
    grid: np.ndarray = np.zeros((rows, cols), dtype=np.uint8)
    grid[row, col] = 1
    if params.closing_cells:
        side = 2 * params.closing_cells + 1
        kernel = cv2.getStructuringElement(cv2.MORPH_RECT, (side, side))
        grid = cv2.morphologyEx(grid, cv2.MORPH_CLOSE, kernel)
    num_labels, label_img, _, _ = cv2.connectedComponentsWithStats(
        grid, connectivity=8, ltype=cv2.CV_32S
    )
    comp = label_img[row, col].astype(np.int64) - 1
    counts = np.bincount(comp, minlength=num_labels - 1)
    order = np.argsort(comp, kind="stable")
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    present = np.flatnonzero(counts >= params.min_points)
    if present.size == 0:
        return empty(OBSTACLE_DTYPE)

    sorted_xyz = xyz[order]
    z_min = _reference_group_reduce(np.minimum, sorted_xyz[:, 2], starts, counts)[present]
    z_max = _reference_group_reduce(np.maximum, sorted_xyz[:, 2], starts, counts)[present]
    score_sum = np.bincount(comp, weights=member_scores, minlength=counts.size)
    score_mean = score_sum[present] / counts[present]
    if heights is not None:
        top_height = _reference_group_reduce(np.maximum, heights[order], starts, counts)[present]

    out = np.zeros(present.size, dtype=OBSTACLE_DTYPE)
    for i, label in enumerate(present):
        start = starts[label]
        member_xy = sorted_xyz[start : start + counts[label], :2]
        out_row = _reference_rect(member_xy)
        out["x"][i], out["y"][i], out["length"][i], out["width"][i], out["yaw"][i] = out_row

    out["length"] = np.maximum(out["length"], params.cell_size_m)
    out["width"] = np.maximum(out["width"], params.cell_size_m)
    if ground is not None and heights is not None:
        base = ground.z_at(out["x"], out["y"])
        height = np.maximum(top_height, 0.0)
        out["z"] = base + height / 2.0
        out["height"] = height
    else:
        out["z"] = (z_min + z_max) / 2.0
        out["height"] = z_max - z_min
    out["score"] = score_mean
    out["num_points"] = counts[present]
    out["label"] = size_label(out["length"], out["width"], out["height"])
    distance = np.hypot(out["x"], out["y"])
    out = out[np.argsort(distance, kind="stable")]
    # The fragments are joined on the boxes, after the grid: the same step on both sides.
    return merge_fragments(out, params.cell_size_m, params.fragment_gap_rad, size_label)


def _assert_same(
    points: np.ndarray,
    scores: np.ndarray,
    params: ClusterParams,
    ground: GroundPlane | None,
) -> np.ndarray:
    expected = reference_cluster_obstacles(points, scores, params, ground)
    got = cluster_obstacles(points, scores, params, ground)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape, (
        f"{got.shape[0]} boxes, the reference has {expected.shape[0]}"
    )
    for name in OBSTACLE_DTYPE.names or ():
        # Bytes, not values: -0.0 against 0.0 or one float32 step would be a difference.
        assert got[name].tobytes() == expected[name].tobytes(), f"field {name} differs"
    return expected


CLOSINGS = (0, 1, 2)


@pytest.fixture(scope="module")
def kitti_scan(kitti_bin: Path) -> tuple[np.ndarray, GroundPlane]:
    raw = read_kitti_bin(kitti_bin, allow_empty=False)
    points = prepare_scan(raw, np.eye(4), ScanParams()).points
    return points, fit_ground_plane(points[:, :3])


@pytest.mark.parametrize("closing", CLOSINGS)
@pytest.mark.parametrize("roi", [SURROUND_ROI, None], ids=["surround", "default"])
@pytest.mark.parametrize("with_ground", [True, False], ids=["ground", "no_ground"])
def test_kitti_scan_matches_the_reference(
    kitti_scan: tuple[np.ndarray, GroundPlane], closing: int, roi: Roi | None, with_ground: bool
) -> None:
    points, ground = kitti_scan
    # Everything more than 0.3 m above the road, and seeded noise on top.
    rng = np.random.default_rng(closing)
    scores = (ground.height(points) > 0.3).astype(np.float32)
    scores = np.clip(scores + rng.normal(0.0, 0.3, scores.size), 0.0, 1.0).astype(np.float32)
    params = ClusterParams(closing_cells=closing, roi=roi or ClusterParams().roi)
    boxes = _assert_same(points, scores, params, ground if with_ground else None)
    assert boxes.shape[0] >= 20


def test_kitti_scan_with_finer_cells_and_float64_points(
    kitti_scan: tuple[np.ndarray, GroundPlane],
) -> None:
    points, ground = kitti_scan
    scores = (ground.height(points) > 0.3).astype(np.float32)
    params = ClusterParams(roi=SURROUND_ROI, cell_size_m=0.1)
    assert _assert_same(points.astype(np.float64), scores, params, ground).shape[0] >= 20
    assert _assert_same(points, scores.astype(np.float64), params, None).shape[0] >= 20


# Not multiples of the cell, so that the last row and column are cut short by the ROI.
EDGE_ROI = Roi(x_m=(-7.3, 21.1), y_m=(-9.05, 8.2), z_m=(-2.5, 2.0))
TILTED = GroundPlane(0.02, -0.01, float(np.sqrt(1 - 0.02**2 - 0.01**2)), 1.7)


def _edge_scene(seed: int, roi: Roi, with_ground: bool) -> tuple[np.ndarray, np.ndarray]:
    """Blobs at the corners and along the edges of ``roi`` (some across them) and inside it,
    points on and one float32 step either side of each bound, and road and canopy returns."""
    rng = np.random.default_rng(seed)
    (x_lo, x_hi), (y_lo, y_hi) = roi.x_m, roi.y_m
    centres = [(x, y) for x in (x_lo, x_hi) for y in (y_lo, y_hi)]
    centres += [(rng.uniform(x_lo, x_hi), y) for y in (y_lo, y_hi)]
    centres += [(x, rng.uniform(y_lo, y_hi)) for x in (x_lo, x_hi)]
    centres = [(x + rng.uniform(-0.6, 0.6), y + rng.uniform(-0.6, 0.6)) for x, y in centres]
    centres += [(rng.uniform(x_lo, x_hi), rng.uniform(y_lo, y_hi)) for _ in range(12)]
    parts: list[np.ndarray] = []
    part_scores: list[np.ndarray] = []

    def add(xyz: np.ndarray, high: float) -> None:
        # Sure ones, unsure ones, and some exactly on the threshold.
        choice = rng.choice([0.05, 0.5, 0.9], size=xyz.shape[0], p=[0.9 - high, 0.1, high])
        jitter = rng.normal(0.0, 0.05, xyz.shape[0]) * (rng.random(xyz.shape[0]) < 0.3)
        parts.append(xyz)
        part_scores.append(np.clip(choice + jitter, 0.0, 1.0))

    for x, y in centres:
        n = int(rng.integers(1, 250))
        size = rng.uniform(0.05, 4.0, 2)
        add(
            np.c_[np.c_[x, y] + rng.uniform(-0.5, 0.5, (n, 2)) * size, rng.uniform(-1.6, 0.5, n)],
            0.8,
        )
    # A regular grid of returns: equal coordinates, collinear points, tied rectangles.
    gx, gy = np.meshgrid(np.arange(5) * 0.15, np.arange(3) * 0.3)
    add(np.c_[gx.ravel() + x_lo + 1.0, gy.ravel() + y_lo + 0.05, np.full(gx.size, -1.0)], 0.8)
    edges = []
    for axis, (lo, hi) in enumerate((roi.x_m, roi.y_m, roi.z_m)):
        for bound in (lo, hi):
            b32 = np.float32(bound)
            for value in (np.nextafter(b32, -np.inf), b32, np.nextafter(b32, np.inf)):
                for _ in range(6):
                    point = np.array([rng.uniform(x_lo, x_hi), rng.uniform(y_lo, y_hi), -1.0])
                    point[axis] = value
                    edges.append(point)
    add(np.array(edges), 0.8)
    if with_ground:
        road = np.c_[rng.uniform(x_lo - 1, x_hi + 1, 3000), rng.uniform(y_lo - 1, y_hi + 1, 3000)]
        road_z = TILTED.z_at(road[:, 0], road[:, 1]) + rng.normal(0.0, 0.03, road.shape[0])
        add(np.c_[road, road_z], 0.05)
        canopy = np.c_[rng.uniform(x_lo, x_hi, 300), rng.uniform(y_lo, y_hi, 300)]
        canopy_z = TILTED.z_at(canopy[:, 0], canopy[:, 1]) + rng.uniform(2.5, 3.5, 300)
        add(np.c_[canopy, canopy_z], 0.8)
    xyz = np.concatenate(parts)
    points = np.c_[xyz, rng.uniform(0.0, 1.0, xyz.shape[0])].astype(np.float32)
    scores = np.concatenate(part_scores).astype(np.float32)
    order = rng.permutation(points.shape[0])
    return points[order], scores[order]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("closing", CLOSINGS)
@pytest.mark.parametrize("with_ground", [True, False], ids=["ground", "no_ground"])
def test_objects_at_the_roi_edges_match_the_reference(
    seed: int, closing: int, with_ground: bool
) -> None:
    points, scores = _edge_scene(seed, EDGE_ROI, with_ground)
    for cell_size_m in (0.15, 0.2):
        params = ClusterParams(
            roi=EDGE_ROI, cell_size_m=cell_size_m, closing_cells=closing, min_points=2
        )
        ground = TILTED if with_ground else None
        boxes = _assert_same(points, scores, params, ground)
        # The corner blobs were clustered, not only the inner ones.
        corner = (np.abs(boxes["x"] - np.array(EDGE_ROI.x_m)[:, None]).min(axis=0) < 2.5) & (
            np.abs(boxes["y"] - np.array(EDGE_ROI.y_m)[:, None]).min(axis=0) < 2.5
        )
        assert corner.sum() >= 2
        assert boxes.shape[0] >= 10
    _assert_same(points.astype(np.float64), scores, params, ground)


@pytest.fixture(scope="module", params=range(3))
def synthetic_scan(request: pytest.FixtureRequest) -> tuple[np.ndarray, np.ndarray, GroundPlane]:
    scene = driving_scene(seed=request.param, fov_deg=360.0, roi=SURROUND_ROI)
    ground = fit_ground_plane(scene.points, seed=request.param)
    return scene.points, scene.is_obstacle.astype(np.float32), ground


@pytest.mark.parametrize("closing", CLOSINGS)
def test_synthetic_scans_match_the_reference(
    synthetic_scan: tuple[np.ndarray, np.ndarray, GroundPlane], closing: int
) -> None:
    points, scores, ground = synthetic_scan
    params = ClusterParams(roi=SURROUND_ROI, closing_cells=closing)
    assert _assert_same(points, scores, params, ground).shape[0] >= 5
    assert _assert_same(points, scores, ClusterParams(closing_cells=closing), None).size


def _assert_tie_in_reference_order(
    points: np.ndarray, params: ClusterParams, first_x_sign: float
) -> None:
    scores = np.ones(points.shape[0], dtype=np.float32)
    boxes = _assert_same(points, scores, params, None)
    assert boxes.shape == (2,)
    distance = np.hypot(boxes["x"], boxes["y"])
    assert distance[0] == distance[1]
    assert np.sign(boxes["x"][0]) == first_x_sign


def test_boxes_at_equal_distances_keep_the_reference_order() -> None:
    # Boxes at exactly the same distance come in the order cv2 numbered their blobs. It
    # labels 2 x 2 blocks of cells: these rows of returns start in rows 400 and 399, which
    # share a block row only in a window that starts on an odd row.
    xs = np.arange(-10.0, -8.95, 0.05)
    left = np.c_[xs, np.full(xs.size, 0.05), np.full(xs.size, -1.0)]
    points = np.r_[left, -left * [1, 1, -1]].astype(np.float32)
    _assert_tie_in_reference_order(points, ClusterParams(roi=SURROUND_ROI), 1.0)


def test_a_window_margin_of_the_closing_radius_would_renumber_blobs() -> None:
    # With a margin of only r cells, the erosion takes the rows above the window for set, so
    # blob A (its top in row 400) gains cells in rows 398-399 and is numbered before blob B
    # (its top in row 401, further left); with more margin the numbering is the whole grid's.
    steps = np.arange(0.0, 2.0 + 1e-9, 0.0625)
    a_x, a_y = np.meshgrid(4.0 + steps, 0.0625 + steps[:17])
    b_x, b_y = np.meshgrid(-6.0 + steps, 0.1875 + steps[:13])
    points = np.c_[
        np.r_[a_x.ravel(), b_x.ravel()],
        np.r_[a_y.ravel(), b_y.ravel()],
        np.full(a_x.size + b_x.size, -1.0),
    ].astype(np.float32)
    params = ClusterParams(roi=SURROUND_ROI, closing_cells=2)
    _assert_tie_in_reference_order(points, params, -1.0)
