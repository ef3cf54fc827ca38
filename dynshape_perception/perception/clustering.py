"""Obstacle clustering on a bird's-eye-view occupancy grid (OpenCV): one oriented box per blob."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from dynshape_perception.config import Roi, default_config
from dynshape_perception.errors import ConfigError, ShapeError
from dynshape_perception.paramspec import MAX_COUNT, check_fields, derived, param
from dynshape_perception.perception.fragments import merge_fragments
from dynshape_perception.perception.ground import GroundPlane
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    LABEL_UNKNOWN,
    OBSTACLE_DTYPE,
    empty,
)

# Size rule of the label: footprint length (longer side) and height, metres. A car seen
# end-on shows only its ~1.8 m back or front, so a car's visible length starts well below
# its real one.
POLE_MAX_LENGTH_M = 0.6
POLE_MIN_HEIGHT_M = 2.0
PEDESTRIAN_MAX_LENGTH_M = 1.2
PEDESTRIAN_HEIGHT_M = (1.0, 2.2)
CAR_LENGTH_M = (1.5, 6.5)
CAR_MAX_WIDTH_M = 3.0
CAR_HEIGHT_M = (0.8, 2.5)

_CONNECTIVITY = 8
# The bird's-eye grid is allocated per frame, at worst over the whole ROI: 0.15 m over the
# default 60 x 60 m ROI is 160,000 cells; this allows 4096 x 4096 (2.5 cm cells over the
# default ROI).
MAX_GRID_CELLS = 4096 * 4096


def _default_roi() -> Roi:
    return default_config().roi


@dataclass(frozen=True)
class ClusterParams:
    """Clustering settings.

    The closing (radius ``r = closing_cells``) fills runs of up to ``2r`` empty cells, so
    a gap ``g`` between point sets is always bridged when ``g < (2r + 1) * cell_size_m``
    and always kept when ``g >= (2r + 2) * cell_size_m``; in between it depends on where
    the cell edges fall. The defaults (0.15 m, r = 1) bridge < 0.45 m and keep >= 0.6 m:
    on the real KITTI scan the returns of one car have 0.3-0.5 m holes, and finer cells
    split those cars. Separating objects 0.5 m apart needs ``cell_size_m <= 0.125``.
    """

    score_threshold: float = param(
        0.5, "obstacle score above which a point joins a cluster", low=0.0, high=1.0
    )
    cell_size_m: float = param(
        0.15, "bird's-eye-view cell size of the clustering", low=0.02, high=2.0
    )
    roi: Roi = derived("scan.roi_* (the crop's region of interest)", default_factory=_default_roi)
    min_points: int = param(
        5, "points a cluster needs to become an obstacle", low=1, high=MAX_COUNT
    )
    # Radius of the square closing kernel, in cells; 0 disables the closing.
    closing_cells: int = param(
        1, "radius of the morphological closing in cells; 0 disables it", low=0, high=16
    )
    # Points this low above a fitted ground are road whatever their score, as the near field
    # takes them; the full cloud then scores only the points that can join a cluster. A flat
    # default ground (no fit yet) may lie off the road, so it decides nothing here.
    min_height_m: float = param(
        0.15,
        "points lower above a fitted ground are road: left out of clusters and not scored; "
        "-10 keeps every point",
        low=-10.0,
        high=10.0,
    )
    # Points higher than this above the ground (tree canopies, signs) are left out so that
    # they cannot bridge the objects beneath them; applies only when a ground is given.
    max_height_m: float = param(
        3.0, "points higher above the ground are left out of clusters", low=0.1, high=50.0
    )
    # A cluster of a cell or two joins its nearest cluster within this angle (radians) times
    # its range: far away, one object's lidar columns fall apart (perception/fragments.py).
    # 0 disables it.
    fragment_gap_rad: float = param(
        0.03,
        "a cluster of a cell or two joins its nearest cluster within this angle times its "
        "range (far objects fall apart into lidar columns); 0 disables it",
        low=0.0,
        high=0.2,
    )

    def __post_init__(self) -> None:
        # Before the declared ranges: a grid too fine for memory says so, not just "< 0.02".
        if not (np.isfinite(self.cell_size_m) and self.cell_size_m > 0.0):
            raise ConfigError(f"cell_size_m must be > 0, got {self.cell_size_m!r}")
        if not isinstance(self.roi, Roi):
            raise ConfigError(f"roi must be a Roi, got {type(self.roi).__name__}")
        rows, cols = self.grid_shape
        if rows * cols > MAX_GRID_CELLS:
            raise ConfigError(
                f"a {self.cell_size_m} m grid over the ROI has {rows} x {cols} cells, above "
                f"{MAX_GRID_CELLS}: raise cell_size_m or shrink the ROI"
            )
        check_fields(self)
        if self.min_height_m >= self.max_height_m:
            raise ConfigError(
                f"min_height_m ({self.min_height_m}) must lie below max_height_m "
                f"({self.max_height_m})"
            )

    @property
    def grid_shape(self) -> tuple[int, int]:
        """Rows (along y) and columns (along x) of the bird's-eye-view grid."""
        (x_lo, x_hi), (y_lo, y_hi) = self.roi.x_m, self.roi.y_m
        return (
            int(np.ceil((y_hi - y_lo) / self.cell_size_m)),
            int(np.ceil((x_hi - x_lo) / self.cell_size_m)),
        )


