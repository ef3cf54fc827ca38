"""The object CDR reader's fast path against its generic one: the same arrays bit for bit, or
the same error."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pytest
from rclpy.serialization import serialize_message

from dynshape_perception.errors import MessageError
from dynshape_perception.io.cdr import (
    _I32U32,
    _MIN_OBJECT_BYTES,
    Decoded,
    ObjectArrays,
    _Reader,
    decode,
    encode,
)
from dynshape_perception.io.cdr_fast import MAX_SEQUENCE, read_objects
from dynshape_perception.io.classes import label_of_classification
from dynshape_perception.io.objects import (
    DETECTED_OBJECTS,
    OBJECT_TYPES,
    PREDICTED_OBJECTS,
    TRACKED_OBJECTS,
    _box_rows,
    _yaw,
    _yaws,
)
from dynshape_perception.nodes.messages import ros_message
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.testing.object_messages import reference_message

pytestmark = pytest.mark.ros

# A signalling NaN: read through Python floats it comes back quiet.
SIGNALLING_NAN = 0x7FA00001
FAST_TYPES = (DETECTED_OBJECTS, TRACKED_OBJECTS)


def _arrays(n: int, seed: int, frame_id: str = "map", paths: int = 0) -> ObjectArrays:
    """``n`` random objects, quaternions of any length, ``paths`` of them with 2 paths of 3
    poses."""
    rng = np.random.default_rng(seed)
    existence = rng.uniform(size=n).astype(np.float32)
    if n:
        existence.view(np.uint32)[0] = SIGNALLING_NAN
    poses = rng.normal(scale=10.0, size=(n, 7))
    poses[:, 3:] *= rng.uniform(0.01, 100.0, size=(n, 1))
    twists = rng.normal(size=(n, 6))
    return ObjectArrays(
        header=(int(rng.integers(0, 2**31)), int(rng.integers(0, 10**9)), frame_id),
        existence=existence,
        labels=rng.integers(0, 256, n).astype(np.uint8),
        poses=poses,
        pose_covariances=rng.normal(size=(n, 36)),
        twists=twists,
        twist_covariances=rng.normal(size=(n, 36)),
        dimensions=rng.uniform(0.1, 9.0, size=(n, 3)),
        uuids=rng.integers(0, 256, size=(n, 16)).astype(np.uint8),
        stationary=rng.integers(0, 2, n).astype(bool),
        path_rows=np.sort(rng.permutation(n)[:paths]),
        path_poses=rng.normal(size=(paths, 2, 3, 7)),
        path_confidences=rng.uniform(size=(paths, 2)).astype(np.float32),
        time_step=(0, 100_000_000),
    )


def _outcome(msgtype: str, data: bytes, fast: bool) -> Decoded | str:
    try:
        return decode(msgtype, data, fast=fast)
    except MessageError as err:
        return f"{type(err).__name__}: {err}"


def _assert_alike(msgtype: str, data: bytes) -> Decoded | str:
    """The fast and the generic reader's outcome, asserted to be the same."""
    got, want = _outcome(msgtype, data, True), _outcome(msgtype, data, False)
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return got
    for f in fields(ObjectArrays):
        a, b = getattr(got.arrays, f.name), getattr(want.arrays, f.name)
        if isinstance(b, np.ndarray):
            assert (a.dtype, a.shape, a.strides) == (b.dtype, b.shape, b.strides), f.name
            assert a.flags.writeable == b.flags.writeable, f.name
            assert a.tobytes() == b.tobytes(), f.name
        else:
            assert a == b, f.name
    assert len(got.paths) == len(want.paths)
    for mine, theirs in zip(got.paths, want.paths, strict=True):
        assert [(p.poses.tobytes(), p.time_step_s, p.confidence) for p in mine] == [
            (p.poses.tobytes(), p.time_step_s, p.confidence) for p in theirs
        ]
    return got


def _fast_reads(msgtype: str, data: bytes) -> bool:
    """Whether the fast path reads the objects of ``data`` (rather than refusing them)."""
    r = _Reader(data)
    r.unpack(_I32U32)
    r.string()
    n = r.count(_MIN_OBJECT_BYTES)
    return read_objects(msgtype == TRACKED_OBJECTS, r.data, r.pos, n) is not None


