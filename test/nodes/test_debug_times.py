"""Debug timing topics: CDR bytes as rclpy and rosbags build them; a frame's times after it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.serialization import serialize_message
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from std_msgs.msg import Float64

from dynshape_perception.nodes.debug_times import (
    MAX_PENDING,
    DebugTimes,
    float64_bytes,
    float64_stamped_bytes,
    topic_names,
)
from dynshape_perception.testing.processes import leased_context

pytestmark = pytest.mark.ros

VALUES = (0.0, 1.25, -3.5e-7, 12345.678, float("inf"))
STAMPED = "autoware_internal_debug_msgs/msg/Float64Stamped"


@pytest.mark.parametrize("value", VALUES)
def test_float64_bytes_are_rclpys(value: float) -> None:
    assert float64_bytes(value) == bytes(serialize_message(Float64(data=value)))


@pytest.mark.parametrize("value", VALUES)
def test_float64_stamped_bytes_are_the_cdr_of_autowares_type(value: float) -> None:
    store = get_typestore(Stores.ROS2_JAZZY)
    store.register(get_types_from_msg("builtin_interfaces/Time stamp\nfloat64 data\n", STAMPED))
    time_type = store.types["builtin_interfaces/msg/Time"]
    msg = store.types[STAMPED](stamp=time_type(sec=1_700_000_123, nanosec=999_999_999), data=value)
    expected = bytes(store.serialize_cdr(msg, STAMPED))
    assert float64_stamped_bytes(1_700_000_123, 999_999_999, value) == expected


# -- publishing after a frame's work ------------------------------------------------------
WAIT_S = 10.0
QUIET_S = 0.3


@pytest.fixture
def wired() -> Iterator[tuple[Node, SingleThreadedExecutor, list[float], list[float]]]:
    """A node to publish times, spun with a reader of its segment times (processing,
    cyclic) once both topics are matched."""
    with leased_context() as context:
        node = Node("debug_times_deferred", context=context)
        reader = Node("debug_times_deferred_reader", context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        executor.add_node(reader)
        processing: list[float] = []
        cyclic: list[float] = []
        for topic, into in zip(topic_names("segment"), (processing, cyclic), strict=True):
            reader.create_subscription(
                Float64, f"/debug_times_deferred/{topic[2:]}", partial(_keep, into), 100
            )
        try:
            yield node, executor, processing, cyclic
        finally:
            executor.shutdown()
            reader.destroy_node()
            node.destroy_node()


def _keep(into: list[float], msg: Float64) -> None:
    into.append(msg.data)


def _spin(executor: SingleThreadedExecutor, until: Callable[[], bool], timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while not until() and time.monotonic() < end:
        executor.spin_once(timeout_sec=0.02)
    return until()


@contextmanager
def _matched(wired: Any, busy: Callable[[], bool]) -> Iterator[DebugTimes]:
    """Times with the segment topics' publishers made and matched by the reader."""
    _, executor, _, _ = wired
    times = DebugTimes(wired[0], busy)
    try:
        pair = times._pair("segment")
        assert _spin(executor, lambda: all(p.get_subscription_count() for p in pair), WAIT_S)
        yield times
    finally:
        times.close()


def test_times_recorded_during_a_frame_go_out_once_its_work_ends(wired: Any) -> None:
    _, executor, processing, cyclic = wired
    busy = [True]
    with _matched(wired, lambda: busy[0]) as times:
        times.record({"segment": 2.5})
        times.record({"segment": 3.5})
        _spin(executor, lambda: bool(processing), QUIET_S)
        assert processing == [] and cyclic == []
        busy[0] = False
        times.work_ended()
        assert _spin(executor, lambda: len(processing) == 2 and len(cyclic) == 1, WAIT_S)
        assert processing == [2.5, 3.5]
        # Taken when recorded, not when published.
        assert 0.0 <= cyclic[0] < QUIET_S * 1000.0


def test_a_frames_last_output_takes_its_held_times_out_with_it(wired: Any) -> None:
    _, executor, processing, _ = wired
    with _matched(wired, lambda: True) as times:
        times.record({"segment": 1.0})
        _spin(executor, lambda: bool(processing), QUIET_S)
        assert processing == []
        # Still busy (the lane that flushes holds the frame's work), and no end signalled.
        times.record({"segment": 2.0}, flush=True)
        assert _spin(executor, lambda: len(processing) == 2, WAIT_S)
        assert processing == [1.0, 2.0]


def test_a_node_busy_frame_after_frame_still_publishes_a_bounded_number_late(
    wired: Any,
) -> None:
    _, executor, processing, _ = wired
    with _matched(wired, lambda: True) as times:
        for k in range(MAX_PENDING):
            times.record({"segment": float(k)})
        assert _spin(executor, lambda: len(processing) == MAX_PENDING, WAIT_S)
        assert processing == [float(k) for k in range(MAX_PENDING)]


def test_a_recording_outside_a_frame_publishes_at_once(wired: Any) -> None:
    _, executor, processing, _ = wired
    with _matched(wired, lambda: False) as times:
        times.record({"segment": 1.5})
        # No end of work was signalled: the publish came from record itself.
        assert _spin(executor, lambda: processing == [1.5], WAIT_S)


def test_times_closed_before_the_work_ends_are_dropped_quietly(wired: Any) -> None:
    _, executor, processing, _ = wired
    with _matched(wired, lambda: True) as times:
        times.record({"segment": 4.5})
        times.close()
        times.work_ended()
        times.flush()
        _spin(executor, lambda: bool(processing), QUIET_S)
        assert processing == []
