"""The nodes' ROS-free helpers and message builders: odometry buffer, drops, histories, markers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from dynshape_perception.config import Bounds
from dynshape_perception.errors import MessageError
from dynshape_perception.io.markers import (
    MARKER_NS_BOXES,
    MARKER_NS_IDS,
    MARKER_NS_PATHS,
    MarkerStyle,
)
from dynshape_perception.io.objects import detections_to_obstacles
from dynshape_perception.io.pointcloud2 import BAD_BOX_SIZE, CloudError
from dynshape_perception.nodes.messages import header, marker_array, table_msg, time_msg
from dynshape_perception.perception.drops import DropCounter
from dynshape_perception.perception.odometry import PoseBuffer, yaw_from_quaternion
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.perception.prediction.paths import prediction_table
from dynshape_perception.perception.prediction.track_histories import TrackHistories
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    OBSTACLE_DTYPE,
    TRACK_DTYPE,
)

pytestmark = pytest.mark.ros


def test_pose_buffer_interpolates_and_clamps() -> None:
    buf = PoseBuffer(capacity=10)
    assert buf.pose_at(1.0) is None
    assert buf.add(1.0, 0.0, 0.0, math.pi - 0.1)
    assert buf.add(2.0, 10.0, 4.0, -math.pi + 0.1)
    mid = buf.pose_at(1.5)
    assert mid is not None and (mid.x, mid.y) == pytest.approx((5.0, 2.0))
    # The short way round through +-pi, not through 0.
    assert abs(abs(mid.yaw) - math.pi) < 1e-9
    start = buf.pose_at(0.0)
    assert start is not None and (start.x, start.y) == (0.0, 0.0)
    assert start.yaw == pytest.approx(math.pi - 0.1)
    assert buf.pose_at(9.0).x == 10.0  # type: ignore[union-attr]


def test_pose_buffer_refuses_time_going_back_and_stays_bounded() -> None:
    buf = PoseBuffer(capacity=3)
    for t in range(5):
        assert buf.add(float(t), float(t), 0.0, 0.0)
    assert len(buf) == 3
    assert not buf.add(2.5, 0.0, 0.0, 0.0)
    assert not buf.add(4.0, 0.0, 0.0, 0.0)
    assert buf.newest_stamp_s == 4.0


def test_pose_buffer_applies_the_lidar_mount() -> None:
    buf = PoseBuffer(capacity=4, mount=Pose2D(1.5, 0.0, 0.1))
    buf.add(0.0, 10.0, 0.0, math.pi / 2)
    pose = buf.pose_at(0.0)
    assert pose is not None
    assert (pose.x, pose.y, pose.yaw) == pytest.approx((10.0, 1.5, math.pi / 2 + 0.1))


def test_yaw_from_quaternion() -> None:
    yaw = 0.7
    assert yaw_from_quaternion(0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)) == pytest.approx(yaw)


def test_drop_counter_throttles_per_reason() -> None:
    now = [0.0]
    warned: list[str] = []
    drops = DropCounter(("a", "b"), warned.append, throttle_s=5.0, clock=lambda: now[0])
    for _ in range(3):
        drops.drop("a", "bad a")
    drops.drop("b", "bad b")
    now[0] = 6.0
    drops.drop("a", "bad a again")
    assert drops.counts == {"a": 4, "b": 1} and drops.total == 5
    assert [w.split(":")[0] for w in warned] == [
        "dropped input (a, 1 so far)",
        "dropped input (b, 1 so far)",
        "dropped input (a, 4 so far)",
    ]
    assert drops.once("k", "said once") and not drops.once("k", "said once")
    assert warned[-1] == "said once"


def _tracks(ids: list[int], xs: list[float]) -> np.ndarray:
    out = np.zeros(len(ids), dtype=TRACK_DTYPE)
    out["id"], out["x"] = ids, xs
    return out


def test_track_histories_batch_nearest_first_and_forget_the_gone() -> None:
    hist = TrackHistories(Bounds(A=1, T=4), step_s=0.4)
    for k in range(5):
        hist.update(_tracks([1, 2], [10.0 + k, 2.0 + k]), 0.4 * k)
    ids, batch, lengths = hist.batch(_tracks([1, 2], [14.0, 6.0]), Pose2D(), min_steps=2)
    assert ids.tolist() == [2] and hist.dropped_agents == 1
    assert lengths.tolist() == [4] and batch.shape == (1, 4, 2)
    np.testing.assert_allclose(batch[0, :, 0], [3.0, 4.0, 5.0, 6.0])
    hist.update(_tracks([2], [7.0]), 2.0)
    ids, _, _ = hist.batch(_tracks([1], [15.0]), Pose2D(), min_steps=1)
    assert ids.size == 0


def test_marker_array_layout() -> None:
    tracks = np.zeros(2, dtype=TRACK_DTYPE)
    tracks["id"], tracks["label"] = [4, 9], [LABEL_CAR, LABEL_PEDESTRIAN]
    tracks["length"], tracks["width"], tracks["height"] = 4.0, 2.0, 1.5
    traj = np.zeros((2, 3, 5, 2), np.float32)
    probs = np.array([[0.5, 0.3, 0.2], [0.9, 0.05, 0.05]], np.float32)
    preds = prediction_table(np.array([4, 9], np.uint32), traj, probs)
    style = MarkerStyle(box_alpha=0.4, text_size_m=1.0, path_width_m=0.2)
    msg = marker_array(tracks, preds, header(time_msg(5), "odom"), style)
    kinds = [(m.ns, m.type) for m in msg.markers]
    assert msg.markers[0].action == msg.markers[0].DELETEALL
    assert kinds.count((MARKER_NS_BOXES, 1)) == 2 and kinds.count((MARKER_NS_IDS, 9)) == 2
    paths = [m for m in msg.markers if m.ns == MARKER_NS_PATHS]
    assert len(paths) == 6 and all(len(p.points) == 5 for p in paths)
    assert sorted(round(p.color.a, 3) for p in paths) == sorted(
        round(float(p), 3) for p in probs.ravel()
    )
    assert [m.text for m in msg.markers if m.ns == MARKER_NS_IDS] == ["4", "9"]
    assert all(m.header.frame_id == "odom" and m.header.stamp.nanosec == 5 for m in msg.markers)


def test_table_message_carries_the_header() -> None:
    msg = table_msg(np.zeros(3, OBSTACLE_DTYPE), header(time_msg(2_500_000_000), "lidar"))
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (2, 500_000_000)
    assert msg.header.frame_id == "lidar" and msg.width == 3 and msg.point_step == 40
    assert [f.name for f in msg.fields][-2:] == ["label", "num_points"]


def _detection(x: float, score: float, class_id: str) -> SimpleNamespace:
    ns = SimpleNamespace
    return ns(
        bbox=ns(
            center=ns(position=ns(x=x, y=1.0, z=0.5), orientation=ns(x=0.0, y=0.0, z=0.0, w=1.0)),
            size=ns(x=4.0, y=2.0, z=1.5),
        ),
        results=[ns(hypothesis=ns(score=score, class_id=class_id))],
    )


def test_detections_to_obstacles() -> None:
    # Class names, or ObjectClassification labels (7: PEDESTRIAN), through the one class map.
    msg = SimpleNamespace(detections=[_detection(3.0, 0.9, "car"), _detection(7.0, 0.4, "7")])
    rows = detections_to_obstacles(msg)
    assert rows.dtype == OBSTACLE_DTYPE
    assert rows["x"].tolist() == [3.0, 7.0]
    assert rows["label"].tolist() == [LABEL_CAR, LABEL_PEDESTRIAN]
    assert rows["score"].tolist() == pytest.approx([0.9, 0.4])
    msg.detections.append(_detection(math.nan, 0.5, "car"))
    with pytest.raises(MessageError, match="NaN"):
        detections_to_obstacles(msg)


@pytest.mark.parametrize(
    ("ids", "xs", "match"),
    [
        ([1, 2], [math.nan, 6.0], "NaN or Inf"),
        ([1, 2, 2], [14.0, 6.0, 7.0], r"id\(s\) \[2\] repeated"),
    ],
)
def test_track_histories_refuse_a_bad_message_before_storing_it(
    ids: list[int], xs: list[float], match: str
) -> None:
    hist = TrackHistories(Bounds(T=8), step_s=0.4)
    for k in range(5):
        hist.update(_tracks([1, 2], [10.0 + k, 2.0 + k]), 0.4 * k)
    with pytest.raises(MessageError, match=match):
        hist.update(_tracks(ids, xs), 2.0)
    # Nothing of it was kept: the next frame batches as if it never came.
    hist.update(_tracks([1, 2], [15.0, 7.0]), 2.4)
    got, batch, lengths = hist.batch(_tracks([1, 2], [15.0, 7.0]), Pose2D(), min_steps=2)
    assert got.tolist() == [2, 1] and lengths.tolist() == [7, 7]
    assert np.isfinite(batch).all()


def test_track_histories_skip_a_repeated_stamp_and_refuse_an_older_one() -> None:
    hist = TrackHistories(Bounds(T=8), step_s=0.4)
    hist.update(_tracks([1], [10.0]), 0.0)
    hist.update(_tracks([1], [11.0]), 0.4)
    hist.update(_tracks([1], [99.0]), 0.4)
    with pytest.raises(MessageError, match="before its newest"):
        hist.update(_tracks([1], [12.0]), 0.2)
    ids, batch, lengths = hist.batch(_tracks([1], [11.0]), Pose2D(), min_steps=2)
    assert ids.tolist() == [1] and lengths.tolist() == [2]
    np.testing.assert_allclose(batch[0, :, 0], [10.0, 11.0])


@pytest.mark.parametrize(
    ("class_id", "match"),
    [
        ("99999999999", "uint8"),
        (str(2**32), "uint8"),
        ("256", "uint8"),
        ("\u00b2", "unsigned ASCII number"),
        ("\u0663", "unsigned ASCII number"),
        ("-3", "unsigned ASCII number"),
    ],
)
def test_detections_with_a_bad_numeric_class_id_are_refused(class_id: str, match: str) -> None:
    msg = SimpleNamespace(detections=[_detection(3.0, 0.9, class_id)])
    with pytest.raises(MessageError, match=match):
        detections_to_obstacles(msg)


def test_detection_labels_at_the_uint8_edge_and_unknown_names() -> None:
    msg = SimpleNamespace(
        detections=[
            _detection(3.0, 0.9, "255"),
            _detection(4.0, 0.9, "bicycle"),
            _detection(5.0, 0.9, "Truck"),
        ]
    )
    assert detections_to_obstacles(msg)["label"].tolist() == [0, 0, LABEL_CAR]


@pytest.mark.parametrize("size", [(-5.0, 2.0, 1.5), (4.0, 0.0, 1.5), (4.0, 2.0, -1.0)])
def test_detections_with_a_non_positive_box_size_are_refused(
    size: tuple[float, float, float],
) -> None:
    det = _detection(3.0, 0.9, "car")
    det.bbox.size = SimpleNamespace(x=size[0], y=size[1], z=size[2])
    with pytest.raises(MessageError, match="not positive") as info:
        detections_to_obstacles(SimpleNamespace(detections=[det]))
    assert isinstance(info.value, CloudError) and info.value.reason == BAD_BOX_SIZE


def test_pose_buffer_gap_outside_its_span_and_clear() -> None:
    buf = PoseBuffer(capacity=4)
    assert buf.gap_s(1.0) == math.inf
    buf.add(1.0, 0.0, 0.0, 0.0)
    buf.add(2.0, 0.0, 0.0, 0.0)
    assert (buf.gap_s(1.5), buf.gap_s(2.75), buf.gap_s(0.5)) == (0.0, 0.75, 0.5)
    buf.clear()
    assert len(buf) == 0 and buf.newest_stamp_s is None
