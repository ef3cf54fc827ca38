"""Segmentation quality against a RANSAC ground reference, and bird's-eye-view plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Polygon, Rectangle

from dynshape_perception.config import Roi, check_seed, default_config
from dynshape_perception.errors import ConfigError, DataError, ShapeError
from dynshape_perception.perception.ground import fit_ground_plane
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    LABEL_UNKNOWN,
)

GROUND_BAND_M = 0.2
RAISED_ABOVE_M = 0.3
RANGE_CIRCLE_M = 40.0
PLOT_DPI = 150
PLOT_SIZE_IN = (10.0, 10.0)
PLOT_MARGIN_M = 5.0
_GROUND_POINT_SIZE = 0.5
_OBSTACLE_POINT_SIZE = 1.5
_LABEL_COLOURS = {
    LABEL_UNKNOWN: "tab:orange",
    LABEL_CAR: "tab:red",
    LABEL_PEDESTRIAN: "tab:blue",
    LABEL_POLE: "tab:green",
}
_CLUSTER_FIELDS = ("x", "y", "z", "length", "width", "height", "yaw")


def _check_scan(points: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    points, scores = np.asarray(points), np.asarray(scores)
    if points.ndim != 2 or points.shape[1] < 3:
        raise ShapeError(f"points must be [P, >=3], got shape {points.shape}")
    if scores.shape != (points.shape[0],):
        raise ShapeError(f"scores must be [P={points.shape[0]}], got shape {scores.shape}")
    return points, scores


def _in_roi(points: np.ndarray, roi: Roi) -> np.ndarray:
    inside = np.ones(points.shape[0], dtype=bool)
    for axis, (lo, hi) in enumerate((roi.x_m, roi.y_m, roi.z_m)):
        inside &= (points[:, axis] >= lo) & (points[:, axis] < hi)
    return inside


def _share(mask: np.ndarray) -> float:
    return float(mask.mean()) if mask.size else float("nan")


def cluster_dicts(clusters: np.ndarray) -> list[dict[str, float | int]]:
    """OBSTACLE_DTYPE rows as plain dicts: box fields in metres and radians, and the point count."""
    return [
        {
            **{name: float(row[name]) for name in _CLUSTER_FIELDS},
            "num_points": int(row["num_points"]),
        }
        for row in clusters
    ]


def evaluate_segmentation(
    points: np.ndarray,
    scores: np.ndarray,
    obstacle_threshold: float,
    clusters: np.ndarray,
    seed: int = 0,
    roi: Roi | None = None,
) -> dict[str, Any]:
    """Score a segmentation against a RANSAC ground reference fitted to the scan itself.

    ``ground_excluded`` is the share of all points within GROUND_BAND_M of the fitted plane
    that are scored non-obstacle (score <= threshold); ``raised_detected`` the share of ROI
    points more than RAISED_ABOVE_M above it scored obstacle. A share over no points is NaN.
    """
    check_seed("seed", seed)
    points, scores = _check_scan(points, scores)
    roi = roi or default_config().roi
    height = fit_ground_plane(points, seed=seed).height(points)
    obstacle = scores > obstacle_threshold
    inside = _in_roi(points, roi)
    reference_ground = np.abs(height) <= GROUND_BAND_M
    raised = inside & (height > RAISED_ABOVE_M)
    return {
        "ground_excluded": _share(~obstacle[reference_ground]),
        "raised_detected": _share(obstacle[raised]),
        "clusters": cluster_dicts(clusters),
        "num_points": int(points.shape[0]),
        "roi_points": int(inside.sum()),
    }


def _box_corners(row: np.void) -> np.ndarray:
    half = np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]]) * 0.5
    local = half * np.array([float(row["length"]), float(row["width"])])
    cos, sin = np.cos(float(row["yaw"])), np.sin(float(row["yaw"]))
    rotation = np.array([[cos, -sin], [sin, cos]])
    return local @ rotation.T + np.array([float(row["x"]), float(row["y"])])


def check_plot_path(path_png: str | Path) -> Path:
    """The plot path, if matplotlib can write its format: checked before the slow evaluation."""
    path = Path(path_png)
    formats = Figure().canvas.get_supported_filetypes()
    if path.suffix.lower().lstrip(".") not in formats:
        raise ConfigError(
            f"cannot write plot {path}: its suffix must be one of "
            f"{', '.join('.' + f for f in sorted(formats))}"
        )
    if path.is_dir():
        raise ConfigError(f"cannot write plot {path}: it is a folder")
    return path


def plot_bev(
    path_png: str | Path,
    points: np.ndarray,
    scores: np.ndarray,
    clusters: np.ndarray,
    roi: Roi,
    obstacle_threshold: float = 0.5,
    range_circle_m: float = RANGE_CIRCLE_M,
    title: str = "",
    dpi: int = PLOT_DPI,
) -> Path:
    """Write a bird's-eye-view PNG: non-obstacle points grey, obstacle points by height, boxes.

    x (forward) points up the page and y (left) to the left, as seen from above the sensor.
    Box colours follow the label: car red, pedestrian blue, pole green, unknown orange.
    """
    points, scores = _check_scan(points, scores)
    path = check_plot_path(path_png)
    obstacle = scores > obstacle_threshold
    fig = Figure(figsize=PLOT_SIZE_IN)
    ax = fig.subplots()
    ax.scatter(
        points[~obstacle, 1], points[~obstacle, 0], s=_GROUND_POINT_SIZE, c="0.6", linewidths=0
    )
    coloured = ax.scatter(
        points[obstacle, 1],
        points[obstacle, 0],
        s=_OBSTACLE_POINT_SIZE,
        c=points[obstacle, 2],
        cmap="viridis",
        linewidths=0,
    )
    if obstacle.any():
        fig.colorbar(coloured, ax=ax, shrink=0.7, label="obstacle point z [m]")
    for index, row in enumerate(clusters):
        corners = _box_corners(row)
        colour = _LABEL_COLOURS.get(int(row["label"]), _LABEL_COLOURS[LABEL_UNKNOWN])
        ax.add_patch(Polygon(corners[:, ::-1], closed=True, fill=False, ec=colour, lw=1.2))
        ax.annotate(str(index), (float(row["y"]), float(row["x"])), fontsize=6, color=colour)
    (x_lo, x_hi), (y_lo, y_hi) = roi.x_m, roi.y_m
    ax.add_patch(
        Rectangle((y_lo, x_lo), y_hi - y_lo, x_hi - x_lo, fill=False, ls="--", ec="k", lw=0.8)
    )
    ax.add_patch(Circle((0.0, 0.0), range_circle_m, fill=False, ls=":", ec="k", lw=0.8))
    ax.set_xlim(y_hi + PLOT_MARGIN_M, y_lo - PLOT_MARGIN_M)
    ax.set_ylim(x_lo - PLOT_MARGIN_M, x_hi + PLOT_MARGIN_M)
    ax.set_aspect("equal")
    ax.set_xlabel("y [m] (left)")
    ax.set_ylabel("x [m] (forward)")
    ax.grid(True, lw=0.3)
    ax.set_title(title or f"{points.shape[0]} points, {len(clusters)} clusters")
    try:
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
    except (OSError, ValueError) as err:
        raise DataError(f"cannot write plot {path}: {err}") from err
    return path
