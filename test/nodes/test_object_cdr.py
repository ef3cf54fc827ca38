"""The CDR writer of the object messages against rclpy's serializer of the same message."""

from __future__ import annotations

import struct
import uuid
from dataclasses import replace

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message

from dynshape_perception.errors import MessageError
from dynshape_perception.io import msgtypes
from dynshape_perception.io.cdr import ObjectArrays, encode, padding_mask
from dynshape_perception.io.objects import (
    DETECTED_OBJECTS,
    OBJECT_TYPES,
    PREDICTED_OBJECTS,
    TRACKED_OBJECTS,
    TrackStates,
    detected_arrays,
    predicted_arrays,
    tracked_arrays,
)
from dynshape_perception.nodes.messages import message_class, ros_message
from dynshape_perception.perception.objects import ObjectParams, TrackUuids
from dynshape_perception.perception.prediction.paths import PredictedPaths
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_POLE,
    OBSTACLE_DTYPE,
    TRACK_DTYPE,
)
from dynshape_perception.testing.object_messages import reference_message

pytestmark = pytest.mark.ros

STAMP_NS = 1_700_000_000_987_654_321
K, H = 6, 12


def _arrays(n: int, predicted: int, frame_id: str, seed: int) -> dict[str, ObjectArrays]:
    """Each type's numbers for ``n`` random objects, ``predicted`` of them with paths."""
    rng = np.random.default_rng(seed)
    tracks = np.zeros(n, TRACK_DTYPE)
    tracks["id"] = rng.permutation(np.arange(n) + 5) if n else []
    for name in ("x", "y", "z", "yaw", "vx", "vy"):
        tracks[name] = rng.normal(scale=10.0, size=n)
    for name in ("length", "width", "height"):
        tracks[name] = rng.uniform(0.2, 5.0, size=n)
    tracks["label"] = rng.choice([LABEL_CAR, LABEL_POLE], size=n)
    states = TrackStates(
        tracks,
        TrackUuids(uuid.UUID(int=seed)).of(tracks["id"]),
        rng.uniform(size=n).astype(np.float32),
        rng.integers(0, 4, size=n),
    )
    ids = tracks["id"][rng.permutation(n)[:predicted]].astype(np.uint32)
    paths = PredictedPaths(
        ids,
        rng.normal(scale=20.0, size=(predicted, K, H, 2)).astype(np.float32),
        rng.dirichlet(np.ones(K), size=predicted).astype(np.float32),
        0.1,
    )
    obstacles = np.zeros(n, OBSTACLE_DTYPE)
    for name in ("x", "y", "z", "yaw", "length", "width", "height", "score", "label"):
        obstacles[name] = tracks[name] if name != "score" else rng.uniform(-0.5, 1.5, size=n)
    params = ObjectParams()
    return {
        DETECTED_OBJECTS: detected_arrays(STAMP_NS, frame_id, obstacles),
        TRACKED_OBJECTS: tracked_arrays(STAMP_NS, frame_id, states, params),
        PREDICTED_OBJECTS: predicted_arrays(STAMP_NS, frame_id, states, paths, params),
    }


