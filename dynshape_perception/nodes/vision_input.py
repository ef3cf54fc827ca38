"""Opt-in vision_msgs/Detection3DArray input of the tracker, read into the obstacle table."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from dynshape_perception.errors import ConfigError, MessageError
from dynshape_perception.io.tables import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    LABEL_UNKNOWN,
    OBSTACLE_DTYPE,
    check_box_sizes,
)
from dynshape_perception.perception.odometry import yaw_from_quaternion

UINT32_MAX = 2**32 - 1
CLASS_LABELS = {
    "car": LABEL_CAR,
    "vehicle": LABEL_CAR,
    "pedestrian": LABEL_PEDESTRIAN,
    "person": LABEL_PEDESTRIAN,
    "pole": LABEL_POLE,
}


def detection3d_array_type() -> type:
    """The message class, or ConfigError naming what to install."""
    try:
        module = importlib.import_module("vision_msgs.msg")
    except ImportError as err:
        raise ConfigError(
            "tracker.input_type is 'vision_msgs', but the vision_msgs package is not "
            "installed (apt install ros-$ROS_DISTRO-vision-msgs)"
        ) from err
    return type(module.Detection3DArray())


def _label(class_id: str) -> int:
    """A class name (unknown names: LABEL_UNKNOWN) or a uint32 label in ASCII digits."""
    text = class_id.strip().lower()
    digits = text[1:] if text[:1] in "+-" else text
    if digits.isascii() and digits.isdecimal() and digits == text:
        label = int(text)
        if label > UINT32_MAX:
            raise MessageError(f"class_id {class_id!r} exceeds the uint32 label range")
        return label
    # int() would take these (or fail on them); a label is an unsigned ASCII number.
    if digits.isnumeric():
        raise MessageError(f"class_id {class_id!r} is not an unsigned ASCII number")
    return CLASS_LABELS.get(text, LABEL_UNKNOWN)


def detections_to_obstacles(msg: Any) -> np.ndarray:
    """Boxes of a Detection3DArray as obstacle rows; score and label from the best hypothesis."""
    out = np.zeros(len(msg.detections), dtype=OBSTACLE_DTYPE)
    for i, det in enumerate(msg.detections):
        centre, size = det.bbox.center, det.bbox.size
        q = centre.orientation
        out[i]["x"], out[i]["y"], out[i]["z"] = (
            centre.position.x,
            centre.position.y,
            centre.position.z,
        )
        out[i]["length"], out[i]["width"], out[i]["height"] = size.x, size.y, size.z
        out[i]["yaw"] = yaw_from_quaternion(q.x, q.y, q.z, q.w)
        if det.results:
            best = max(det.results, key=lambda r: r.hypothesis.score)
            out[i]["score"] = best.hypothesis.score
            out[i]["label"] = _label(str(best.hypothesis.class_id))
    floats = [n for n in OBSTACLE_DTYPE.names or () if OBSTACLE_DTYPE[n].kind == "f"]
    if out.size and not all(np.isfinite(out[n]).all() for n in floats):
        raise MessageError("a detection holds NaN or Inf")
    return check_box_sizes(out, "detection")
