"""A lidar mount from /tf_static over real DDS: the real KITTI scan, sent in an Ouster-like
organised layout from a lidar yawed 90 degrees and 1.8 m up, gives DetectedObjects in base_link
where the same scan from an unrotated lidar gives them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from dynshape_perception.io.pointcloud2 import CloudData, encode_cloud
from dynshape_perception.perception.transforms import planar, transform_points
from dynshape_perception.testing.probe import Probe
from dynshape_perception.testing.processes import NodeProcess

pytestmark = pytest.mark.ros

STARTUP_S = 120.0
TIMEOUT_S = 30.0
MOUNT_HEIGHT_M = 1.8
YAWED, LEVEL = "lidar_yawed", "lidar_level"
BEAMS = 64
TOLERANCE_M = 0.1
# An Ouster driver's point: x, y, z, 4 bytes pad, intensity, time, reflectivity, ring,
# ambient, range; 48 bytes a point with its trailing pad.
OUSTER = np.dtype(
    {
        "names": ["x", "y", "z", "intensity", "t", "reflectivity", "ring", "ambient", "range"],
        "formats": ["<f4", "<f4", "<f4", "<f4", "<u4", "<u2", "<u2", "<u2", "<u4"],
        "offsets": [0, 4, 8, 16, 20, 24, 26, 28, 32],
        "itemsize": 48,
    }
)


def ouster_cloud(points: np.ndarray, no_returns: int) -> CloudData:
    """The scan as an organised cloud of ``BEAMS`` rows, padded with no-returns (0, 0, 0)."""
    rows = BEAMS * math.ceil((points.shape[0] + no_returns) / BEAMS)
    table = np.zeros(rows, OUSTER)
    n = points.shape[0]
    for i, name in enumerate(("x", "y", "z", "intensity")):
        table[name][:n] = points[:, i]
    table["ring"] = np.arange(rows) % BEAMS
    table["range"][:n] = (np.linalg.norm(points[:, :3], axis=1) * 1000).astype(np.uint32)
    return encode_cloud(table, height=BEAMS, is_dense=False)


@pytest.fixture(scope="module")
def lidar_node(
    node_overrides: dict[str, bool | int | float | str],
    tmp_path_factory: pytest.TempPathFactory,
    node_with_probe: Callable[..., AbstractContextManager[tuple[NodeProcess, Probe]]],
) -> Iterator[tuple[NodeProcess, Probe]]:
    folder = tmp_path_factory.mktemp("tf_mount")
    graph: tuple[dict[str, int], dict[str, int]] = ({"points": 1, "/tf_static": 1}, {})
    with node_with_probe("pointcloud_node", folder, node_overrides, graph, STARTUP_S) as running:
        yield running


def _objects(probe: Probe, cloud: CloudData, ns: int, frame: str) -> np.ndarray:
    """Publish until this stamp's DetectedObjects come back (discovery may lose the first)."""
    for attempt in range(5):
        stamp = ns + attempt
        probe.publish_cloud(cloud, stamp, frame)

        def answered(stamp: int = stamp) -> bool:
            return stamp in probe.received["detected_objects"]

        if probe.spin_until(answered, TIMEOUT_S):
            item = probe.received["detected_objects"][stamp]
            assert item.frame_id == "base_link" and item.table is not None, item.error
            return item.table
    raise AssertionError(f"no detected objects from {frame}")


def test_objects_from_a_yawed_raised_lidar_match_an_unrotated_one(
    lidar_node: tuple[NodeProcess, Probe], kitti_points: np.ndarray
) -> None:
    proc, probe = lidar_node
    yawed_mount = planar(0.0, 0.0, math.pi / 2, z=MOUNT_HEIGHT_M)
    level_mount = planar(0.0, 0.0, 0.0, z=MOUNT_HEIGHT_M)
    probe.publish_transforms(
        [("base_link", YAWED, yawed_mount), ("base_link", LEVEL, level_mount)], static=True
    )
    # Latched: the node's listener has them before any cloud.
    probe.spin_for(1.0)
    no_returns = 300
    # The same returns, in the yawed lidar's own frame: turned back by its 90 degrees.
    in_yawed = transform_points(np.linalg.inv(yawed_mount) @ level_mount, kitti_points)
    yawed = _objects(probe, ouster_cloud(in_yawed, no_returns), 10_000_000_000, YAWED)
    level = _objects(probe, ouster_cloud(kitti_points, no_returns), 20_000_000_000, LEVEL)
    assert level.shape[0] >= 10, "the real scan holds cars, walls and poles"
    assert yawed.shape[0] == level.shape[0]
    centres = [np.c_[t["x"], t["y"], t["z"]].astype(np.float64) for t in (yawed, level)]
    dist = np.linalg.norm(centres[0][:, None] - centres[1][None], axis=2)
    rows, cols = linear_sum_assignment(dist)
    assert dist[rows, cols].max() < TOLERANCE_M
    # In base_link the road lies near z = 0 (the lidar 1.8 m up), not 1.8 m below the origin.
    assert np.median(centres[1][:, 2]) > -0.5
    # Unmounted, the yawed scan's objects would lie 90 degrees round: far from these.
    turned = transform_points(planar(yaw=-math.pi / 2), centres[1])
    assert np.linalg.norm(turned - centres[1], axis=1).max() > 1.0
    probe.spin_for(1.0)
    status = probe.status("pointcloud_node")
    assert status is not None and status.values["mount"].endswith("from TF")
    assert "mount_* parameters" not in proc.log()
    assert int(status.values["points_no_return_removed"]) >= 2 * no_returns