def size_label(length_m: np.ndarray, width_m: np.ndarray, height_m: np.ndarray) -> np.ndarray:
    """Label each box (uint32) by the size rule: pole, pedestrian, car or unknown."""
    labels = np.full(np.shape(length_m), LABEL_UNKNOWN, dtype=np.uint32)
    car = (
        (length_m >= CAR_LENGTH_M[0])
        & (length_m <= CAR_LENGTH_M[1])
        & (width_m <= CAR_MAX_WIDTH_M)
        & (height_m >= CAR_HEIGHT_M[0])
        & (height_m <= CAR_HEIGHT_M[1])
    )
    pedestrian = (
        (length_m <= PEDESTRIAN_MAX_LENGTH_M)
        & (height_m >= PEDESTRIAN_HEIGHT_M[0])
        & (height_m <= PEDESTRIAN_HEIGHT_M[1])
    )
    pole = (length_m <= POLE_MAX_LENGTH_M) & (height_m >= POLE_MIN_HEIGHT_M)
    labels[car] = LABEL_CAR
    labels[pedestrian] = LABEL_PEDESTRIAN
    labels[pole] = LABEL_POLE
    return labels


def _oriented_rects(corners: np.ndarray) -> tuple[np.ndarray, ...]:
    """Centre x, y, length >= width and yaw in (-pi/2, pi/2] of each ``[K, 4, 2]`` boxPoints box."""
    corners = corners.astype(np.float64)
    edge_a = corners[:, 1] - corners[:, 0]
    edge_b = corners[:, 2] - corners[:, 1]
    len_a = np.hypot(edge_a[:, 0], edge_a[:, 1])
    len_b = np.hypot(edge_b[:, 0], edge_b[:, 1])
    # boxPoints, not the angle of minAreaRect: its angle convention changed in OpenCV 4.5.
    long_edge = np.where((len_a >= len_b)[:, None], edge_a, edge_b)
    yaw = np.arctan2(long_edge[:, 1], long_edge[:, 0])
    yaw = np.where(yaw <= -np.pi / 2, yaw + np.pi, np.where(yaw > np.pi / 2, yaw - np.pi, yaw))
    centre = (corners[:, 0] + corners[:, 1] + corners[:, 2] + corners[:, 3]) / 4.0
    return centre[:, 0], centre[:, 1], np.maximum(len_a, len_b), np.minimum(len_a, len_b), yaw


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _float32_at_or_above(bound: float) -> np.float32:
    """The smallest float32 ``>= bound``: for every float32 ``x``, ``x >= bound`` and
    ``x < bound`` decide as they would in float64."""
    if bound > _FLOAT32_MAX:
        return np.float32(np.inf)
    value = np.float32(max(bound, -_FLOAT32_MAX))
    return np.nextafter(value, np.float32(np.inf)) if float(value) < bound else value


