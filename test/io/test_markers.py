"""The marker writer's layout check and its paths' order, without ROS."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.errors import MessageError
from dynshape_perception.io.cdr import ENCAPSULATION, first_element_header
from dynshape_perception.io.markers import (
    MARKER_LAYOUT,
    MarkerStyle,
    encode_markers,
    layout_matches,
    path_bounds,
)
from dynshape_perception.perception.records import PREDICTION_DTYPE, TRACK_DTYPE

MARKER = "visualization_msgs/msg/Marker"
# Humble's Marker: no texture_resource, texture, uv_coordinates nor mesh_file.
HUMBLE_MARKER = (
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
    ("text", "string"),
    ("mesh_resource", "string"),
    ("mesh_use_embedded_materials", "boolean"),
)


def test_only_the_layout_written_matches() -> None:
    assert layout_matches(lambda t: dict(MARKER_LAYOUT[t]))
    humble = {**MARKER_LAYOUT, MARKER: HUMBLE_MARKER}
    assert not layout_matches(lambda t: dict(humble[t]))
    reordered = {**MARKER_LAYOUT, MARKER: MARKER_LAYOUT[MARKER][::-1]}
    assert not layout_matches(lambda t: dict(reordered[t]))


def test_paths_are_grouped_by_id_then_mode_in_step_order() -> None:
    keys = [(9, 1), (4, 2), (9, 0), (4, 0)]
    table = np.zeros(3 * len(keys), PREDICTION_DTYPE)
    table["id"] = np.repeat([a for a, _ in keys], 3)
    table["k"] = np.repeat([k for _, k in keys], 3)
    table["step"] = np.tile([2, 0, 1], len(keys))
    rows, bounds = path_bounds(table[np.random.default_rng(1).permutation(len(table))])
    assert bounds == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert [(int(rows["id"][lo]), int(rows["k"][lo])) for lo, _ in bounds] == sorted(keys)
    assert rows["step"].tolist() == [0, 1, 2] * len(keys)
    assert path_bounds(table[:0])[1] == []


def test_the_message_starts_with_its_marker_count() -> None:
    tracks = np.zeros(3, TRACK_DTYPE)
    tracks["id"] = [1, 2, 3]
    table = np.zeros(4, PREDICTION_DTYPE)
    table["k"] = [0, 0, 1, 1]
    style = MarkerStyle(box_alpha=0.5, text_size_m=1.0, path_width_m=0.1)
    data = encode_markers((7, 8, "odom"), tracks, table, style)
    assert data[:4] == ENCAPSULATION
    # A DELETEALL, a box and a text per track, a path per (id, k).
    assert int.from_bytes(data[4:8], "little") == 1 + 2 * 3 + 2
    assert data[8:16] == (7).to_bytes(4, "little") + (8).to_bytes(4, "little")


def test_the_first_markers_header_is_read_from_the_bytes() -> None:
    style = MarkerStyle(box_alpha=0.5, text_size_m=1.0, path_width_m=0.1)
    tracks = np.zeros(2, TRACK_DTYPE)
    tracks["id"] = [3, 8]
    data = encode_markers((7, 250, "odom_frame"), tracks, np.zeros(0, PREDICTION_DTYPE), style)
    assert first_element_header(data) == (7, 250, "odom_frame")
    empty = ENCAPSULATION + (0).to_bytes(4, "little")
    assert first_element_header(empty) is None
    with pytest.raises(MessageError, match="ends at"):
        first_element_header(data[:10])
