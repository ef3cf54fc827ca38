"""The CDR writer of the object messages against rclpy's serializer of the same message."""

from __future__ import annotations

import uuid
from dataclasses import replace

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message

from dynshape_perception.errors import MessageError
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
from dynshape_perception.io.tables import LABEL_CAR, LABEL_POLE, OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.nodes.messages import message_class, ros_message
from dynshape_perception.perception.objects import ObjectParams, TrackUuids
from dynshape_perception.perception.prediction import PredictedPaths
from dynshape_perception.testing.object_messages import reference_message

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