def _in_roi(xyz: np.ndarray, roi: Roi) -> np.ndarray:
    """Whether each row of ``xyz`` (float32 or float64) is inside ``roi`` (half-open, as
    compared in float64)."""
    inside = np.ones(xyz.shape[0], dtype=bool)
    for axis, bounds in enumerate((roi.x_m, roi.y_m, roi.z_m)):
        lo, hi = map(_float32_at_or_above, bounds) if xyz.dtype == np.float32 else bounds
        values = xyz[:, axis]
        inside &= values >= lo
        inside &= values < hi
    return inside


def _window(cells: np.ndarray, size: int, margin: int) -> tuple[int, int]:
    """The cells ``[lo, hi)`` of one grid axis that are closed and labelled: the occupied
    ``cells`` and ``margin`` more each side, within ``[0, size)``, from an even cell.

    With ``margin > closing_cells`` the closing leaves the cells outside empty, as on the
    whole grid; cv2's erosion takes the outside of its image as set, and the margin keeps
    that away from the objects. cv2 labels 2 x 2 blocks, so an even start keeps its
    numbering of the blobs that of the whole grid.
    """
    lo = max(int(cells.min()) - margin, 0) & ~1
    hi = min(int(cells.max()) + 1 + margin, size)
    return lo, hi


def rows_to_score(
    points: np.ndarray, params: ClusterParams, ground: GroundPlane
) -> np.ndarray | None:
    """The rows of ``points`` whose score can decide anything: those ``cluster_obstacles``
    would keep at any score (None: every row)."""
    if ground.is_default:
        return None
    heights = ground.height(points)
    return np.flatnonzero((heights >= params.min_height_m) & (heights <= params.max_height_m))


