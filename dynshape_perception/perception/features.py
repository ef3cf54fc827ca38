"""Association features of obstacle and track rows: the associator model's input layout."""

from __future__ import annotations

import numpy as np

from dynshape_perception.errors import InputValueError, ShapeError

ASSOC_FEATURES = 8
FEATURE_FIELDS = ("x", "y", "z", "length", "width", "height", "yaw")


def obstacle_features(rows: np.ndarray) -> np.ndarray:
    """Features ``x, y, z, length, width, height, cos 2yaw, sin 2yaw`` as float32 ``[N, 8]``.

    ``rows`` is any 1-D structured array with the obstacle fields (OBSTACLE_DTYPE,
    TRACK_DTYPE). The yaw is doubled because a box's heading is only known modulo pi.
    """
    names = rows.dtype.names or ()
    missing = [name for name in FEATURE_FIELDS if name not in names]
    if missing:
        raise ShapeError(f"feature rows lack fields {missing}; got dtype {rows.dtype}")
    if rows.ndim != 1:
        raise ShapeError(f"feature rows must be 1-D, got shape {rows.shape}")
    feats = np.empty((rows.shape[0], ASSOC_FEATURES), dtype=np.float32)
    for col, name in enumerate(FEATURE_FIELDS[:-1]):
        feats[:, col] = rows[name]
    double_yaw = 2.0 * rows["yaw"].astype(np.float64)
    feats[:, 6] = np.cos(double_yaw)
    feats[:, 7] = np.sin(double_yaw)
    if not np.isfinite(feats).all():
        bad = np.flatnonzero(~np.isfinite(feats).all(axis=1))
        raise InputValueError(f"non-finite obstacle fields in rows {bad.tolist()[:10]}")
    return feats
