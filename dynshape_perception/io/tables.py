"""Checks of obstacle and track tables read from messages."""

from __future__ import annotations

import numpy as np

from dynshape_perception.io.pointcloud2 import BAD_BOX_SIZE, CloudError

BOX_SIZES = ("length", "width", "height")


def check_box_sizes(table: np.ndarray, what: str = "obstacle") -> np.ndarray:
    """``table`` unchanged if every box has a positive, finite length, width and height.

    A box of no size has no extent to match against a track: a CloudError (``bad_box_size``).
    """
    for name in BOX_SIZES:
        sizes = table[name]
        bad = ~(np.isfinite(sizes) & (sizes > 0.0))
        if bad.any():
            row = int(np.argmax(bad))
            raise CloudError(
                BAD_BOX_SIZE,
                f"{what} {row} has {name} {float(sizes[row])!r}, which is not positive",
            )
    return table
