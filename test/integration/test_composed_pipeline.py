"""The composed perception_pipeline process: static sensor first, then odometry, bad input, exit."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import psutil
import pytest

from dynshape_perception.core.io.pointcloud2 import points_to_cloud
from dynshape_perception.core.perception.pipeline import Pose2D
from dynshape_perception.nodes.base import NO_ODOMETRY
from dynshape_perception.nodes.session import NodeSession, node_session

TIMEOUT_S = 15.0
EGO_SPEED_MPS = 2.0
FIRST_NS = 50_000_000_000
STEP_NS = 100_000_000


@pytest.fixture(scope="module")
def session(
    node_overrides: dict[str, bool | int | float | str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[NodeSession]:
    logs = tmp_path_factory.mktemp("composed_logs")
    with node_session("composed", overrides=node_overrides, log_dir=logs) as running:
        yield running


def test_static_sensor_then_odometry(session: NodeSession, kitti_points: np.ndarray) -> None:
    stamps = [FIRST_NS + k * STEP_NS for k in range(10)]
    for ns in stamps[:4]:
        timing = session.frame(kitti_points, ns, None, TIMEOUT_S)
        assert all(v is not None for v in timing.after_publish_ms.values()), timing
    got = session.probe.received
    assert got["tracks"][stamps[3]].frame_id == "lidar"
    assert got["obstacles"][stamps[3]].frame_id == "lidar"
    session.probe.spin_for(0.5)
    status = session.probe.status("perception_pipeline")
    assert status is not None and status.values["odometry"] == NO_ODOMETRY
    assert status.level == 1 and "static sensor assumed" in status.message
    assert session.processes[0].log().count("static sensor assumed") == 1

    for ns in stamps[4:]:
        t_s = ns / 1e9
        timing = session.frame(kitti_points, ns, Pose2D(EGO_SPEED_MPS * t_s), TIMEOUT_S)
        assert timing.after_publish_ms["predictions"] is not None
    last = stamps[-1]
    assert got["tracks"][last].frame_id == got["predictions"][last].frame_id == "odom"
    assert got["obstacles"][last].frame_id == "lidar"
    tracks = got["tracks"][last].table
    assert tracks is not None and tracks.shape[0] > 0
    np.testing.assert_allclose(np.median(tracks["vx"]), EGO_SPEED_MPS, atol=0.1)
    assert "state reset" in session.processes[0].log()
    session.probe.spin_for(0.5)
    status = session.probe.status("perception_pipeline")
    assert status is not None and status.values["odometry"] == "ok (frame odom)"


@pytest.mark.parametrize("reason", ["non_finite", "missing_fields"])
def test_bad_cloud_then_valid(session: NodeSession, kitti_points: np.ndarray, reason: str) -> None:
    good = points_to_cloud(kitti_points)
    if reason == "non_finite":
        holes = kitti_points.copy()
        holes[0, 0] = np.inf
        bad = points_to_cloud(holes, is_dense=True)
    else:
        bad = replace(good, fields=good.fields[:2])
    base = FIRST_NS + (100 if reason == "non_finite" else 200) * STEP_NS
    session.probe.publish_cloud(bad, base)
    timing = session.frame(good, base + STEP_NS, Pose2D(EGO_SPEED_MPS * base / 1e9), TIMEOUT_S)
    assert timing.after_publish_ms["predictions"] is not None
    assert base not in session.probe.received["obstacles"]
    key = f"drops.{reason}"
    assert session.probe.spin_until(
        lambda: (
            (s := session.probe.status("perception_pipeline")) is not None and s.values[key] == "1"
        ),
        TIMEOUT_S,
    )


def test_sigterm_exits_0(
    session: NodeSession, wait_gone: Callable[[list[int], float], list[int]]
) -> None:
    proc = session.processes[0]
    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert proc.stop(signal.SIGTERM) == 0, proc.log()[-1000:]
    assert wait_gone(children, TIMEOUT_S) == []
