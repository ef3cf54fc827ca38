"""RViz markers of tracks and predicted paths as visualization_msgs MarkerArray CDR bytes."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import numpy as np

from dynshape_perception.io.cdr import CdrWriter
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    LABEL_UNKNOWN,
)

MARKER_ARRAY = "visualization_msgs/msg/MarkerArray"
# The fields as ROS 2 Jazzy and Kilted define them, in order: the layout written here.
# Humble's Marker lacks the texture and mesh_file fields.
MARKER_LAYOUT: dict[str, tuple[tuple[str, str], ...]] = {
    MARKER_ARRAY: (("markers", "sequence<visualization_msgs/Marker>"),),
    "visualization_msgs/msg/Marker": (
        ("header", "std_msgs/Header"),
        ("ns", "string"),
        ("id", "int32"),
        ("type", "int32"),
        ("action", "int32"),
        ("pose", "geometry_msgs/Pose"),
        ("scale", "geometry_msgs/Vector3"),
        ("color", "std_msgs/ColorRGBA"),
        ("lifetime", "builtin_interfaces/Duration"),
        ("frame_locked", "boolean"),
        ("points", "sequence<geometry_msgs/Point>"),
        ("colors", "sequence<std_msgs/ColorRGBA>"),
        ("texture_resource", "string"),
        ("texture", "sensor_msgs/CompressedImage"),
        ("uv_coordinates", "sequence<visualization_msgs/UVCoordinate>"),
        ("text", "string"),
        ("mesh_resource", "string"),
        ("mesh_file", "visualization_msgs/MeshFile"),
        ("mesh_use_embedded_materials", "boolean"),
    ),
    "visualization_msgs/msg/MeshFile": (("filename", "string"), ("data", "sequence<uint8>")),
    "sensor_msgs/msg/CompressedImage": (
        ("header", "std_msgs/Header"),
        ("format", "string"),
        ("data", "sequence<uint8>"),
    ),
}
# Marker.type and Marker.action values.
ARROW = 0
CUBE = 1
LINE_STRIP = 4
TEXT_VIEW_FACING = 9
ADD = 0
DELETEALL = 3

# RViz colours (r, g, b) by obstacle label.
LABEL_RGB: dict[int, tuple[float, float, float]] = {
    LABEL_UNKNOWN: (0.7, 0.7, 0.7),
    LABEL_CAR: (0.1, 0.5, 1.0),
    LABEL_PEDESTRIAN: (1.0, 0.6, 0.1),
    LABEL_POLE: (0.6, 0.3, 0.9),
}
TEXT_RGB = (1.0, 1.0, 1.0)
MARKER_NS_BOXES = "track_boxes"
MARKER_NS_IDS = "track_ids"
MARKER_NS_PATHS = "predicted_paths"

_TIME = struct.Struct("<iI")
# id, type, action
_KIND = struct.Struct("<iii")
# color (r, g, b, a), lifetime (sec, nanosec), frame_locked
_LOOK = struct.Struct("<4fiI?")
_F64 = np.dtype("<f8")
# pose (x, y, z, qx, qy, qz, qw) and scale (x, y, z)
_POSE_SCALE = 10
_POINT_BYTES = 3 * _F64.itemsize
_UNTURNED = (0.0, 0.0, 0.0, 1.0)


@dataclass(frozen=True)
class MarkerStyle:
    box_alpha: float
    text_size_m: float
    path_width_m: float


def layout_matches(fields_of: Callable[[str], Mapping[str, str]]) -> bool:
    """Whether the message definitions ``fields_of`` gives (a type's field names and types,
    as rosidl lists them) are the layout this module writes."""
    return all(tuple(fields_of(t).items()) == want for t, want in MARKER_LAYOUT.items())


def path_bounds(predictions: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The prediction rows sorted by (id, k, step), and each (id, k) path's rows [lo, hi)."""
    if not predictions.size:
        return predictions, []
    order = np.lexsort((predictions["step"], predictions["k"], predictions["id"]))
    rows = predictions[order]
    keys = rows["id"].astype(np.int64) * (int(rows["k"].max()) + 1) + rows["k"]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]).tolist()
    return rows, list(zip(starts, [*starts[1:], len(rows)], strict=True))


def encode_markers(
    header: tuple[int, int, str], tracks: np.ndarray, predictions: np.ndarray, style: MarkerStyle
) -> bytes:
    """The CDR bytes of the MarkerArray ``nodes.messages.marker_array`` builds: a DELETEALL,
    then per track a box and its id, and per (agent, k) a path, alpha = probability; what
    ``rclpy.serialization.serialize_message`` gives (zeros where it leaves padding unset)."""
    return bytes(_encode(header, tracks, predictions, style).buf)


def markers_padding_mask(
    header: tuple[int, int, str], tracks: np.ndarray, predictions: np.ndarray, style: MarkerStyle
) -> np.ndarray:
    """``[len(encode_markers(...))]`` bool: True on the alignment padding bytes."""
    return _encode(header, tracks, predictions, style).padding_mask()


def _part(write: Callable[[CdrWriter], None]) -> CdrWriter:
    part = CdrWriter()
    write(part)
    return part


