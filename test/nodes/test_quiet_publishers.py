"""The nodes' own publishers carry no QoS event handlers, and still deliver over DDS."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rclpy.context import Context
from rclpy.event_handler import EventHandler
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile
from std_msgs.msg import Float64

from dynshape_perception.nodes.debug_times import DebugTimes, topic_names
from dynshape_perception.nodes.outputs import quiet_publisher
from dynshape_perception.testing.processes import leased_context

pytestmark = pytest.mark.ros


@pytest.fixture
def context() -> Iterator[Context]:
    with leased_context() as ctx:
        yield ctx


def _handlers(node: Node) -> int:
    return sum(isinstance(w, EventHandler) for w in node.waitables)


def test_a_quiet_publisher_adds_no_waitable_where_rclpys_adds_two(context: Context) -> None:
    node = Node("quiet_publisher_test", context=context)
    try:
        before = _handlers(node)
        quiet = quiet_publisher(node, Float64, "quiet", QoSProfile(depth=1))
        assert quiet.event_handlers == [] and _handlers(node) == before
        node.create_publisher(Float64, "plain", QoSProfile(depth=1))
        assert _handlers(node) == before + 2
    finally:
        node.destroy_node()


def test_debug_times_publish_through_quiet_publishers(context: Context) -> None:
    node = Node("debug_times_test", context=context)
    reader = Node("debug_times_reader", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(reader)
    got: list[float] = []
    processing, _ = topic_names("segment")
    reader.create_subscription(
        Float64, f"/debug_times_test/{processing[2:]}", lambda m: got.append(m.data), 10
    )
    times = DebugTimes(node)
    try:
        before = _handlers(node)
        for _ in range(100):
            times.record({"segment": 2.5})
            executor.spin_once(timeout_sec=0.05)
            if got:
                break
        assert got and got[0] == 2.5
        assert len(times._publishers["segment"]) == 2 and _handlers(node) == before
    finally:
        times.close()
        executor.shutdown()
        reader.destroy_node()
        node.destroy_node()
