"""perception_pipeline takes sector clouds sharing their revolution's stamp, as pointcloud_node."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from rclpy.serialization import serialize_message

from dynshape_perception.io.pointcloud2 import points_to_cloud
from dynshape_perception.nodes.base import STALE_STAMP, PerceptionNode
from dynshape_perception.nodes.messages import cloud_msg, header, time_msg
from dynshape_perception.nodes.perception_pipeline import PerceptionPipelineNode
from dynshape_perception.nodes.pointcloud_node import PointcloudNode
from dynshape_perception.testing.hostile import callback_of, nodes_in_process

pytestmark = pytest.mark.ros

SECTORS = 4
WAIT_S = 60.0


@pytest.fixture(scope="module")
def nodes() -> Iterator[dict[str, PerceptionNode]]:
    overrides: dict[str, bool | int | float | str] = {
        "jit.mode": "off",
        "points.sectors_per_revolution": SECTORS,
        "tiers.shed_expired": False,
        "tiers.shed_infeasible": False,
    }
    with nodes_in_process((PointcloudNode, PerceptionPipelineNode), overrides) as made:
        yield made


def _sectors(ns: int) -> list[bytes]:
    """One clockwise revolution as four quadrant clouds (a ring 10 m out), all stamped ``ns``."""
    out = []
    for k in reversed(range(SECTORS)):
        azimuth = np.linspace(k * np.pi / 2, (k + 1) * np.pi / 2, 90, endpoint=False) - np.pi
        points = np.stack(
            [10 * np.cos(azimuth), 10 * np.sin(azimuth), np.zeros(90), np.full(90, 0.3)], axis=1
        )
        cloud = points_to_cloud(points.astype(np.float32))
        out.append(bytes(serialize_message(cloud_msg(cloud, header(time_msg(ns), "base_link")))))
    return out


@pytest.mark.parametrize("kind", ["pointcloud_node", "perception_pipeline"])
def test_sectors_sharing_a_stamp_complete_a_revolution(
    nodes: dict[str, PerceptionNode], kind: str
) -> None:
    node = nodes[kind]
    frames_out = node.counters["frames_out"]
    for sector in _sectors(time.time_ns()):
        callback_of(node, "points")(sector)
    deadline = time.monotonic() + WAIT_S
    while node.counters["frames_out"] == frames_out and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node.counters["frames_out"] == frames_out + 1, node.drops.snapshot()
    assert node.drops.snapshot().get(STALE_STAMP, 0) == 0
    sectors = node.tiers.sectors.counters  # type: ignore[attr-defined]
    assert sectors.revolutions == 1 and sectors.incomplete_revolutions == 0
