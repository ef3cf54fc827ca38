"""Input screening of the nodes, in process: stamps, time jumps, odometry, intensity, counters."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import rclpy
from nav_msgs.msg import Odometry
from rclpy.context import Context
from rclpy.node import Node
from rclpy.serialization import serialize_message

from dynshape_perception import parameters
from dynshape_perception.config import Bounds
from dynshape_perception.io.pointcloud2 import REASONS, points_to_cloud
from dynshape_perception.nodes.base import (
    INTENSITY_OUT_OF_RANGE,
    ODOM_BACKWARDS,
    ODOM_BAD_QUATERNION,
    ODOM_FRAME_CHANGES,
    ODOM_REASONS,
    ODOM_STALE,
    POINT_COUNTERS,
    STALE_STAMP,
    TIME_JUMP_RESET,
    FixedFrame,
    PerceptionNode,
    model_not_loaded,
)
from dynshape_perception.nodes.frames import OdometryInput
from dynshape_perception.nodes.guard import InternalErrors
from dynshape_perception.nodes.inputs import InputThread
from dynshape_perception.nodes.messages import NS_PER_S, cloud_msg, header, time_msg
from dynshape_perception.nodes.segmenting import SEGMENTING_COUNTERS, SegmentingNode
from dynshape_perception.perception.drops import DropCounter
from dynshape_perception.perception.ground import GroundPlane
from dynshape_perception.perception.pipeline import Pipeline, PipelineParams
from dynshape_perception.perception.records import OBSTACLE_DTYPE
from dynshape_perception.perception.stamps import FUTURE_STAMP, OUTLIER_STAMP
from dynshape_perception.scheduling.lidar_tiers import FullCloud, NearResult

pytestmark = pytest.mark.ros


class InputNode(Node):
    """A bare rclpy node with PerceptionNode's input handling and none of its engines."""

    on_time_jump = PerceptionNode.on_time_jump
    screen_stamp = PerceptionNode.screen_stamp
    ros_time_s = PerceptionNode.ros_time_s
    points_of = PerceptionNode.points_of
    _scale_intensity = PerceptionNode._scale_intensity
    count = PerceptionNode.count
    set_counter = PerceptionNode.set_counter
    note = PerceptionNode.note
    guarded = PerceptionNode.guarded
    failures_count = PerceptionNode.failures_count
    count_failure = PerceptionNode.count_failure
    take_input = PerceptionNode.take_input

    def __init__(self, context: Context, node: str, **overrides: parameters.Value) -> None:
        super().__init__(f"input_{node}", context=context)
        self.values = {n: s.default for n, s in parameters.node_specs(node).items()}
        self.values.update(overrides)
        self.stamp_policy = parameters.stamp_policy(self.values)
        self.warnings: list[str] = []
        self.drops = DropCounter(
            (*REASONS, STALE_STAMP, *ODOM_REASONS), self.warnings.append, throttle_s=0.0
        )
        self.counters: dict[str, int] = dict(POINT_COUNTERS)
        self.notes: dict[str, str] = {}
        self._warn_notes: set[str] = set()
        self._stats_lock = threading.Lock()
        self._time_resets: list[Any] = []
        self.input_qos = 5
        self._closing = False
        self.internal_errors = InternalErrors()
        # Never started: the tests hand the messages to the callbacks themselves.
        self.turn = threading.RLock()
        self.inputs = InputThread(context, f"input_{node}", self.turn)


def perception_node(node: InputNode) -> PerceptionNode:
    """The stand-in where a PerceptionNode is taken: it has the input handling used there."""
    return cast(PerceptionNode, node)


@pytest.fixture(scope="module")
def context() -> Iterator[Context]:
    ctx = Context()
    rclpy.init(args=[], context=ctx)
    yield ctx
    rclpy.shutdown(context=ctx)


@pytest.fixture
def tracker(context: Context) -> Iterator[InputNode]:
    node = InputNode(context, "tracker_node")
    yield node
    node.destroy_node()


def frame_and_odometry(
    node: InputNode, reset: Callable[[], None]
) -> tuple[FixedFrame, OdometryInput]:
    return FixedFrame(perception_node(node), reset), OdometryInput(perception_node(node))


def _odom(stamp_s: float, x: float) -> Odometry:
    msg = Odometry()
    msg.header = header(time_msg(round(stamp_s * NS_PER_S)), "odom")
    msg.pose.pose.position.x = x
    msg.pose.pose.orientation.w = 1.0
    return msg


