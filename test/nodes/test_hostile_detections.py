"""Hostile bytes on tracker_node's vision_msgs input, in process through its real callback."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynshape_perception.io.cdr import ENCAPSULATION
from dynshape_perception.nodes.base import BAD_MESSAGE, INTERNAL_ERROR, PerceptionNode
from dynshape_perception.nodes.tracker_node import TrackerNode
from dynshape_perception.testing.hostile import (
    HUGE_COUNTS,
    callback_of,
    nodes_in_process,
    sample,
    with_count,
    worst,
)

pytestmark = pytest.mark.ros

TOPIC = "detections"
# What may still be a message: trailing bytes, and a string Fast CDR reads by its length.
READABLE = ("valid prefix, garbage tail", "frame_id without NUL")


@pytest.fixture(scope="module")
def tracker() -> Iterator[PerceptionNode]:
    overrides = {"jit.mode": "off", "tracker.input_type": "vision_msgs"}
    with nodes_in_process((TrackerNode,), overrides) as made:
        yield made["tracker_node"]


def feed(node: PerceptionNode, data: bytes) -> int:
    before = node.drops.total
    callback_of(node, TOPIC)(data)
    assert node.drops.snapshot()[INTERNAL_ERROR] == 0, node.internal_errors.last
    return node.drops.total - before


def test_truncations_and_the_worst_bytes_are_counted_drops(tracker: PerceptionNode) -> None:
    data = sample(TOPIC, time.time_ns())
    for n in range(len(data)):
        assert feed(tracker, data[:n]) >= 1, n
    bad = tracker.drops.snapshot()[BAD_MESSAGE]
    for case, hostile in worst(TOPIC, data).items():
        assert feed(tracker, hostile) >= 1 or case in READABLE, case
    assert tracker.drops.snapshot()[BAD_MESSAGE] > bad


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tail=st.binary(max_size=4096),
    at=st.integers(0, 300),
    count=st.sampled_from(HUGE_COUNTS),
)
def test_hostile_detections_never_escape(
    tracker: PerceptionNode, tail: bytes, at: int, count: int
) -> None:
    data = sample(TOPIC, time.time_ns())
    feed(tracker, ENCAPSULATION + tail)
    feed(tracker, with_count(data, len(ENCAPSULATION) + 4 * at, count))
    frames_out = tracker.counters["frames_out"]
    callback_of(tracker, TOPIC)(sample(TOPIC, time.time_ns()))
    assert tracker.counters["frames_out"] == frames_out + 1
