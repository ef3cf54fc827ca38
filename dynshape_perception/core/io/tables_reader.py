"""The README's reader of obstacle, track and prediction tables: NumPy only, copy it freely."""

from __future__ import annotations

from typing import Any

import numpy as np

# PointField datatype code -> NumPy type (sensor_msgs/PointField constants 1-8).
_POINTFIELD_TYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 8: "f8"}


def read_table(msg: Any) -> np.ndarray:
    """One row per point of a sensor_msgs/PointCloud2 table, as a NumPy structured array.

    ``rows["x"]``, ``rows["id"]`` ... hold the columns; the fields are those the message
    declares, so the same function reads obstacles, tracks and predictions.
    """
    endian = ">" if msg.is_bigendian else "<"
    dtype = np.dtype(
        {
            "names": [f.name for f in msg.fields],
            "formats": [endian + _POINTFIELD_TYPES[f.datatype] for f in msg.fields],
            "offsets": [f.offset for f in msg.fields],
            "itemsize": msg.point_step,
        }
    )
    rows = np.frombuffer(bytes(msg.data), dtype=dtype, count=msg.width * msg.height)
    return rows.astype(dtype.newbyteorder("="))