def _admit_in_step(
    frame: FixedFrame,
    odometry: OdometryInput,
    start_s: float,
    step_s: float,
    ks: range,
    x0: float = 0.0,
) -> None:
    """For each k: odometry at ``start_s + step_s * k`` (x = x0 + k), then a frame of that
    stamp, which the fixed frame passes and admits."""
    for k in ks:
        stamp = start_s + step_s * k
        odometry._on_bytes(serialize_message(_odom(stamp, x0 + k)))
        assert frame.screen(stamp) and frame.admit("odom", stamp)


class Resets:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def test_a_far_future_stamp_is_dropped_and_moves_no_state(tracker: InputNode) -> None:
    resets = Resets()
    frame, odometry = frame_and_odometry(tracker, resets)
    t = 100.0
    _admit_in_step(frame, odometry, t, 0.1, range(3))
    now = perception_node(tracker).ros_time_s()
    future = now + 10 * float(tracker.values["stamps.future_tolerance_s"])
    odometry._on_bytes(serialize_message(_odom(future, 999.0)))
    assert not frame.screen(future)
    assert tracker.drops.counts[FUTURE_STAMP] == 2
    # Later inputs go on as before: no stale frames, no odometry "going back".
    _admit_in_step(frame, odometry, t, 0.1, range(3, 20))
    assert tracker.drops.counts[STALE_STAMP] == tracker.drops.counts[ODOM_BACKWARDS] == 0
    located = odometry.pose_at(t + 1.9, "lidar")
    assert located is not None and located[0].x == pytest.approx(19.0)
    assert tracker.counters[TIME_JUMP_RESET] == 0


@pytest.fixture
def tracker_taking_jumps_at_once(context: Context) -> Iterator[InputNode]:
    node = InputNode(context, "tracker_node", **{"stamps.jump_confirm_frames": 1})
    yield node
    node.destroy_node()


def test_a_jump_back_in_time_restarts_frame_and_odometry(
    tracker_taking_jumps_at_once: InputNode,
) -> None:
    tracker = tracker_taking_jumps_at_once
    resets = Resets()
    frame, odometry = frame_and_odometry(tracker, resets)
    _admit_in_step(frame, odometry, 100.0, 0.1, range(50))
    assert resets.n == 1  # the first frame set the fixed frame
    # A small step back is a stale input, as before.
    odometry._on_bytes(serialize_message(_odom(104.0, 0.0)))
    assert frame.screen(104.0) and not frame.admit("odom", 104.0)
    assert tracker.drops.counts[STALE_STAMP] == tracker.drops.counts[ODOM_BACKWARDS] == 1
    # The bag loops: odometry restarts first, the frame then is simply admitted.
    tolerance_s = float(tracker.values["stamps.jump_back_tolerance_s"])
    start = 104.9 - 2 * tolerance_s
    odometry._on_bytes(serialize_message(_odom(start, -5.0)))
    assert tracker.counters[TIME_JUMP_RESET] == 1 and resets.n == 2
    assert len(odometry.buffer) == 1
    assert frame.screen(start) and frame.admit("odom", start)
    located = odometry.pose_at(start, "lidar")
    assert located is not None and located[0].x == -5.0
    # The frame first this time: odometry restarts with it.
    _admit_in_step(frame, odometry, start, 0.1, range(1, 5), x0=-5.0)
    again = start - 2 * tolerance_s
    assert frame.screen(again) and frame.admit("odom", again)
    assert tracker.counters[TIME_JUMP_RESET] == 2 and resets.n == 3 and len(odometry.buffer) == 0
    odometry._on_bytes(serialize_message(_odom(again, 7.0)))
    assert len(odometry.buffer) == 1
    # A restart is no dropped input.
    assert tracker.drops.counts[STALE_STAMP] == tracker.drops.counts[ODOM_BACKWARDS] == 1


# Wire stamps are int32 seconds: 2100-01-01T00:00:00Z arrives wrapped below zero.
YEAR_2100_WRAPPED_S = 4_102_444_800.0 - 2.0**32


