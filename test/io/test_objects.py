"""Object messages from the tables as CDR bytes and back, read by rclpy and rosbags alike."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from rclpy.serialization import deserialize_message

from dynshape_perception.errors import MessageError
from dynshape_perception.io import msgtypes
from dynshape_perception.io.cdr import encode
from dynshape_perception.io.classes import (
    CAR,
    PEDESTRIAN,
    UNKNOWN,
    classification_of,
    label_of_class_id,
)
from dynshape_perception.io.objects import (
    DETECTED_OBJECTS,
    PREDICTED_OBJECTS,
    TRACKED_OBJECTS,
    TrackStates,
    detected_objects,
    obstacles_from_detected_objects,
    predicted_arrays,
    predicted_objects,
    predictions_from_predicted_objects,
    tracked_arrays,
    tracked_objects,
    tracks_from_tracked_objects,
)
from dynshape_perception.io.pointcloud2 import BAD_BOX_SIZE, CloudError
from dynshape_perception.nodes.messages import message_class
from dynshape_perception.perception.objects import ObjectParams, TrackUuids
from dynshape_perception.perception.prediction.paths import PredictedPaths
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    OBSTACLE_DTYPE,
    TRACK_DTYPE,
)
from dynshape_perception.testing.object_messages import reference_message

pytestmark = pytest.mark.ros

NS = 1_700_000_000_123_456_789
DECODERS: dict[str, Callable[[bytes, str], Any]] = {
    "rclpy": lambda data, msgtype: deserialize_message(data, message_class(msgtype)),
    "rosbags": lambda data, msgtype: msgtypes.typestore().deserialize_cdr(data, msgtype),
}


def _tracks() -> TrackStates:
    tracks = np.zeros(3, TRACK_DTYPE)
    tracks["id"] = [4, 9, 11]
    tracks["x"], tracks["y"], tracks["z"] = [10.0, -5.0, 3.0], [2.0, 1.0, -7.0], [0.8, 0.9, 1.0]
    tracks["length"], tracks["width"], tracks["height"] = [4.0, 0.6, 0.3], [1.8, 0.6, 0.3], 1.6
    tracks["yaw"] = [0.3, -1.2, 0.0]
    tracks["vx"], tracks["vy"] = [5.0, 0.0, 0.1], [1.0, -1.0, 0.0]
    tracks["label"] = [LABEL_CAR, LABEL_PEDESTRIAN, LABEL_POLE]
    tracks["score"] = 0.9
    uuids = TrackUuids(uuid.UUID(int=1)).of(tracks["id"])
    return TrackStates(tracks, uuids, np.array([0.5, 0.75, 0.9], np.float32), np.array([0, 2, 0]))


def _paths() -> PredictedPaths:
    rng = np.random.default_rng(0)
    probs = rng.uniform(size=(2, 6)).astype(np.float32)
    probs /= probs.sum(axis=1, keepdims=True)
    traj = rng.normal(size=(2, 6, 12, 2)).astype(np.float32)
    return PredictedPaths(np.array([9, 4], np.uint32), traj, probs, 0.4)


def _all() -> dict[str, bytes]:
    states, params = _tracks(), ObjectParams()
    obstacles = np.zeros(2, OBSTACLE_DTYPE)
    obstacles["x"], obstacles["length"], obstacles["width"], obstacles["height"] = 3.0, 4, 2, 1.5
    obstacles["label"], obstacles["score"] = [LABEL_CAR, LABEL_POLE], [0.6, 1.5]
    return {
        DETECTED_OBJECTS: detected_objects(NS, "base_link", obstacles),
        TRACKED_OBJECTS: tracked_objects(NS, "odom", states, params),
        PREDICTED_OBJECTS: predicted_objects(NS, "odom", states, _paths(), params),
    }


def test_rosbags_encodes_the_decoded_message_to_the_same_bytes() -> None:
    """The bytes, decoded by rosbags (from the installed .msg definitions) and encoded again,
    are the same bytes, padding (zeros in both) included."""
    store = msgtypes.typestore()
    for msgtype, data in _all().items():
        decoded = store.deserialize_cdr(data, msgtype)
        assert bytes(store.serialize_cdr(decoded, msgtype)) == data, msgtype


@pytest.mark.parametrize("decoder", sorted(DECODERS))
def test_messages_read_back_into_the_tables(decoder: str) -> None:
    msgs = {t: DECODERS[decoder](data, t) for t, data in _all().items()}
    detected = msgs[DETECTED_OBJECTS]
    assert detected.header.frame_id == "base_link" and detected.header.stamp.nanosec == 123456789
    obstacles = obstacles_from_detected_objects(detected)
    # A pole has no ObjectClassification label: it goes out as UNKNOWN; scores are clipped.
    assert obstacles["label"].tolist() == [LABEL_CAR, 0] and obstacles["score"][1] == 1.0
    assert [o.classification[0].label for o in detected.objects] == [1, 0]

    tracked = msgs[TRACKED_OBJECTS]
    states, back = _tracks(), tracks_from_tracked_objects(tracked)
    assert np.array_equal(back.uuids, states.uuids)
    for field in ("x", "y", "z", "length", "yaw", "vx", "vy"):
        np.testing.assert_allclose(back.tracks[field], states.tracks[field], atol=1e-6)
    assert back.tracks["label"].tolist() == [LABEL_CAR, LABEL_PEDESTRIAN, 0]
    pedestrian = tracked.objects[1]
    assert pedestrian.classification[0].label == PEDESTRIAN
    # Velocity in the object's frame: x along its heading.
    twist = pedestrian.kinematics.twist_with_covariance
    c, s = math.cos(-1.2), math.sin(-1.2)
    assert (twist.twist.linear.x, twist.twist.linear.y) == pytest.approx((-s, -c))
    # Two frames missed: the covariance is (1 + 2)^2 times a fresh track's.
    cov0 = tracked.objects[0].kinematics.pose_with_covariance.covariance
    cov1 = pedestrian.kinematics.pose_with_covariance.covariance
    assert cov1[0] == pytest.approx(9 * cov0[0]) and cov0[0] == pytest.approx(0.09)
    assert [o.kinematics.is_stationary for o in tracked.objects] == [False, False, True]
    assert tracked.objects[1].existence_probability == pytest.approx(0.75)

    predicted = predictions_from_predicted_objects(msgs[PREDICTED_OBJECTS])
    paths = _paths()
    assert [bytes(p.uuid) for p in predicted] == [bytes(u) for u in states.uuids]
    car, walker, pole = predicted
    assert pole.paths == [] and len(car.paths) == len(walker.paths) == 6
    assert car.confidences.sum() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(walker.confidences, paths.confidences[0], atol=1e-6)
    assert walker.time_steps_s == [0.4] * 6
    np.testing.assert_allclose(walker.paths[2][:, :2], paths.paths[0, 2], atol=1e-6)
    assert walker.paths[2][:, 2] == pytest.approx(0.9), "the path at the object's height"


def test_degenerate_orientation_is_a_message_error() -> None:
    msg = DECODERS["rosbags"](_all()[DETECTED_OBJECTS], DETECTED_OBJECTS)
    q = msg.objects[0].kinematics.pose_with_covariance.pose.orientation
    q.x = q.y = q.z = q.w = 0.0
    with pytest.raises(MessageError, match="no rotation"):
        obstacles_from_detected_objects(msg)


def test_bad_uuid_and_size_are_message_errors() -> None:
    msg = DECODERS["rosbags"](_all()[TRACKED_OBJECTS], TRACKED_OBJECTS)
    msg.objects[0].object_id = SimpleNamespace(uuid=np.zeros(3, np.uint8))
    with pytest.raises(MessageError, match="16 bytes"):
        tracks_from_tracked_objects(msg)
    msg = DECODERS["rosbags"](_all()[DETECTED_OBJECTS], DETECTED_OBJECTS)
    msg.objects[0].shape.dimensions.x = -1.0
    with pytest.raises(CloudError, match=r"length -1\.0, which is not positive") as info:
        obstacles_from_detected_objects(msg)
    assert info.value.reason == BAD_BOX_SIZE


def test_class_ids_follow_the_one_map() -> None:
    assert [label_of_class_id(c) for c in ("Car", "vehicle", "person", "pole", "7", "2")] == [
        LABEL_CAR,
        LABEL_CAR,
        LABEL_PEDESTRIAN,
        LABEL_POLE,
        LABEL_PEDESTRIAN,
        LABEL_CAR,
    ]


def test_bytes_read_into_the_same_tables_as_the_message() -> None:
    data = _all()
    msgs = {t: DECODERS["rclpy"](d, t) for t, d in data.items()}
    assert np.array_equal(
        obstacles_from_detected_objects(data[DETECTED_OBJECTS]),
        obstacles_from_detected_objects(msgs[DETECTED_OBJECTS]),
    )
    from_bytes = tracks_from_tracked_objects(data[TRACKED_OBJECTS])
    from_msg = tracks_from_tracked_objects(msgs[TRACKED_OBJECTS])
    assert np.array_equal(from_bytes.tracks, from_msg.tracks)
    assert np.array_equal(from_bytes.uuids, from_msg.uuids)
    got = predictions_from_predicted_objects(data[PREDICTED_OBJECTS])
    want = predictions_from_predicted_objects(msgs[PREDICTED_OBJECTS])
    assert [p.uuid for p in got] == [p.uuid for p in want]
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a.confidences, b.confidences) and a.time_steps_s == b.time_steps_s
        assert len(a.paths) == len(b.paths)
        assert all(np.array_equal(p, q) for p, q in zip(a.paths, b.paths, strict=True))


def test_bytes_that_are_no_object_message_are_message_errors() -> None:
    data = _all()[TRACKED_OBJECTS]
    with pytest.raises(MessageError, match="ends at"):
        tracks_from_tracked_objects(data[:-5])
    with pytest.raises(MessageError, match="encapsulation"):
        tracks_from_tracked_objects(b"\x00\x00" + data[2:])
    huge = bytearray(data)
    # The object count, after the stamp and the frame id "odom".
    huge[4 + 8 + 4 + 5 + 3 : 4 + 8 + 4 + 5 + 3 + 4] = (2**31).to_bytes(4, "little")
    with pytest.raises(MessageError, match="does not fit"):
        tracks_from_tracked_objects(bytes(huge))


def test_the_bytes_are_rosbags_for_the_message_built_field_by_field() -> None:
    """rosbags encodes a message built one field at a time to the very bytes (its padding
    is zeros too)."""
    states, params = _tracks(), ObjectParams()
    store = msgtypes.typestore()
    for msgtype, arrays in (
        (TRACKED_OBJECTS, tracked_arrays(NS, "odom", states, params)),
        (PREDICTED_OBJECTS, predicted_arrays(NS, "od", states, _paths(), params)),
    ):
        reference = reference_message(msgtypes.message, msgtype, arrays)
        assert bytes(store.serialize_cdr(reference, msgtype)) == encode(msgtype, arrays)


def test_a_step_too_short_keeps_the_heading_before_it() -> None:
    """The first path stands still (the agent's yaw, then each heading held until the next
    step that moves); tracks match agents by id, unmatched on either side have no path."""
    tracks = np.zeros(3, TRACK_DTYPE)
    tracks["id"] = [7, 3, 5]
    tracks["x"], tracks["y"], tracks["z"], tracks["yaw"] = [1.0, 0.0, 2.0], 0.0, 0.5, 0.5
    tracks["length"] = tracks["width"] = tracks["height"] = 1.0
    states = TrackStates(tracks, np.zeros((3, 16), np.uint8), np.ones(3, np.float32), np.zeros(3))
    xy = np.zeros((2, 2, 4, 2), np.float32)
    xy[:, 0] = [[1.0, 0.0], [2.0, 0.0], [2.0, 0.0], [2.0, 1.0]]
    xy[:, 1] = [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    paths = PredictedPaths(np.array([9, 7], np.uint32), xy, np.ones((2, 2), np.float32), 0.1)
    arrays = predicted_arrays(NS, "map", states, paths, ObjectParams())
    assert arrays.path_rows.tolist() == [0]
    poses = arrays.path_poses[0]
    yaw = 2.0 * np.arctan2(poses[..., 5], poses[..., 6])
    np.testing.assert_allclose(yaw[0], [0.5, 0.0, 0.0, math.pi / 2], atol=1e-12)
    np.testing.assert_allclose(yaw[1], [math.pi / 2] * 4, atol=1e-12)
    np.testing.assert_allclose(poses[..., 2], 0.5)
    np.testing.assert_allclose(poses[0, :, :2], xy[1, 0])
    # An id given twice: its last paths.
    twice = PredictedPaths(np.array([7, 7], np.uint32), xy, np.array([[0.1] * 2, [0.9] * 2]), 0.1)
    arrays = predicted_arrays(NS, "map", states, twice, ObjectParams())
    assert arrays.path_rows.tolist() == [0]
    np.testing.assert_allclose(arrays.path_confidences, [[0.9, 0.9]])


def test_table_labels_outside_the_map_are_unknown_classifications() -> None:
    labels = np.array([LABEL_CAR, LABEL_PEDESTRIAN, LABEL_POLE, 0, 99, -1, 2**40])
    assert classification_of(labels).tolist() == [CAR, PEDESTRIAN, UNKNOWN, UNKNOWN] + [UNKNOWN] * 3
