"""A scan cropped to nothing still gives its outputs, counted, and the input task warns."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from rclpy.serialization import serialize_message

from dynshape_perception.io.pointcloud2 import points_to_cloud
from dynshape_perception.nodes.base import PerceptionNode
from dynshape_perception.nodes.messages import cloud_msg, header, time_msg
from dynshape_perception.nodes.perception_pipeline import PerceptionPipelineNode
from dynshape_perception.nodes.pointcloud_node import PointcloudNode
from dynshape_perception.nodes.segmenting import EMPTY_AFTER_CROP
from dynshape_perception.testing.hostile import callback_of, nodes_in_process

pytestmark = pytest.mark.ros

WAIT_S = 60.0


@pytest.fixture(scope="module")
def nodes() -> Iterator[dict[str, PerceptionNode]]:
    overrides: dict[str, bool | int | float | str] = {
        "jit.mode": "off",
        "tiers.shed_expired": False,
        "tiers.shed_infeasible": False,
    }
    with nodes_in_process((PointcloudNode, PerceptionPipelineNode), overrides) as made:
        yield made


def _cloud(x_m: float) -> bytes:
    """A patch of points at ``x_m`` ahead, stamped now."""
    x, y = np.meshgrid(np.linspace(x_m, x_m + 5.0, 20), np.linspace(-3.0, 3.0, 20))
    points = np.stack([x.ravel(), y.ravel(), np.zeros(x.size), np.full(x.size, 0.3)], axis=1)
    msg = cloud_msg(
        points_to_cloud(points.astype(np.float32)), header(time_msg(time.time_ns()), "base_link")
    )
    return bytes(serialize_message(msg))


def _wait(condition: object, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("kind", ["pointcloud_node", "perception_pipeline"])
def test_an_empty_scan_after_cropping_publishes_empty_outputs_counted_and_warned(
    nodes: dict[str, PerceptionNode], kind: str
) -> None:
    node = nodes[kind]
    node._report_input()
    frames_out = node.counters["frames_out"]
    # Far beyond the region of interest (scan.roi_x_max_m, 60 m): every point is cropped.
    callback_of(node, "points")(_cloud(500.0))
    assert node.counters[EMPTY_AFTER_CROP] == 1
    assert _wait(lambda: node.counters["frames_out"] == frames_out + 1)
    level, problems, values = node._report_input()
    assert level == 1 and any("none left after cropping" in p for p in problems), problems
    assert values[EMPTY_AFTER_CROP] == 1
    assert node.drops.total == 0, node.drops.snapshot()
    # A scan with points again: the warning goes.
    callback_of(node, "points")(_cloud(10.0))
    assert _wait(lambda: node.counters["frames_out"] == frames_out + 2)
    assert node._report_input()[0] == 0, node._report_input()
