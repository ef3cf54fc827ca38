"""The README's reader of obstacle, track and prediction tables: NumPy only, copy it freely."""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    from dynshape_perception.errors import MessageError as TableError
except ImportError:  # copied out of the package, where NumPy is all there is
    TableError = ValueError  # type: ignore[misc, assignment]

# PointField datatype code -> NumPy type (sensor_msgs/PointField constants 1-8).
_POINTFIELD_TYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 8: "f8"}


def read_table(msg: Any) -> np.ndarray:
    """One row per point of a sensor_msgs/PointCloud2 table, as a NumPy structured array.

    ``rows["x"]``, ``rows["id"]`` ... hold the columns; the fields are those the message
    declares, so the same function reads obstacles, tracks and predictions. Organised
    clouds are read row by row, skipping the padding at the end of each row (``row_step``).
    A message whose layout does not hold together raises ``TableError``.
    """
    height, width = int(msg.height), int(msg.width)
    point_step, row_step = int(msg.point_step), int(msg.row_step)
    data = bytes(msg.data)
    endian = ">" if msg.is_bigendian else "<"
    formats = []
    for f in msg.fields:
        code = _POINTFIELD_TYPES.get(int(f.datatype))
        if code is None:
            raise TableError(f"field {f.name!r} has datatype {f.datatype}, not a code 1-8")
        formats.append(endian + code)
    if min(height, width, point_step, row_step) < 0 or row_step < width * point_step:
        raise TableError(
            f"bad layout: height {height}, width {width}, point_step {point_step}, "
            f"row_step {row_step} (row_step must be >= width x point_step)"
        )
    if len(data) < row_step * height:
        raise TableError(
            f"data holds {len(data)} bytes, fewer than row_step x height = {row_step * height}"
        )
    try:
        dtype = np.dtype(
            {
                "names": [str(f.name) for f in msg.fields],
                "formats": formats,
                "offsets": [int(f.offset) for f in msg.fields],
                "itemsize": point_step,
            }
        )
    except ValueError as err:
        raise TableError(f"the fields do not fit a {point_step}-byte point: {err}") from err
    grid = np.ndarray(
        shape=(height, width), dtype=dtype, buffer=data, strides=(row_step, point_step)
    )
    return grid.reshape(-1).astype(dtype.newbyteorder("="))
