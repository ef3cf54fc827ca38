"""Row layouts of the obstacle, track and prediction tables (the wire tables of the README)."""

from __future__ import annotations

import numpy as np

OBSTACLE_DTYPE = np.dtype(
    [
        ("x", "<f4"),
        ("y", "<f4"),
        ("z", "<f4"),
        ("length", "<f4"),
        ("width", "<f4"),
        ("height", "<f4"),
        ("yaw", "<f4"),
        ("score", "<f4"),
        ("label", "<u4"),
        ("num_points", "<u4"),
    ]
)

TRACK_DTYPE = np.dtype(
    [*OBSTACLE_DTYPE.descr, ("id", "<u4"), ("vx", "<f4"), ("vy", "<f4"), ("age", "<u4")]
)

PREDICTION_DTYPE = np.dtype(
    [
        ("id", "<u4"),
        ("k", "<u4"),
        ("step", "<u4"),
        ("x", "<f4"),
        ("y", "<f4"),
        ("prob", "<f4"),
    ]
)

LABEL_UNKNOWN = 0
LABEL_CAR = 1
LABEL_PEDESTRIAN = 2
LABEL_POLE = 3


def empty(dtype: np.dtype) -> np.ndarray:
    return np.zeros(0, dtype=dtype)
