"""The CDR writer of the markers against the MarkerArray objects and rclpy's serializer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from visualization_msgs.msg import Marker, MarkerArray

from dynshape_perception.io.markers import (
    MARKER_LAYOUT,
    MARKER_NS_PATHS,
    MarkerStyle,
    encode_markers,
    markers_padding_mask,
)
from dynshape_perception.nodes import messages
from dynshape_perception.nodes.messages import (
    header,
    marker_array,
    marker_bytes,
    message_class,
    time_msg,
)
from dynshape_perception.perception.prediction.paths import prediction_table
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    TRACK_DTYPE,
)

pytestmark = pytest.mark.ros

STYLE = MarkerStyle(box_alpha=0.35, text_size_m=0.8, path_width_m=0.15)
STAMP_NS = 1_700_000_000_987_654_321
# An id not among LABEL_RGB's: drawn in the unknown label's colour.
ODD_LABEL = 11


def _inputs(n: int, agents: int, k_n: int, h_n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random tracks and a shuffled prediction table of ``agents`` of them (or, past
    ``n``, of ids without a track), ``k_n`` modes of ``h_n`` steps each."""
    rng = np.random.default_rng(seed)
    tracks = np.zeros(n, TRACK_DTYPE)
    # Ids of one to six digits: the texts' lengths move the next markers' alignment.
    tracks["id"] = rng.permutation(10 ** rng.integers(0, 6, size=n) + np.arange(n))
    for name in ("x", "y", "z", "yaw"):
        tracks[name] = rng.normal(scale=20.0, size=n)
    for name in ("length", "width", "height"):
        tracks[name] = rng.uniform(0.2, 5.0, size=n)
    tracks["label"] = rng.choice([0, LABEL_CAR, LABEL_PEDESTRIAN, LABEL_POLE, ODD_LABEL], size=n)
    ids = np.r_[tracks["id"], 1_000_000 + np.arange(max(agents - n, 0))][:agents]
    traj = rng.normal(scale=30.0, size=(agents, k_n, h_n, 2)).astype(np.float32)
    probs = rng.dirichlet(np.ones(k_n), size=agents).astype(np.float32)
    table = prediction_table(ids.astype(np.uint32), traj, probs)
    return tracks, table[rng.permutation(len(table))]


CASES = {
    "no tracks": (0, 0, 3, 12, "map"),
    "no frame id": (2, 0, 3, 12, ""),
    "tracks without predictions": (5, 0, 3, 12, "odom"),
    "paths of no steps": (4, 4, 3, 0, "odom"),
    "paths of one step": (3, 2, 3, 1, "odom_1"),
    "one mode": (6, 6, 1, 12, "map"),
    "several modes": (40, 40, 3, 12, "odom"),
    "some agents predicted": (7, 3, 6, 12, "abc"),
    "predictions without tracks": (0, 3, 2, 5, "odom"),
    "a long frame id": (9, 4, 3, 7, "vehicle/" + "lidar_top_" * 30),
}


def _case(case: str) -> tuple[np.ndarray, np.ndarray, Any]:
    n, agents, k_n, h_n, frame_id = CASES[case]
    tracks, table = _inputs(n, agents, k_n, h_n, seed=len(case))
    return tracks, table, header(time_msg(STAMP_NS), frame_id)