def cluster_obstacles(
    points: np.ndarray,
    scores: np.ndarray,
    params: ClusterParams | None = None,
    ground: GroundPlane | None = None,
) -> np.ndarray:
    """Cluster the points scored above the threshold into OBSTACLE_DTYPE boxes, nearest first.

    ``points`` is ``[P, >=3]`` (x, y, z in metres, scan frame) and ``scores`` ``[P]``. With a
    ground plane the boxes stand on it and their height is that of the highest member point
    above it; without one, the box spans the member points' z. Footprints are at least one
    cell wide.
    """
    params = params or ClusterParams()
    points = np.asarray(points)
    scores = np.asarray(scores)
    if points.ndim != 2 or points.shape[1] < 3:
        raise ShapeError(f"points must be [P, >=3], got shape {points.shape}")
    if scores.shape != (points.shape[0],):
        raise ShapeError(f"scores must be [P={points.shape[0]}], got shape {scores.shape}")

    # Float32 points stay float32: converted to float64 they are exact, and every decision
    # below is taken as in float64. np.take gathers rows many times faster than indexing.
    source = points if points.dtype == np.float32 else points[:, :3].astype(np.float64)
    candidates = np.flatnonzero(scores > params.score_threshold)
    rows = np.take(source, candidates, axis=0)
    keep = _in_roi(rows, params.roi)
    # A height is the dot product of its own row alone: the same on these rows as on all.
    heights = ground.height(rows) if ground is not None else None
    if heights is not None:
        keep &= heights <= params.max_height_m
        if ground is not None and not ground.is_default:
            keep &= heights >= params.min_height_m
    kept = np.flatnonzero(keep)
    if kept.size == 0:
        return empty(OBSTACLE_DTYPE)
    member_scores = np.take(scores, candidates[kept]).astype(np.float64)

    num_rows, num_cols = params.grid_shape
    x = np.take(rows[:, 0], kept).astype(np.float64)
    y = np.take(rows[:, 1], kept).astype(np.float64)
    # Cells counted from the ROI's corner, exactly as on the whole grid.
    col = np.minimum(((x - params.roi.x_m[0]) / params.cell_size_m).astype(np.int64), num_cols - 1)
    row = np.minimum(((y - params.roi.y_m[0]) / params.cell_size_m).astype(np.int64), num_rows - 1)
    margin = params.closing_cells + 1
    row_lo, row_hi = _window(row, num_rows, margin)
    col_lo, col_hi = _window(col, num_cols, margin)
    width = col_hi - col_lo
    cell = (row - row_lo) * width + (col - col_lo)
    grid: np.ndarray = np.zeros((row_hi - row_lo, width), dtype=np.uint8)
    grid.ravel()[cell] = 1
    if params.closing_cells:
        side = 2 * params.closing_cells + 1
        kernel = cv2.getStructuringElement(cv2.MORPH_RECT, (side, side))
        grid = cv2.morphologyEx(grid, cv2.MORPH_CLOSE, kernel)
    num_labels, label_img = cv2.connectedComponents(
        grid, connectivity=_CONNECTIVITY, ltype=cv2.CV_32S
    )
    # Every kept point's cell is occupied, and closing never clears an occupied cell.
    comp = label_img.ravel()[cell] - 1
    counts = np.bincount(comp, minlength=num_labels - 1)
    present = np.flatnonzero(counts >= params.min_points)
    if present.size == 0:
        return empty(OBSTACLE_DTYPE)

    # Each group in its points' order: minAreaRect's result can depend on the order of its
    # input where rectangles tie. A stable sort of 16-bit keys is a radix sort.
    order = np.argsort(comp.astype(np.uint16) if num_labels <= 1 << 16 else comp, kind="stable")
    members = kept[order]
    ends = np.cumsum(counts)
    starts = ends - counts
    # reduceat runs each slice up to the next given start, so only non-empty groups are given.
    filled = np.flatnonzero(counts)
    present_of_filled = np.flatnonzero(counts[filled] >= params.min_points)

    def group_reduce(ufunc: np.ufunc, sorted_values: np.ndarray) -> np.ndarray:
        reduced = ufunc.reduceat(sorted_values, starts[filled])[present_of_filled]
        return np.asarray(reduced, dtype=np.float64)

    score_sum = np.bincount(comp, weights=member_scores, minlength=counts.size)
    score_mean = score_sum[present] / counts[present]

    # From the float64 copies of x and y (exact): gathering whole rows and copying two
    # strided columns out of them costs several times more.
    sorted_xy = np.empty((kept.size, 2), dtype=np.float32)
    sorted_xy[:, 0] = np.take(x, order)
    sorted_xy[:, 1] = np.take(y, order)
    corners = np.empty((present.size, 4, 2), dtype=np.float32)
    spans = zip(starts[present].tolist(), ends[present].tolist(), strict=True)
    for i, (start, end) in enumerate(spans):
        corners[i] = cv2.boxPoints(cv2.minAreaRect(sorted_xy[start:end]))

    out = np.zeros(present.size, dtype=OBSTACLE_DTYPE)
    out["x"], out["y"], out["length"], out["width"], out["yaw"] = _oriented_rects(corners)
    out["length"] = np.maximum(out["length"], params.cell_size_m)
    out["width"] = np.maximum(out["width"], params.cell_size_m)
    if ground is not None and heights is not None:
        top_height = group_reduce(np.maximum, np.take(heights, members))
        base = ground.z_at(out["x"], out["y"])
        height = np.maximum(top_height, 0.0)
        out["z"] = base + height / 2.0
        out["height"] = height
    else:
        sorted_z = np.take(rows[:, 2], members)
        z_min = group_reduce(np.minimum, sorted_z)
        z_max = group_reduce(np.maximum, sorted_z)
        out["z"] = (z_min + z_max) / 2.0
        out["height"] = z_max - z_min
    out["score"] = score_mean
    out["num_points"] = counts[present]
    out["label"] = size_label(out["length"], out["width"], out["height"])
    distance = np.hypot(out["x"], out["y"])
    out = out[np.argsort(distance, kind="stable")]
    return merge_fragments(out, params.cell_size_m, params.fragment_gap_rad, size_label)