@pytest.mark.parametrize("frame_id", ["", "map", "base_link"])
@pytest.mark.parametrize("n", [0, 1, 2, 40])
@pytest.mark.parametrize("msgtype", OBJECT_TYPES)
def test_encoded_messages_read_alike(msgtype: str, n: int, frame_id: str) -> None:
    data = encode(msgtype, _arrays(n, n + len(frame_id), frame_id, paths=n // 2))
    got = _assert_alike(msgtype, data)
    assert isinstance(got, Decoded) and got.arrays.size == n
    # Predicted objects (paths of any length per object) always take the generic reader.
    assert _fast_reads(msgtype, data) == (msgtype in FAST_TYPES and n > 0)


def _with_sequences(msg: Any, classes: list[int], points: list[int], seed: int) -> Any:
    """``msg`` with object i given ``classes[i]`` classifications (ties, NaN and -inf among
    the probabilities) and ``points[i]`` footprint points."""
    rng = np.random.default_rng(seed)
    apm, gm = "autoware_perception_msgs/msg/", "geometry_msgs/msg/"
    odd = [math.nan, -math.inf, 0.5, 0.5, 0.25]
    for i, obj in enumerate(msg.objects):
        obj.classification = [
            ros_message(
                apm + "ObjectClassification",
                label=int(rng.integers(0, 256)),
                probability=odd[(i + c) % len(odd)] if (i + c) % 3 else float(rng.uniform()),
            )
            for c in range(classes[i])
        ]
        obj.shape.footprint.points = [
            ros_message(gm + "Point32", x=float(p), y=-float(p), z=0.5) for p in range(points[i])
        ]
    return msg


@pytest.mark.parametrize(("classes", "points"), [(0, 0), (1, 2), (3, 0), (5, 4)])
@pytest.mark.parametrize("msgtype", FAST_TYPES)
def test_rclpys_bytes_with_any_sequence_lengths_read_alike(
    msgtype: str, classes: int, points: int
) -> None:
    n = 7
    msg = reference_message(ros_message, msgtype, _arrays(n, classes, "odom"))
    data = bytes(serialize_message(_with_sequences(msg, [classes] * n, [points] * n, points)))
    assert _fast_reads(msgtype, data)
    _assert_alike(msgtype, data)


@pytest.mark.parametrize(
    ("classes", "points"),
    [
        ([1, 1, 2, 1], [0, 0, 0, 0]),
        ([1, 1, 1, 1], [0, 0, 0, 1]),
        ([0, 1, 1, 1], [0, 0, 0, 0]),
        ([MAX_SEQUENCE + 1] * 4, [0] * 4),
    ],
)
@pytest.mark.parametrize("msgtype", FAST_TYPES)
def test_objects_laid_out_unlike_take_the_generic_reader(
    msgtype: str, classes: list[int], points: list[int]
) -> None:
    msg = reference_message(ros_message, msgtype, _arrays(4, 3, "map"))
    data = bytes(serialize_message(_with_sequences(msg, classes, points, 1)))
    assert not _fast_reads(msgtype, data)
    got = _assert_alike(msgtype, data)
    assert isinstance(got, Decoded) and got.arrays.size == 4


@pytest.mark.parametrize("frame_id", ["map", "odom"])
@pytest.mark.parametrize("msgtype", FAST_TYPES)
def test_every_truncation_and_corruption_fails_alike(msgtype: str, frame_id: str) -> None:
    data = encode(msgtype, _arrays(2, 5, frame_id))
    failed = 0
    for end in range(len(data)):
        failed += isinstance(_assert_alike(msgtype, data[:end]), str)
    assert failed == len(data)
    # Trailing bytes are left unread; a big-endian encapsulation is refused.
    assert isinstance(_assert_alike(msgtype, data + bytes(9)), Decoded)
    assert "little-endian" in str(_assert_alike(msgtype, b"\x00\x00" + data[2:]))
    # A count past the end of the data, in each place a count stands.
    r = _Reader(data)
    r.unpack(_I32U32)
    r.string()
    for at in range(r.pos - 4, len(data) - 3, 4):
        hostile = bytearray(data)
        hostile[at : at + 4] = b"\xff\xff\xff\x7f"
        _assert_alike(msgtype, bytes(hostile))


def test_yaws_are_the_per_object_yaws_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    scales = 10.0 ** rng.uniform(-5.5, 150.0, size=(4000, 1))
    q = rng.normal(size=(4000, 4)) * scales
    q[::7, :2] = 0.0
    q[::11, 3] = -q[::11, 3]
    got = np.array(_yaws(q))
    want = np.array([_yaw(*v) for v in q.tolist()])
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "bad", [[0.0, 0.0, 0.0, 0.0], [math.nan, 0.0, 0.0, 1.0], [1e300, 1e300, 0.0, 0.0]]
)
def test_a_degenerate_quaternion_is_the_per_object_error(bad: list[float]) -> None:
    q = np.array([[0.0, 0.0, 0.6, 0.8], bad, [0.0, 0.0, 0.0, 0.0]])
    with pytest.raises(MessageError) as want:
        _yaw(*bad)
    with pytest.raises(MessageError) as got:
        _yaws(q)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("dtype", [OBSTACLE_DTYPE, TRACK_DTYPE])
def test_box_rows_are_the_per_object_ones(dtype: np.dtype) -> None:
    every_label = replace(_arrays(300, 11), labels=(np.arange(300) % 256).astype(np.uint8))
    arrays = decode(TRACKED_OBJECTS, encode(TRACKED_OBJECTS, every_label)).arrays
    rows = _box_rows(arrays, dtype)
    want = np.zeros(arrays.size, dtype)
    want["yaw"] = [_yaw(*q) for q in arrays.poses[:, 3:7].tolist()]
    want["label"] = [label_of_classification(c) for c in arrays.labels.tolist()]
    assert rows["yaw"].tobytes() == want["yaw"].tobytes()
    assert rows["label"].tobytes() == want["label"].tobytes()
    assert sorted(set(arrays.labels.tolist())) == list(range(256))


def test_predicted_objects_keep_the_generic_reader() -> None:
    data = encode(PREDICTED_OBJECTS, _arrays(5, 2, paths=3))
    got = _assert_alike(PREDICTED_OBJECTS, data)
    assert isinstance(got, Decoded) and sum(len(p) for p in got.paths) == 6
