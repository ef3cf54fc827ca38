"""Far fragments of one object joined: clusters of a cell or two merged into their nearest one."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

LabelFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

# A cluster at most this many cells long and wide is a fragment (a lidar column or two).
FRAGMENT_MAX_CELLS = 2.5


def _corners(boxes: np.ndarray) -> np.ndarray:
    """``[K, 4, 2]`` footprint corners of OBSTACLE_DTYPE boxes."""
    c, s = np.cos(boxes["yaw"]), np.sin(boxes["yaw"])
    hl, hw = boxes["length"] / 2.0, boxes["width"] / 2.0
    du = np.stack([hl * c, hl * s], axis=1)
    dv = np.stack([-hw * s, hw * c], axis=1)
    centre = np.stack([boxes["x"], boxes["y"]], axis=1)
    return np.stack([centre + du + dv, centre + du - dv, centre - du - dv, centre - du + dv], 1)


def merge_fragments(
    boxes: np.ndarray, cell_size_m: float, gap_rad: float, label: LabelFn
) -> np.ndarray:
    """``boxes`` (OBSTACLE_DTYPE, nearest first) with each fragment joined to its nearest
    cluster whose footprint lies within ``gap_rad`` times the fragment's range (the nearest
    fragment where no larger cluster is in reach).

    Far from the sensor its columns are far apart: the side of a car seen at a grazing
    angle 50 m away gives a column every metre or so, each a cluster of one cell that the
    size rule calls a pedestrian. Each fragment joins one cluster only, so
    a fragment never bridges two objects; the joined boxes are refitted around all their
    corners and labelled again by ``label`` (the size rule).
    """
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
    edges: list[tuple[int, int]] = []
    for k in np.flatnonzero(fragment):
        # From the fragment's centre to each footprint, less the fragment's own reach.
        d = centre[k] - centre
        along = np.abs(cos * d[:, 0] + sin * d[:, 1]) - half_length
        across = np.abs(-sin * d[:, 0] + cos * d[:, 1]) - half_width
        gap = np.hypot(np.maximum(along, 0.0), np.maximum(across, 0.0)) - reach[k]
        gap[k] = np.inf
        within = gap <= gap_rad * float(np.hypot(*centre[k]))
        # A whole cluster in reach first: two fragments nearest to each other would else
        # pair off beside the object they are part of.
        pick = within & ~fragment if (within & ~fragment).any() else within
        if pick.any():
            edges.append((int(k), int(np.argmin(np.where(pick, gap, np.inf)))))
    if not edges:
        return boxes
    # One edge from each fragment: a chain of k fragments has k edges, never the k + 1 that
    # would join two clusters that are no fragments.
    rows, cols = np.array(edges).T
    graph = coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    _, root = connected_components(graph, directed=False)
    groups = np.unique(root)
    first = np.array([np.flatnonzero(root == g)[0] for g in groups])
    out = boxes[first].copy()
    top = boxes["z"] + boxes["height"] / 2.0
    bottom = boxes["z"] - boxes["height"] / 2.0
    for i, g in enumerate(groups):
        members = np.flatnonzero(root == g)
        if members.size == 1:
            continue
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
    out["label"] = label(out["length"], out["width"], out["height"])
    nearest_first: np.ndarray = out[np.argsort(np.hypot(out["x"], out["y"]), kind="stable")]
    return nearest_first