@pytest.mark.parametrize(
    "outlier",
    [
        lambda t: 0.0,
        lambda t: -5.0,
        lambda t: t - 1000.0,
        lambda t: YEAR_2100_WRAPPED_S,
        lambda t: t + 4.9,
    ],
    ids=["zero", "negative", "far-past", "year-2100-wrapped", "4.9-s-ahead"],
)
def test_a_single_outlier_stamp_is_dropped_and_moves_no_state(
    tracker: InputNode, outlier: Any
) -> None:
    resets = Resets()
    frame, odometry = frame_and_odometry(tracker, resets)
    t = 100.0
    _admit_in_step(frame, odometry, t, 0.5, range(5))
    bad = outlier(t + 2.0)
    odometry._on_bytes(serialize_message(_odom(bad, 999.0)))
    assert not frame.screen(bad)
    assert tracker.drops.counts[OUTLIER_STAMP] == 2
    # The ten frames after it (5 s at 2 Hz) go on as if it had never come.
    _admit_in_step(frame, odometry, t, 0.5, range(5, 15))
    assert tracker.drops.counts[STALE_STAMP] == tracker.drops.counts[ODOM_BACKWARDS] == 0
    assert tracker.counters[TIME_JUMP_RESET] == 0 and resets.n == 1
    assert len(odometry.buffer) == 15
    located = odometry.pose_at(t + 7.0, "lidar")
    assert located is not None and located[0].x == pytest.approx(14.0)


def test_only_a_sustained_jump_back_restarts(tracker: InputNode) -> None:
    """A looped bag: the first stamps of the new pass are held back, then taken together."""
    confirm = int(tracker.values["stamps.jump_confirm_frames"])
    assert confirm == 3
    resets = Resets()
    frame, odometry = frame_and_odometry(tracker, resets)
    tolerance_s = float(tracker.values["stamps.jump_back_tolerance_s"])
    _admit_in_step(frame, odometry, 100.0, 0.1, range(round(2 * tolerance_s / 0.1)))
    for k in range(confirm - 1):
        assert not frame.screen(100.0 + 0.1 * k)
        assert tracker.counters[TIME_JUMP_RESET] == 0 and resets.n == 1
    assert frame.screen(100.0 + 0.1 * (confirm - 1))
    assert tracker.counters[TIME_JUMP_RESET] == 1 and resets.n == 2
    assert len(odometry.buffer) == 0
    assert frame.admit("odom", 100.0 + 0.1 * (confirm - 1))
    assert tracker.drops.counts[OUTLIER_STAMP] == confirm - 1
    assert tracker.drops.counts[STALE_STAMP] == 0
    # The odometry of the new pass is taken at once: the restart cleared its newest stamp.
    odometry._on_bytes(serialize_message(_odom(100.0, -1.0)))
    assert len(odometry.buffer) == 1


def test_odometry_older_than_the_extrapolation_limit_drops_the_frame(tracker: InputNode) -> None:
    odometry = OdometryInput(perception_node(tracker))
    for k in range(10):
        odometry._on_bytes(serialize_message(_odom(100.0 + 0.1 * k, 10.0 * k)))
    limit_s = float(tracker.values["odometry.max_extrapolation_s"])
    assert limit_s == 0.5
    located = odometry.pose_at(100.9 + limit_s / 2, "lidar")
    assert located is not None and located[1] == "odom"
    assert odometry.pose_at(100.9 + 2 * limit_s, "lidar") is None
    assert odometry.pose_at(100.0 - 2 * limit_s, "lidar") is None
    assert tracker.drops.counts[ODOM_STALE] == 2
    assert "odometry" in tracker._warn_notes and "stale" in tracker.notes["odometry"]
    odometry._on_bytes(serialize_message(_odom(102.5, 5.0)))
    assert odometry.pose_at(102.5, "lidar") is not None
    assert tracker.notes["odometry"] == "ok (frame odom)" and "odometry" not in tracker._warn_notes


def test_odometry_quaternions_are_normalised_and_degenerate_ones_dropped(
    tracker: InputNode,
) -> None:
    odometry = OdometryInput(perception_node(tracker))
    scaled = _odom(100.0, 0.0)
    # Twice too long, as a driver may send it: 90 degrees once normalised.
    scaled.pose.pose.orientation.z = scaled.pose.pose.orientation.w = 1.414
    odometry._on_bytes(serialize_message(scaled))
    located = odometry.pose_at(100.0, "lidar")
    assert located is not None and located[0].yaw == pytest.approx(math.pi / 2)
    # An obstacle 10 m ahead of the vehicle lies at (0, 10) in the odometry frame.
    x, y = located[0].apply(np.array([10.0]), np.array([0.0]))
    assert (float(x[0]), float(y[0])) == pytest.approx((0.0, 10.0), abs=1e-9)
    for k, q in enumerate([(0.0, 0.0, 0.0, 0.0), (math.nan, 0.0, 0.0, 1.0)]):
        bad = _odom(100.1 + 0.1 * k, 50.0)
        o = bad.pose.pose.orientation
        o.x, o.y, o.z, o.w = q
        odometry._on_bytes(serialize_message(bad))
    assert tracker.drops.counts[ODOM_BAD_QUATERNION] == 2 and len(odometry.buffer) == 1
    assert any("no rotation" in w for w in tracker.warnings)


