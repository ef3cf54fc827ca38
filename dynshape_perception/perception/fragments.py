"""Far fragments of one object joined: clusters of a cell or two merged into their nearest one."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np

LabelFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

# A cluster at most this many cells long and wide is a fragment (a lidar column or two).
FRAGMENT_MAX_CELLS = 2.5
# Fragments whose gaps to every box are computed at once: a block stays a few MB.
_BLOCK_ROWS = 256


def _corners(boxes: np.ndarray) -> np.ndarray:
    """``[K, 4, 2]`` footprint corners of OBSTACLE_DTYPE boxes."""
    c, s = np.cos(boxes["yaw"]), np.sin(boxes["yaw"])
    hl, hw = boxes["length"] / 2.0, boxes["width"] / 2.0
    du = np.stack([hl * c, hl * s], axis=1)
    dv = np.stack([-hw * s, hw * c], axis=1)
    centre = np.stack([boxes["x"], boxes["y"]], axis=1)
    return np.stack([centre + du + dv, centre + du - dv, centre - du - dv, centre - du + dv], 1)


def _nearest_in_reach(
    centre: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    half_length: np.ndarray,
    half_width: np.ndarray,
    reach: np.ndarray,
    fragment: np.ndarray,
    gap_rad: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Each fragment that has a box within reach, and the box it joins: a whole cluster
    first, else the nearest fragment; a block of fragments at a time, each row computed as
    one fragment's alone."""
    frags = np.flatnonzero(fragment)
    limit = gap_rad * np.hypot(centre[frags, 0], centre[frags, 1])
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    for lo in range(0, frags.size, _BLOCK_ROWS):
        block = frags[lo : lo + _BLOCK_ROWS]
        # From the fragment's centre to each footprint, less the fragment's own reach.
        dx = centre[block, 0, None] - centre[:, 0]
        dy = centre[block, 1, None] - centre[:, 1]
        along = np.abs(cos * dx + sin * dy) - half_length
        across = np.abs(-sin * dx + cos * dy) - half_width
        gap = np.hypot(np.maximum(along, 0.0), np.maximum(across, 0.0)) - reach[block, None]
        gap[np.arange(block.size), block] = np.inf
        within = gap <= limit[lo : lo + _BLOCK_ROWS, None]
        # A whole cluster in reach first: two fragments nearest to each other would else
        # pair off beside the object they are part of.
        whole = within & ~fragment
        pick = np.where(whole.any(axis=1, keepdims=True), whole, within)
        found = pick.any(axis=1)
        rows.append(block[found])
        cols.append(np.argmin(np.where(pick[found], gap[found], np.inf), axis=1))
    return np.concatenate(rows), np.concatenate(cols)


def _components(n: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Each of ``n`` nodes' connected component under the undirected edges ``rows``-``cols``,
    named by its least node (scipy's connected_components numbers them in that order, but
    its sparse matrices cost more to set up than the search on a few dozen boxes)."""
    label = np.arange(n)
    while True:
        least = np.minimum(label[rows], label[cols])
        lowered = label.copy()
        np.minimum.at(lowered, rows, least)
        np.minimum.at(lowered, cols, least)
        # Each label is a node of the same component with a label no greater: jump to it.
        lowered = lowered[lowered]
        if np.array_equal(lowered, label):
            return label
        label = lowered


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
    # One edge from each fragment: a chain of k fragments has k edges, never the k + 1 that
    # would join two clusters that are no fragments.
    root = _components(n, rows, cols)
    corners = _corners(boxes).astype(np.float64)
    # Each component's least node names it: those nodes, in order, are np.unique's first
    # occurrences of the names, without its sort.
    first = np.flatnonzero(root == np.arange(n))
    sizes = np.bincount(root, minlength=n)[first]
    out = boxes[first].copy()
    # Each group's members in index order, one slice each.
    by_group = np.argsort(root, kind="stable")
    ends = np.cumsum(sizes)
    top = boxes["z"] + boxes["height"] / 2.0
    bottom = boxes["z"] - boxes["height"] / 2.0
    num_points, score = boxes["num_points"], boxes["score"]
    joined = np.flatnonzero(sizes > 1)
    # Per joined group, in Python floats (IEEE doubles, as NumPy's float64 scalars), set in
    # the table a column at a time: a row's fields set one by one cost more than the fit.
    values: list[tuple[float, ...]] = []
    for i in joined.tolist():
        members = by_group[ends[i] - sizes[i] : ends[i]]
        rect = cv2.minAreaRect(corners[members].reshape(-1, 2).astype(np.float32))
        (x0, y0), (x1, y1), (x2, y2), (x3, y3) = cv2.boxPoints(rect).tolist()
        a, b = (x1 - x0, y1 - y0), (x2 - x1, y2 - y1)
        la, lb = float(np.hypot(*a)), float(np.hypot(*b))
        long_edge = a if la >= lb else b
        yaw = float(np.arctan2(long_edge[1], long_edge[0]))
        yaw = yaw + np.pi if yaw <= -np.pi / 2 else yaw - np.pi if yaw > np.pi / 2 else yaw
        count = num_points[members].astype(np.float64)
        total = count.sum()
        hi, lo = float(top[members].max()), float(bottom[members].min())
        values.append(
            (
                (((x0 + x1) + x2) + x3) / 4.0,
                (((y0 + y1) + y2) + y3) / 4.0,
                max(la, lb),
                min(la, lb),
                yaw,
                (hi + lo) / 2.0,
                hi - lo,
                float((score[members] * count).sum() / total),
                int(total),
            )
        )
    if values:
        names = ("x", "y", "length", "width", "yaw", "z", "height", "score", "num_points")
        for name, column in zip(names, zip(*values, strict=True), strict=True):
            out[name][joined] = column
    out["label"] = label(out["length"], out["width"], out["height"])
    nearest_first: np.ndarray = out[np.argsort(np.hypot(out["x"], out["y"]), kind="stable")]
    return nearest_first