def _differences(got: Any, want: Any, where: str) -> list[str]:
    """Where the message ``got`` differs from ``want``, field by field; float32 fields
    compared with ``want`` rounded as the wire rounds it."""
    if not hasattr(want, "get_fields_and_field_types"):
        return [] if got == want else [f"{where}: {got!r} != {want!r}"]
    out = []
    for name, kind in want.get_fields_and_field_types().items():
        a, b = getattr(got, name), getattr(want, name)
        if kind.startswith("sequence<") and "/" in kind:
            if len(a) != len(b):
                out.append(f"{where}.{name}: {len(a)} items, not {len(b)}")
                continue
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                out += _differences(x, y, f"{where}.{name}[{i}]")
        elif kind == "float":
            if a != float(np.float32(b)):
                out.append(f"{where}.{name}: {a!r} != float32 {b!r}")
        elif "/" in kind:
            out += _differences(a, b, f"{where}.{name}")
        elif list(a) != list(b) if kind.startswith("sequence<") else a != b:
            out.append(f"{where}.{name}: {a!r} != {b!r}")
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_bytes_read_back_as_the_marker_array(case: str) -> None:
    tracks, table, head = _case(case)
    want = marker_array(tracks, table, head, STYLE)
    got = deserialize_message(marker_bytes(tracks, table, head, STYLE), MarkerArray)
    assert len(got.markers) == 1 + 2 * len(tracks) + len(set(table[["id", "k"]].tolist()))
    assert _differences(got, want, "markers") == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_bytes_are_rclpys_for_the_same_message(case: str) -> None:
    tracks, table, head = _case(case)
    want = np.frombuffer(
        bytes(serialize_message(marker_array(tracks, table, head, STYLE))), np.uint8
    )
    stamp = (head.stamp.sec, head.stamp.nanosec, head.frame_id)
    got = np.frombuffer(encode_markers(stamp, tracks, table, STYLE), np.uint8)
    assert got.shape == want.shape
    # Fast CDR leaves alignment padding unset: every other byte must match.
    pad = markers_padding_mask(stamp, tracks, table, STYLE)
    assert pad.shape == got.shape and not got[pad].any()
    mismatched = np.flatnonzero((got != want) & ~pad)
    assert mismatched.size == 0, f"bytes differ from offset {mismatched[:1]}"


def test_paths_in_id_then_mode_order_with_their_probability_as_alpha() -> None:
    ids, k_n, h_n = np.array([9, 4], np.uint32), 3, 5
    agent, mode, step = np.meshgrid(ids, np.arange(k_n), np.arange(h_n), indexing="ij")
    traj = np.stack([100.0 * agent + 10.0 * mode + step, -1.0 * step], axis=-1)
    probs = np.array([[0.5, 0.3, 0.2], [0.7, 0.2, 0.1]], np.float32)
    table = prediction_table(ids, traj.astype(np.float32), probs)
    table = table[np.random.default_rng(0).permutation(len(table))]
    data = marker_bytes(np.zeros(0, TRACK_DTYPE), table, header(time_msg(5), "odom"), STYLE)
    paths = [m for m in deserialize_message(data, MarkerArray).markers if m.ns == MARKER_NS_PATHS]
    assert [m.id for m in paths] == list(range(6))
    for m, (a, k) in zip(paths, [(4, 0), (4, 1), (4, 2), (9, 0), (9, 1), (9, 2)], strict=True):
        assert m.type == Marker.LINE_STRIP and m.scale.x == STYLE.path_width_m
        assert [(p.x, p.y, p.z) for p in m.points] == [
            (100.0 * a + 10.0 * k + s, -float(s), 0.0) for s in range(h_n)
        ]
        assert m.color.a == probs[int(np.flatnonzero(ids == a)[0]), k]


def test_the_installed_marker_is_the_layout_written() -> None:
    for msgtype, fields in MARKER_LAYOUT.items():
        assert tuple(message_class(msgtype).get_fields_and_field_types().items()) == fields
    assert messages.MARKERS_AS_CDR


def test_another_marker_layout_goes_through_rclpys_serializer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracks, table, head = _case("several modes")
    # Injected fault: a distro whose Marker is not the layout io.markers writes.
    monkeypatch.setattr(messages, "MARKERS_AS_CDR", False)
    got = deserialize_message(marker_bytes(tracks, table, head, STYLE), MarkerArray)
    assert _differences(got, marker_array(tracks, table, head, STYLE), "markers") == []