def test_an_odometry_frame_change_clears_the_buffer(
    tracker: InputNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    logged: list[str] = []
    logger = SimpleNamespace(warning=logged.append, info=logged.append)
    monkeypatch.setattr(tracker, "get_logger", lambda: logger)
    resets = Resets()
    frame, odometry = frame_and_odometry(tracker, resets)
    odometry._on_bytes(serialize_message(_odom(100.0, 0.0)))
    in_map = _odom(100.1, 1000.0)
    in_map.header.frame_id = "map"
    odometry._on_bytes(serialize_message(in_map))
    assert tracker.counters[ODOM_FRAME_CHANGES] == 1 and len(odometry.buffer) == 1
    assert any("odometry frame changed from 'odom' to 'map'" in line for line in logged)
    # A cloud between the two: placed in map by map's pose, not halfway between frames.
    located = odometry.pose_at(100.05, "lidar")
    assert located is not None and located[1] == "map" and located[0].x == 1000.0
    assert frame.screen(100.05) and frame.admit("map", 100.05) and resets.n == 1


def test_without_any_odometry_the_sensor_frame_is_still_used(tracker: InputNode) -> None:
    odometry = OdometryInput(perception_node(tracker))
    located = odometry.pose_at(100.0, "lidar")
    assert located is not None and located[1] == "lidar"
    assert tracker.drops.counts[ODOM_STALE] == 0


def _cloud(intensity: float, n: int = 50) -> Any:
    points = np.zeros((n, 4), np.float32)
    points[:, 0] = np.arange(n)
    points[:, 3] = np.linspace(0.0, intensity, n)
    return cloud_msg(points_to_cloud(points), header(time_msg(1), "lidar"))


def _pipeline() -> Pipeline:
    unused = model_not_loaded("any")
    return Pipeline(unused, unused, unused, PipelineParams(), Bounds())


@pytest.mark.parametrize(("scale", "out_of_range"), [(1.0, 1), (1.0 / 255.0, 0)])
def test_intensity_is_scaled_and_out_of_range_clouds_are_counted(
    context: Context, scale: float, out_of_range: int
) -> None:
    node = InputNode(context, "pointcloud_node", **{"points.intensity_scale": scale})
    try:
        pipeline = _pipeline()
        for _ in range(2):
            points = perception_node(node).points_of(_cloud(255.0), pipeline)
            assert points[:, 3].min() >= 0.0 and points[:, 3].max() <= 1.0
        assert points[-1, 3] == pytest.approx(1.0)
        assert node.counters[INTENSITY_OUT_OF_RANGE] == 2 * out_of_range
        warned = [w for w in node.warnings if "points.intensity_scale" in w]
        assert len(warned) == out_of_range  # once, however many clouds
        assert perception_node(node).points_of(_cloud(1.0), pipeline)[-1, 3] == pytest.approx(scale)
    finally:
        node.destroy_node()


def test_truncations_at_the_bounds_reach_the_counters() -> None:
    node: Any = SimpleNamespace(
        counters=dict(SEGMENTING_COUNTERS),
        _stats_lock=threading.Lock(),
        near_objects=SimpleNamespace(publish_serialized=lambda data, stamp: None),
        near_obstacles=None,
        pipeline=SimpleNamespace(dropped_detections=3),
        latency={},
        last_latency_ms={},
        # As with debug.publish_processing_time off: no debug timing topics.
        debug_times=None,
    )
    for name in ("count", "set_counter", "record_latency"):
        setattr(node, name, getattr(PerceptionNode, name).__get__(node))
    node.publish_obstacles = SegmentingNode.publish_obstacles.__get__(node)
    empty = np.zeros(0, dtype=OBSTACLE_DTYPE)
    near = NearResult(empty, 0, 1.0, False, dropped=2)
    SegmentingNode._publish_near(node, header(time_msg(1), "lidar"), near)
    SegmentingNode.count_full_cloud(node, FullCloud(empty, GroundPlane.default(), 0, False, 1, {}))
    assert node.counters["near_field_detections_dropped"] == 2
    assert node.counters["detections_dropped"] == 3
