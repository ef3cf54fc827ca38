"""Hostile bytes on every input of every node, in process through the real callbacks."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynshape_perception.io.cdr import ENCAPSULATION
from dynshape_perception.io.pointcloud2 import REASONS
from dynshape_perception.nodes.base import (
    BAD_MESSAGE,
    INTERNAL_ERROR,
    ODOM_BAD_MESSAGE,
    TF_BAD_MESSAGE,
    PerceptionNode,
)
from dynshape_perception.nodes.perception_pipeline import PerceptionPipelineNode
from dynshape_perception.nodes.pointcloud_node import PointcloudNode
from dynshape_perception.nodes.prediction_node import PredictionNode
from dynshape_perception.nodes.tracker_node import TrackerNode
from dynshape_perception.perception.stamps import OUTLIER_STAMP
from dynshape_perception.testing.hostile import (
    BIG_ENDIAN,
    HUGE_COUNTS,
    TF_TOPICS,
    callback_of,
    nodes_in_process,
    sample,
    with_count,
    without_nul,
    worst,
)

pytestmark = pytest.mark.ros

# The nodes' own topics, and the input type each tracker takes.
NODE_TOPICS = {
    "pointcloud_node": ("points", "/tf", "/tf_static"),
    "perception_pipeline": ("points", "odom", "/tf", "/tf_static"),
    "tracker_node": ("detected_objects", "odom", "/tf", "/tf_static"),
    "prediction_node": ("tracked_objects", "odom", "/tf", "/tf_static"),
}
UNREADABLE = (*REASONS, BAD_MESSAGE, ODOM_BAD_MESSAGE, TF_BAD_MESSAGE)
RCLPY_READ = ("/tf", "/tf_static", "detections")
CASES = [(node, topic) for node, topics in NODE_TOPICS.items() for topic in topics]
FUZZ = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
OVERRIDES: dict[str, bool | int | float | str] = {
    # No compile workers: these tests read bytes, they run no model they could specialise.
    "jit.mode": "off",
    "stamps.jump_confirm_frames": 1,
}


@pytest.fixture(scope="module")
def nodes() -> Iterator[dict[str, PerceptionNode]]:
    factories = (PointcloudNode, PerceptionPipelineNode, TrackerNode, PredictionNode)
    with nodes_in_process(factories, OVERRIDES) as made:
        yield made


def now_ns() -> int:
    return time.time_ns()


def drops_total(node: PerceptionNode) -> int:
    return node.drops.total


def unreadable(node: PerceptionNode) -> int:
    """Drops of bytes that could not be read (the others depend on the nodes' state)."""
    counts = node.drops.snapshot()
    return sum(counts.get(reason, 0) for reason in UNREADABLE)


def read_again(node: PerceptionNode, topic: str) -> None:
    """A valid message after the hostile ones is read: no drop for its bytes."""
    frames_in = node.counters["frames_in"]
    before = unreadable(node)
    feed(node, topic, sample(topic, now_ns()))
    assert unreadable(node) == before
    if topic not in ("odom", *TF_TOPICS):
        assert node.counters["frames_in"] == frames_in + 1


def feed(node: PerceptionNode, topic: str, data: bytes) -> int:
    """Call the topic's callback with ``data``: nothing may escape and nothing may be an
    internal error; the number of drops it counted."""
    before = drops_total(node)
    internal = node.drops.snapshot().get(INTERNAL_ERROR, 0)
    callback_of(node, topic)(data)
    assert node.drops.snapshot().get(INTERNAL_ERROR, 0) == internal, node.internal_errors.last
    return drops_total(node) - before


class FaultInjectedCallback:
    """Fault injector: a step of a callback that raises what no code of the node expects."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *_: object, **__: object) -> None:
        self.calls += 1
        raise ZeroDivisionError("injected fault")


def _inject(node: PerceptionNode, topic: str, fault: FaultInjectedCallback) -> Callable[[], None]:
    """Put ``fault`` into the callback of ``topic``; the undo."""
    if topic == "odom":
        odometry = node.pose.odometry  # type: ignore[attr-defined]
        odometry._on_odom = fault
        return lambda: delattr(odometry, "_on_odom")
    if topic.startswith("/tf"):
        listener = node.pose.listener  # type: ignore[attr-defined]
        listener.take = fault
        return lambda: delattr(listener, "take")
    diagnostics = node.diagnostics
    diagnostics.tick = fault  # type: ignore[method-assign]
    return lambda: delattr(diagnostics, "tick")


@pytest.mark.parametrize(("kind", "topic"), CASES)
def test_a_fault_in_any_callback_is_a_counted_internal_error_and_an_error_status(
    nodes: dict[str, PerceptionNode], kind: str, topic: str
) -> None:
    node = nodes[kind]
    node._report_input()
    fault = FaultInjectedCallback()
    undo = _inject(node, topic, fault)
    before = node.drops.snapshot().get(INTERNAL_ERROR, 0)
    try:
        callback_of(node, topic)(sample(topic, now_ns()))
        callback_of(node, topic)(sample(topic, now_ns()))
    finally:
        undo()
    assert fault.calls == 2
    assert node.drops.snapshot()[INTERNAL_ERROR] == before + 2
    assert "ZeroDivisionError('injected fault')" in node.internal_errors.last
    level, problems, values = node._report_input()
    assert level == 2, problems
    assert any("2 internal error(s)" in p for p in problems), problems
    assert values[f"drops.{INTERNAL_ERROR}"] == before + 2
    # The next report has no new internal error: back to OK or WARN.
    assert node._report_input()[0] < 2
    # The callback works again once the fault is gone.
    read_again(node, topic)


@pytest.mark.parametrize(("kind", "topic"), CASES)
def test_every_truncation_is_a_counted_drop(
    nodes: dict[str, PerceptionNode], kind: str, topic: str
) -> None:
    node = nodes[kind]
    data = sample(topic, now_ns())
    for n in range(len(data)):
        assert feed(node, topic, data[:n]) >= 1, (n, len(data))


@pytest.mark.parametrize(("kind", "topic"), CASES)
def test_the_worst_bytes_are_counted_drops(
    nodes: dict[str, PerceptionNode], kind: str, topic: str
) -> None:
    node = nodes[kind]
    # What may still be a message: trailing bytes are ignored, and Fast CDR (which reads
    # the types rclpy deserialises) takes a string's length without looking for its NUL.
    readable = {"valid prefix, garbage tail"}
    if topic in RCLPY_READ:
        readable.add("frame_id without NUL")
    for case, data in worst(topic, sample(topic, now_ns())).items():
        counted = feed(node, topic, data)
        assert counted >= 1 or case in readable, case


def _hostile(topic: str) -> st.SearchStrategy[bytes]:
    data = sample(topic, now_ns())
    words = range(len(ENCAPSULATION), len(data) - 3, 4)
    return st.one_of(
        st.binary(max_size=4096).map(lambda tail: ENCAPSULATION + tail),
        st.binary(max_size=4096).map(lambda tail: BIG_ENDIAN + tail),
        st.just(BIG_ENDIAN + data[len(ENCAPSULATION) :]),
        st.tuples(st.sampled_from(words), st.sampled_from(HUGE_COUNTS)).map(
            lambda at: with_count(data, *at)
        ),
        st.just(without_nul(topic, data)),
        st.tuples(st.integers(0, len(data) - 1), st.binary(min_size=1, max_size=512)).map(
            lambda cut: data[: cut[0]] + cut[1]
        ),
    )


@pytest.mark.parametrize(("kind", "topic"), CASES)
def test_hostile_bytes_never_escape_nor_stop_the_node(
    nodes: dict[str, PerceptionNode], kind: str, topic: str
) -> None:
    node = nodes[kind]

    @FUZZ
    @given(data=_hostile(topic))
    def fuzz(data: bytes) -> None:
        feed(node, topic, data)

    fuzz()
    read_again(node, topic)


def test_unreadable_stamps_tick_the_rate_check_only(nodes: dict[str, PerceptionNode]) -> None:
    node = nodes["tracker_node"]
    name = node.resolve_topic_name("detected_objects")
    ticks = node.diagnostics.topics[name]
    ticks.fold()
    freq, stamps = ticks.check.freq, ticks.check.stamp

    def stamp_state() -> tuple[bool, bool, float, float]:
        return stamps.deltas_valid, stamps.zero_seen, stamps.min_delta, stamps.max_delta

    count, before = freq.count, stamp_state()
    node.diagnostics.tick(name, None)
    node.diagnostics.tick(name, float("nan"))
    ticks.fold()
    assert freq.count == count + 2
    assert stamp_state() == before


@pytest.mark.parametrize("kind", ["pointcloud_node", "perception_pipeline"])
@pytest.mark.parametrize("sec", [-5, -(2**31), 0])
def test_a_cloud_stamped_before_1970_or_wrapped_is_an_outlier_stamp(
    nodes: dict[str, PerceptionNode], kind: str, sec: int
) -> None:
    node = nodes[kind]
    data = bytearray(sample("points", now_ns()))
    struct.pack_into("<iI", data, len(ENCAPSULATION), sec, 0)
    before = node.drops.snapshot()[OUTLIER_STAMP]
    assert feed(node, "points", bytes(data)) == 1
    assert node.drops.snapshot()[OUTLIER_STAMP] == before + 1
