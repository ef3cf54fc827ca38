"""One bad object among good ones is dropped alone, counted; repeated UUIDs are told apart."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from rclpy.parameter import Parameter
from rclpy.serialization import serialize_message
from rclpy.time import Time
from tf2_msgs.msg import TFMessage
from vision_msgs.msg import Detection3DArray, ObjectHypothesisWithPose

from dynshape_perception.io.objects import (
    BAD_OBJECT,
    TrackStates,
    detected_objects,
    detections_to_obstacles,
    tracked_objects,
)
from dynshape_perception.nodes.base import TF_BAD_MESSAGE, PerceptionNode
from dynshape_perception.nodes.messages import deserialized, time_msg, transform_msg
from dynshape_perception.nodes.prediction_node import DUPLICATE_UUIDS, PredictionNode
from dynshape_perception.nodes.tracker_node import TrackerNode
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.perception.transforms import planar
from dynshape_perception.testing.hostile import (
    callback_of,
    nodes_in_process,
    obstacles,
    sample,
    track_states,
)

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def nodes() -> Iterator[dict[str, PerceptionNode]]:
    with nodes_in_process((TrackerNode, PredictionNode), {"jit.mode": "off"}) as made:
        yield made


def test_a_box_of_no_size_among_ten_is_dropped_alone(nodes: dict[str, PerceptionNode]) -> None:
    node = nodes["tracker_node"]
    rows = obstacles(10)
    rows["x"] = np.arange(10) * 10.0 + 5.0
    rows["width"][4] = 0.0
    rows["height"][7] = np.nan
    frames_out = node.counters["frames_out"]
    callback_of(node, "detected_objects")(detected_objects(time.time_ns(), "base_link", rows))
    assert node.counters["frames_out"] == frames_out + 1
    assert node.drops.snapshot()[BAD_OBJECT] == 2
    assert len(node.pipeline.tracker.live_ids()) == 8  # type: ignore[attr-defined]


def test_an_unknown_class_number_is_recorded_for_its_detection_alone() -> None:
    msg = deserialized(sample("detections", time.time_ns()), Detection3DArray)
    hyp = ObjectHypothesisWithPose()
    hyp.hypothesis.class_id, hyp.hypothesis.score = "999", 0.9
    msg.detections[1].results = [hyp]
    problems: dict[int, str] = {}
    rows = detections_to_obstacles(msg, problems)
    assert rows.shape[0] == 3 and list(problems) == [1]
    assert "'999'" in problems[1]


def test_bad_tracks_are_dropped_alone_and_repeated_uuids_told_apart(
    nodes: dict[str, PerceptionNode],
) -> None:
    node = nodes["prediction_node"]
    states = track_states(4)
    states.tracks["x"] = [5.0, 15.0, 25.0, 35.0]
    states.tracks["length"][2] = -1.0
    uuids = states.uuids.copy()
    uuids[3] = uuids[0]
    states = TrackStates(states.tracks, uuids, states.existence, states.missed)
    frames_out = node.counters["frames_out"]
    data = tracked_objects(time.time_ns(), "odom", states, ObjectParams())
    callback_of(node, "tracked_objects")(data)
    assert node.counters["frames_out"] == frames_out + 1, node.drops.snapshot()
    assert node.drops.snapshot()[BAD_OBJECT] == 1
    assert node.counters[DUPLICATE_UUIDS] == 1


def test_the_mount_in_use_is_noted_where_only_the_fixed_frame_needs_it(
    nodes: dict[str, PerceptionNode],
) -> None:
    """Detections in a frame TF does not know, placed by odometry: the frames.mount_*
    parameters are used, and the pose task says so."""
    node = nodes["tracker_node"]
    stamp = time.time_ns()
    callback_of(node, "odom")(sample("odom", stamp))
    objects = detected_objects(stamp, "radar_without_tf", obstacles())
    callback_of(node, "detected_objects")(objects)
    assert "frames.mount_*" in node.notes.get("mount", ""), (node.notes, node.drops.snapshot())
    _, _, values = node.report_pose()
    assert "'radar_without_tf'" in str(values["mount"])


def test_a_bad_transform_is_dropped_alone(nodes: dict[str, PerceptionNode]) -> None:
    node = nodes["tracker_node"]
    stamp = time_msg(time.time_ns())
    good = transform_msg("bad_tf_world", "bad_tf_good", planar(1.0), stamp)
    bad = transform_msg("bad_tf_world", "bad_tf_bad", planar(1.0), stamp)
    bad.transform.rotation.z = bad.transform.rotation.w = 1e200
    before = node.drops.snapshot()[TF_BAD_MESSAGE]
    callback_of(node, "/tf")(bytes(serialize_message(TFMessage(transforms=[bad, good]))))
    assert node.drops.snapshot()[TF_BAD_MESSAGE] == before + 1
    buffer = node.pose.buffer  # type: ignore[attr-defined]
    assert buffer.can_transform("bad_tf_world", "bad_tf_good", Time())
    assert not buffer.can_transform("bad_tf_world", "bad_tf_bad", Time())


def test_the_mount_is_logged_once_per_sensor_frame(
    nodes: dict[str, PerceptionNode], capfd: pytest.CaptureFixture[str]
) -> None:
    """Inputs in the base frame between a sensor's inputs ask for no mount: the sensor's
    mount is logged when it first comes up, not again at every change of input frame."""
    node = nodes["tracker_node"]
    capfd.readouterr()
    for k in range(4):
        stamp = time.time_ns()
        callback_of(node, "odom")(sample("odom", stamp))
        for frame in ("radar_left", "base_link"):
            callback_of(node, "detected_objects")(detected_objects(stamp + k, frame, obstacles()))
    err = capfd.readouterr().err
    assert err.count("sensor mount:") == 1, err
    assert "'radar_left'" in err


def test_a_live_change_of_the_object_parameters_reaches_the_predictions(
    nodes: dict[str, PerceptionNode],
) -> None:
    node = nodes["prediction_node"]
    before = node.object_params  # type: ignore[attr-defined]
    changed = before.position_std_m + 0.25
    done = node.set_parameters([Parameter("objects.position_std_m", value=changed)])
    assert done[0].successful, done[0].reason
    assert node.object_params.position_std_m == changed  # type: ignore[attr-defined]
    node.set_parameters([Parameter("objects.position_std_m", value=before.position_std_m)])
    assert node.object_params == before  # type: ignore[attr-defined]