def _before_text(out: CdrWriter) -> None:
    out.u32(0)  # colors
    out.string("")  # texture_resource
    out.packed(_TIME, 0, 0)  # texture: header, format, data
    out.string("")
    out.string("")
    out.u32(0)
    out.u32(0)  # uv_coordinates


def _after_text(out: CdrWriter) -> None:
    out.string("")  # mesh_resource
    out.string("")  # mesh_file: filename, data
    out.u32(0)
    out.buf.append(0)  # mesh_use_embedded_materials


# Written once, spliced into every marker: strings and counts are the same bytes at any
# 4-aligned offset.
_BEFORE_TEXT = _part(_before_text)
_AFTER_TEXT = _part(_after_text)


def _tail(out: CdrWriter, text: str) -> None:
    """What follows a marker's points: no colors, no texture, ``text``, no mesh."""
    out.splice(_BEFORE_TEXT)
    out.string(text)
    out.splice(_AFTER_TEXT)


_NO_TEXT = _part(partial(_tail, text=""))


class _Markers:
    """Appends Markers that share one header."""

    def __init__(self, header: tuple[int, int, str], count: int) -> None:
        sec, nanosec, frame_id = header
        self.out = CdrWriter()
        self.out.u32(count)
        self.head = CdrWriter()
        self.head.packed(_TIME, sec, nanosec)
        self.head.string(frame_id)
        # Per namespace, the header and namespace every marker in it starts with.
        self.starts: dict[str, CdrWriter] = {}

    def add(
        self,
        ns: str,
        kind: tuple[int, int, int],
        pose_scale: bytes,
        rgba: tuple[float, float, float, float],
        points: bytes = b"",
        text: str = "",
    ) -> None:
        out = self.out
        start = self.starts.get(ns)
        if start is None:
            start = self.starts[ns] = CdrWriter()
            start.splice(self.head)
            start.string(ns)
        out.splice(start)
        out.packed(_KIND, *kind)
        out.doubles(pose_scale)
        out.packed(_LOOK, *rgba, 0, 0, False)
        out.u32(len(points) // _POINT_BYTES)
        # A sequence of structs aligns at its first element: an empty one not at all.
        if points:
            out.doubles(points)
        if text:
            _tail(out, text)
        else:
            out.splice(_NO_TEXT)


def _encode(
    header: tuple[int, int, str], tracks: np.ndarray, predictions: np.ndarray, style: MarkerStyle
) -> CdrWriter:
    rows, bounds = path_bounds(predictions)
    markers = _Markers(header, 1 + 2 * len(tracks) + len(bounds))
    unturned = np.array([0.0, 0.0, 0.0, *_UNTURNED, 0.0, 0.0, 0.0], _F64)
    markers.add("", (0, ARROW, DELETEALL), unturned.tobytes(), (0.0, 0.0, 0.0, 0.0))
    n = len(tracks)
    x, y, z = (tracks[c].astype(_F64) for c in ("x", "y", "z"))
    height = tracks["height"].astype(_F64)
    # math, not NumPy: the reference's quaternion to the last bit.
    half_yaws = [yaw / 2.0 for yaw in tracks["yaw"].astype(_F64).tolist()]
    boxes = np.zeros((n, _POSE_SCALE), _F64)
    boxes[:, 0], boxes[:, 1], boxes[:, 2] = x, y, z
    boxes[:, 5] = [math.sin(h) for h in half_yaws]
    boxes[:, 6] = [math.cos(h) for h in half_yaws]
    boxes[:, 7] = tracks["length"]
    boxes[:, 8] = tracks["width"]
    boxes[:, 9] = height
    texts = np.zeros((n, _POSE_SCALE), _F64)
    texts[:, 0], texts[:, 1] = x, y
    texts[:, 2] = z + height / 2.0 + style.text_size_m
    texts[:, 6] = 1.0
    texts[:, 9] = style.text_size_m
    text_rgba = (*TEXT_RGB, 1.0)
    for i, (track_id, label) in enumerate(
        zip(tracks["id"].tolist(), tracks["label"].tolist(), strict=True)
    ):
        rgb = LABEL_RGB.get(label, LABEL_RGB[LABEL_UNKNOWN])
        markers.add(
            MARKER_NS_BOXES,
            (track_id, CUBE, ADD),
            boxes[i].tobytes(),
            (*rgb, style.box_alpha),
        )
        markers.add(
            MARKER_NS_IDS,
            (track_id, TEXT_VIEW_FACING, ADD),
            texts[i].tobytes(),
            text_rgba,
            text=str(track_id),
        )
    if bounds:
        points = np.zeros((len(rows), 3), _F64)
        points[:, 0], points[:, 1] = rows["x"], rows["y"]
        line = unturned.copy()
        line[7] = style.path_width_m
        line_bytes = line.tobytes()
        probs = rows["prob"].tolist()
        path_rgb = LABEL_RGB[LABEL_UNKNOWN]
        for path_index, (lo, hi) in enumerate(bounds):
            markers.add(
                MARKER_NS_PATHS,
                (path_index, LINE_STRIP, ADD),
                line_bytes,
                (*path_rgb, probs[lo]),
                points[lo:hi].tobytes(),
            )
    return markers.out
