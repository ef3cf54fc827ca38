"""The probe's deferred topics: taken only when asked for, stamped with their arrival."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from rclpy.publisher import Publisher
from sensor_msgs.msg import PointCloud2

from dynshape_perception.errors import DynshapeError
from dynshape_perception.io.objects import TrackStates, detected_objects, tracked_objects
from dynshape_perception.io.pointcloud2 import points_to_cloud
from dynshape_perception.nodes.messages import cloud_msg, header, time_msg
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.testing.probe import Probe, probe_session
from dynshape_perception.testing.processes import dds_settings_applied, domain_lease

pytestmark = pytest.mark.ros

WAIT_S = 10.0
STAMP_NS = 1_700_000_000_000_000_000
LATER_S = 0.3


@contextmanager
def _deferring_probe() -> Iterator[tuple[Probe, Publisher[Any]]]:
    """A probe that reads ``detected_objects`` later, and a writer of the tracked objects it
    reads at once."""
    with (
        domain_lease() as domain,
        dds_settings_applied(),
        probe_session(domain, deferred=("detected_objects",)) as probe,
    ):
        tracked_pub = probe.create_publisher(
            probe.readers["tracked_objects"].msg_type, "tracked_objects", 10
        )
        yield probe, tracked_pub


def _publish_no_tracks(tracked_pub: Publisher[Any]) -> None:
    none = TrackStates(
        np.zeros(0, TRACK_DTYPE), np.zeros((0, 16), np.uint8), np.zeros(0), np.zeros(0, int)
    )
    tracked_pub.publish(tracked_objects(STAMP_NS, "map", none, ObjectParams()))


def test_a_deferred_output_waits_for_read_deferred_and_keeps_its_arrival_time() -> None:
    with _deferring_probe() as (probe, tracked_pub):
        assert probe.spin_until(
            lambda: (
                probe.readers["detected_objects"].get_publisher_count() >= 1
                and tracked_pub.get_subscription_count() >= 1
            ),
            WAIT_S,
        )
        probe.detected_pub.publish(
            detected_objects(STAMP_NS, "base_link", np.zeros(0, OBSTACLE_DTYPE))
        )
        _publish_no_tracks(tracked_pub)
        assert probe.spin_until(lambda: STAMP_NS in probe.received["tracked_objects"], WAIT_S)
        probe.spin_for(LATER_S)
        assert STAMP_NS not in probe.received["detected_objects"], "read before it was asked for"
        asked_s = time.perf_counter()
        assert probe.read_deferred(lambda: STAMP_NS in probe.received["detected_objects"], WAIT_S)
        # Its time is the middleware's, from before the probe waited LATER_S, not the read's.
        assert probe.received["detected_objects"][STAMP_NS].t_s < asked_s - LATER_S


def test_only_object_topics_can_be_deferred() -> None:
    with pytest.raises(DynshapeError, match="only object topics"):
        Probe(deferred=("markers",))


def test_await_objects_serves_the_awaited_readers_alone() -> None:
    """Waiting for a frame's outputs wakes the probe for them only: a table that came first
    stays in the middleware until ``spin_until``, stamped on arrival all the same."""
    with _deferring_probe() as (probe, tracked_pub):
        table_pub = probe.create_publisher(PointCloud2, "tracks", 10)
        assert probe.spin_until(
            lambda: (
                tracked_pub.get_subscription_count() >= 1
                and table_pub.get_subscription_count() >= 1
            ),
            WAIT_S,
        )
        cloud = points_to_cloud(np.zeros((1, 4), np.float32))
        table_pub.publish(cloud_msg(cloud, header(time_msg(STAMP_NS), "map")))
        _publish_no_tracks(tracked_pub)
        tracked = probe.received["tracked_objects"]
        assert probe.await_objects(["tracked_objects"], lambda: STAMP_NS in tracked, WAIT_S)
        assert not probe.await_objects(["tracked_objects"], lambda: False, LATER_S)
        assert STAMP_NS not in probe.received["tracks"], "a table woke the wait for objects"
        asked_s = time.perf_counter()
        assert probe.spin_until(lambda: STAMP_NS in probe.received["tracks"], WAIT_S)
        assert probe.received["tracks"][STAMP_NS].t_s < asked_s - LATER_S
        for topics in (["tracks"], ["detected_objects"], ["tracked_objects", "markers"]):
            with pytest.raises(DynshapeError, match="only object topics the probe reads"):
                probe.await_objects(topics, lambda: True, WAIT_S)