CASES = {
    "no objects": (0, 0, "map"),
    "no frame id": (1, 0, ""),
    "objects without paths": (4, 0, "odom"),
    "one of three predicted": (3, 1, "abc"),
    "odd counts": (7, 5, "odom_1"),
    "many agents": (64, 64, "map"),
    "a long frame id": (9, 4, "vehicle/" + "lidar_top_" * 30),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("msgtype", OBJECT_TYPES)
def test_the_bytes_are_rclpys_for_the_same_message(case: str, msgtype: str) -> None:
    n, predicted, frame_id = CASES[case]
    arrays = _arrays(n, predicted, frame_id, seed=len(case))[msgtype]
    reference = reference_message(ros_message, msgtype, arrays)
    want = np.frombuffer(bytes(serialize_message(reference)), np.uint8)
    data = encode(msgtype, arrays)
    got = np.frombuffer(data, np.uint8)
    assert got.shape == want.shape
    # Fast CDR leaves alignment padding unset: every other byte must match.
    pad = padding_mask(msgtype, arrays)
    assert pad.shape == got.shape and not got[pad].any()
    mismatched = np.flatnonzero((got != want) & ~pad)
    assert mismatched.size == 0, f"bytes differ from offset {mismatched[:1]}"
    assert deserialize_message(data, message_class(msgtype)) == reference


def test_paths_and_their_poses_come_back() -> None:
    arrays = _arrays(5, 3, "map", seed=3)[PREDICTED_OBJECTS]
    msg = deserialize_message(encode(PREDICTED_OBJECTS, arrays), message_class(PREDICTED_OBJECTS))
    with_paths = [i for i, o in enumerate(msg.objects) if o.kinematics.predicted_paths]
    assert with_paths == sorted(arrays.path_rows.tolist())
    p = int(np.flatnonzero(arrays.path_rows == with_paths[0])[0])
    path = msg.objects[with_paths[0]].kinematics.predicted_paths[2]
    assert len(path.path) == H and path.time_step.nanosec == 100_000_000
    q = path.path[4]
    assert [q.position.x, q.position.y, q.orientation.z, q.orientation.w] == (
        arrays.path_poses[p, 2, 4, [0, 1, 5, 6]].tolist()
    )


def test_arrays_that_disagree_are_a_message_error() -> None:
    arrays = _arrays(3, 2, "map", seed=1)[TRACKED_OBJECTS]
    with pytest.raises(MessageError, match="poses"):
        encode(TRACKED_OBJECTS, replace(arrays, poses=arrays.poses[:2]))
    with pytest.raises(MessageError, match="no CDR writer"):
        encode("geometry_msgs/msg/Pose", arrays)


# -- the writer before it laid out whole groups of objects at once, frozen as an oracle --------
class _OldWriter:
    def __init__(self) -> None:
        self.buf = bytearray(b"\x00\x01\x00\x00")
        self.pads: list[tuple[int, int]] = []

    def align(self, n: int) -> None:
        pad = -(len(self.buf) - 4) % n
        if pad:
            self.pads.append((len(self.buf), pad))
            self.buf += bytes(pad)

    def packed(self, fmt: str, *values: float | int) -> None:
        self.align(4)
        self.buf += struct.pack(fmt, *values)

    def one_class(self, label: int) -> None:
        self.align(4)
        self.pads.append((len(self.buf) + 5, 3))
        self.buf += struct.pack("<IB3xf", 1, label, 1.0)

    def doubles(self, values: bytes) -> None:
        self.align(8)
        self.buf += values

    def shape(self, dimensions: bytes) -> None:
        self.buf.append(0)
        self.packed("<I", 0)
        self.doubles(dimensions)

    def mask(self) -> np.ndarray:
        mask = np.zeros(len(self.buf), bool)
        for start, n in self.pads:
            mask[start : start + n] = True
        return mask


def _old_encode(msgtype: str, a: ObjectArrays) -> tuple[bytes, np.ndarray]:
    out = _OldWriter()
    sec, nanosec, frame_id = a.header
    raw = frame_id.encode()
    out.packed("<iI", sec, nanosec)
    out.packed("<I", len(raw) + 1)
    out.buf += raw + b"\x00"
    out.packed("<I", a.size)

    def f64(*blocks: np.ndarray) -> list[bytes]:
        joined = np.ascontiguousarray(np.concatenate(blocks, axis=1), dtype="<f8")
        return [row.tobytes() for row in joined]

    dims = f64(a.dimensions)
    paths = {int(r): p for p, r in enumerate(a.path_rows.tolist())}
    if msgtype == DETECTED_OBJECTS:
        poses, twists = f64(a.poses, a.pose_covariances), f64(a.twists, a.twist_covariances)
    else:
        kinematics = f64(
            a.poses, a.pose_covariances, a.twists, a.twist_covariances, np.zeros((a.size, 42))
        )
    for i in range(a.size):
        if msgtype != DETECTED_OBJECTS:
            out.buf += np.asarray(a.uuids[i], np.uint8).tobytes()
        out.packed("<f", float(np.float32(a.existence[i])))
        out.one_class(int(np.uint8(a.labels[i])))
        if msgtype == DETECTED_OBJECTS:
            out.doubles(poses[i])
            out.buf += bytes((0, 1))
            out.doubles(twists[i])
            out.buf += bytes((0, 0))
        else:
            out.doubles(kinematics[i])
        if msgtype == TRACKED_OBJECTS:
            out.buf += bytes((1, int(a.stationary[i])))
        elif msgtype == PREDICTED_OBJECTS:
            p = paths.get(i)
            k = a.path_poses.shape[1] if p is not None else 0
            out.packed("<I", k)
            for path in range(k):
                out.packed("<I", a.path_poses.shape[2])
                out.doubles(np.ascontiguousarray(a.path_poses[p, path], "<f8").tobytes())
                out.packed("<iI", *a.time_step)
                out.packed("<f", float(np.float32(a.path_confidences[p, path])))
        out.shape(dims[i])
    return bytes(out.buf), out.mask()


def _random_arrays(seed: int) -> ObjectArrays:
    """Up to 70 objects, a random subset with paths (rows in random order), a frame id of
    random length (the objects start on or 4 past an 8-byte boundary), random K and H."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 71))
    k, h = int(rng.choice([0, 1, 2, 6])), int(rng.choice([0, 1, 7, 12]))
    rows = rng.permutation(n)[: int(rng.integers(0, n + 1))]
    frame_id = "".join(rng.choice(list("abc/_9"), size=int(rng.integers(0, 13))).tolist())
    return ObjectArrays(
        header=(int(rng.integers(-(2**31), 2**31)), int(rng.integers(0, 10**9)), frame_id),
        existence=rng.uniform(size=n),
        labels=rng.integers(0, 8, size=n),
        poses=rng.normal(scale=50.0, size=(n, 7)),
        pose_covariances=rng.normal(size=(n, 36)),
        twists=rng.normal(size=(n, 6)),
        twist_covariances=rng.normal(size=(n, 36)),
        dimensions=rng.uniform(0.1, 9.0, size=(n, 3)),
        uuids=rng.integers(0, 256, size=(n, 16), dtype=np.uint8),
        stationary=rng.uniform(size=n) < 0.5,
        path_rows=rows.astype(np.intp),
        path_poses=rng.normal(scale=30.0, size=(rows.size, k, h, 7)),
        path_confidences=rng.uniform(size=(rows.size, k)).astype(np.float32),
        time_step=(int(rng.integers(0, 3)), int(rng.integers(0, 10**9))),
    )


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("msgtype", OBJECT_TYPES)
def test_random_messages_are_rclpys_and_the_frozen_writers_bytes(seed: int, msgtype: str) -> None:
    arrays = _random_arrays(seed)
    data, pad = encode(msgtype, arrays), padding_mask(msgtype, arrays)
    old, old_pad = _old_encode(msgtype, arrays)
    assert data == old
    assert np.array_equal(pad, old_pad)
    reference = reference_message(ros_message, msgtype, arrays)
    want = np.frombuffer(bytes(serialize_message(reference)), np.uint8)
    got = np.frombuffer(data, np.uint8)
    assert got.shape == want.shape and not got[pad].any()
    mismatched = np.flatnonzero((got != want) & ~pad)
    assert mismatched.size == 0, f"bytes differ from offset {mismatched[:1]}"
    # rosbags writes its padding as zeros: there the bytes are the same to the last one.
    rosbags = reference_message(msgtypes.message, msgtype, arrays)
    assert bytes(msgtypes.typestore().serialize_cdr(rosbags, msgtype)) == data


def test_the_random_cases_shift_the_objects_and_mix_objects_with_and_without_paths() -> None:
    """The cases above cover what the layout depends on."""
    cases = [_random_arrays(seed) for seed in range(12)]
    # The stamp, the frame id's length, its bytes and NUL, 4-aligned, then the object count.
    starts = {((12 + len(a.header[2]) + 1 + 3) // 4 * 4 + 4) % 8 for a in cases if a.size}
    assert starts == {0, 4}
    mixed = [a for a in cases if 0 < a.path_rows.size < a.size and a.path_poses.shape[1]]
    assert mixed and any((np.diff(a.path_rows) < 0).any() for a in mixed)
    assert {a.path_poses.shape[1] for a in cases} >= {0, 6} and max(a.size for a in cases) > 40


@pytest.mark.parametrize(
    ("n", "rows"), [(3, [0, 0]), (3, [3]), (3, [-1]), (3, [2, 0, 2]), (0, [0])]
)
def test_path_rows_out_of_range_or_repeated_are_a_message_error(n: int, rows: list[int]) -> None:
    arrays = _random_arrays(0)
    arrays = replace(
        arrays,
        existence=arrays.existence[:n],
        labels=arrays.labels[:n],
        poses=arrays.poses[:n],
        pose_covariances=arrays.pose_covariances[:n],
        twists=arrays.twists[:n],
        twist_covariances=arrays.twist_covariances[:n],
        dimensions=arrays.dimensions[:n],
        uuids=arrays.uuids[:n],
        stationary=arrays.stationary[:n],
        path_rows=np.asarray(rows, np.intp),
        path_poses=np.zeros((len(rows), 2, 3, 7)),
        path_confidences=np.zeros((len(rows), 2), np.float32),
    )
    with pytest.raises(MessageError, match="path rows"):
        encode(PREDICTED_OBJECTS, arrays)


@pytest.mark.parametrize("msgtype", [DETECTED_OBJECTS, TRACKED_OBJECTS])
@pytest.mark.parametrize("n", [0, 2])
def test_detected_and_tracked_objects_leave_paths_out(msgtype: str, n: int) -> None:
    """Paths in the arrays change nothing there, with objects or none (a frame id that
    leaves them 4 past an 8-byte boundary)."""
    arrays = _arrays(n, 0, "ab", seed=5)[msgtype]
    with_paths = replace(
        arrays,
        path_rows=np.array([0]),
        path_poses=np.ones((1, 2, 3, 7)),
        path_confidences=np.ones((1, 2), np.float32),
    )
    assert encode(msgtype, with_paths) == encode(msgtype, arrays) == _old_encode(msgtype, arrays)[0]
    assert np.array_equal(padding_mask(msgtype, with_paths), padding_mask(msgtype, arrays))
