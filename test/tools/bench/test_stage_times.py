"""The bench's stage times: a frame is complete once every stage a node sends has come in."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from rclpy.publisher import Publisher

from dynshape_perception.nodes.debug_times import message_type, topic_names
from dynshape_perception.testing.probe import Probe, probe_session
from dynshape_perception.testing.processes import dds_settings_applied, domain_lease
from dynshape_perception.testing.stage_times import StageTimes

pytestmark = pytest.mark.ros

WAIT_S = 10.0


@contextmanager
def wired(stage: str) -> Iterator[tuple[Probe, StageTimes, Publisher, Publisher, list[float]]]:
    """A probe reading ``node``'s ``stage`` and total times, the two publishers of those
    times once both are matched, and the totals as a second subscriber sees them."""
    with domain_lease() as domain, dds_settings_applied(), probe_session(domain) as probe:
        times = StageTimes(probe, {"node": (stage, "total")})
        stage_pub, total_pub = (
            probe.create_publisher(message_type(), "/node" + topic_names(s)[0][1:], 10)
            for s in (stage, "total")
        )
        totals: list[float] = []
        probe.create_subscription(
            message_type(),
            "/node" + topic_names("total")[0][1:],
            lambda m: totals.append(m.data),
            10,
        )
        assert probe.spin_until(
            lambda: (
                stage_pub.get_subscription_count() >= 1 and total_pub.get_subscription_count() >= 2
            ),
            WAIT_S,
        )
        try:
            yield probe, times, stage_pub, total_pub, totals
        finally:
            times.close()


def test_a_stage_that_comes_after_the_total_stays_in_its_frame() -> None:
    with wired("cluster") as (probe, times, cluster, total, totals):
        cluster.publish(message_type()(data=1.0))
        total.publish(message_type()(data=2.0))
        # The probe's spinning leaves them to the times' own executor.
        assert probe.spin_until(lambda: len(totals) == 1, WAIT_S)
        assert not times.complete(["node"])
        assert times.spin_until(lambda: times.complete(["node"]), WAIT_S)
        assert times.take() == {"node": {"cluster": 1.0, "total": 2.0}}
        # The next frame's total first, its cluster time after it.
        total.publish(message_type()(data=4.0))
        assert probe.spin_until(lambda: len(totals) == 2, WAIT_S)
        times.spin_until(lambda: False, 0.5)
        assert not times.complete(["node"])
        cluster.publish(message_type()(data=3.0))
        assert times.spin_until(lambda: times.complete(["node"]), WAIT_S)
        assert times.take() == {"node": {"cluster": 3.0, "total": 4.0}}


def test_a_warm_up_frame_waits_for_stages_never_seen() -> None:
    with wired("segment") as (probe, times, segment, total, totals):
        # The first frame's total before its segment time: only a warm-up wait holds out.
        total.publish(message_type()(data=2.0))
        assert probe.spin_until(lambda: len(totals) == 1, WAIT_S)
        assert times.spin_until(lambda: times.complete(["node"]), WAIT_S)
        assert not times.complete(["node"], every_stage=True)
        segment.publish(message_type()(data=1.0))
        assert times.spin_until(lambda: times.complete(["node"], every_stage=True), WAIT_S)
        assert times.take() == {"node": {"segment": 1.0, "total": 2.0}}
