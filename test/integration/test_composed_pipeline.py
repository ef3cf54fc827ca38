"""The composed perception_pipeline process: static sensor first, then odometry, bad input, exit."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import count

import numpy as np
import psutil
import pytest

from dynshape_perception import parameters
from dynshape_perception.io.pointcloud2 import points_to_cloud
from dynshape_perception.io.tables_reader import read_table
from dynshape_perception.nodes.base import MARKERS_UNREAD, NO_ODOMETRY
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.perception.records import OBSTACLE_DTYPE
from dynshape_perception.scheduling.executor import DROP_REASONS
from dynshape_perception.testing.probe import Diagnostics
from dynshape_perception.testing.session import (
    DETECTED,
    OUTPUTS,
    PREDICTED,
    TRACKED,
    NodeSession,
    node_session,
)

pytestmark = pytest.mark.ros

TIMEOUT_S = 15.0
FIRST_FRAME_TIMEOUT_S = 120.0
EGO_SPEED_MPS = 2.0
FIRST_NS = 50_000_000_000
STEP_NS = 100_000_000
NODE = "perception_pipeline"
TIER_NAMES = {"1": "collision", "2": "planning", "3": "comfort", "4": "best_effort"}
# Deadlines no frame can meet (a ground-plane fit alone takes longer), and the share of
# the far field kept while degraded.
UNREACHABLE_MS = 0.1
# The debug tables the tests read come as messages of their own, after the standard outputs
# or before them: a frame is complete when all have arrived.
FRAME_TOPICS = (*OUTPUTS, "near_objects", "near_obstacles", "obstacles", "tracks", "predictions")
DEGRADED_KEEP = 0.5
HELD_S = 600.0
# Stamps after those of the tests above (their last is FIRST_NS + 201 steps).
_later = count(300)


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
        # The session's first frame may still wait for the node's generic builds to load.
        timeout_s = FIRST_FRAME_TIMEOUT_S if ns == stamps[0] else TIMEOUT_S
        timing = session.frame(kitti_points, ns, None, timeout_s, FRAME_TOPICS)
        assert all(v is not None for v in timing.after_publish_ms.values()), timing
    got = session.probe.received
    # No TF and no odometry: the vehicle stands still in its own frame.
    assert got["tracks"][stamps[3]].frame_id == "base_link"
    assert got[TRACKED][stamps[3]].frame_id == "base_link"
    assert got["obstacles"][stamps[3]].frame_id == "base_link"
    session.probe.spin_for(0.5)
    status = session.probe.status("perception_pipeline")
    assert status is not None and status.values["odometry"] == NO_ODOMETRY
    assert status.level == 1 and "static sensor assumed" in status.message
    assert session.processes[0].log().count("static sensor assumed") == 1

    for ns in stamps[4:]:
        t_s = ns / 1e9
        pose = Pose2D(EGO_SPEED_MPS * t_s)
        timing = session.frame(kitti_points, ns, pose, TIMEOUT_S, FRAME_TOPICS)
        assert timing.after_publish_ms[PREDICTED] is not None
    last = stamps[-1]
    assert got["tracks"][last].frame_id == got["predictions"][last].frame_id == "odom"
    assert got[TRACKED][last].frame_id == got[PREDICTED][last].frame_id == "odom"
    assert got["obstacles"][last].frame_id == got[DETECTED][last].frame_id == "base_link"
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
    assert timing.after_publish_ms[PREDICTED] is not None
    assert base not in session.probe.received["obstacles"]
    key = f"drops.{reason}"
    assert session.probe.spin_until(
        lambda: (
            (s := session.probe.status("perception_pipeline")) is not None and s.values[key] == "1"
        ),
        TIMEOUT_S,
    )


def _frames(session: NodeSession, points: np.ndarray, count: int) -> list[int]:
    """``count`` frames after every stamp the tests above sent; their stamps."""
    stamps = []
    for _ in range(count):
        ns = FIRST_NS + next(_later) * STEP_NS
        pose = Pose2D(EGO_SPEED_MPS * ns / 1e9)
        timing = session.frame(points, ns, pose, TIMEOUT_S, FRAME_TOPICS)
        assert timing.after_publish_ms["markers"] is not None, timing
        stamps.append(ns)
    return stamps


def _watch(session: NodeSession, condition: Callable[[Diagnostics], bool]) -> list[Diagnostics]:
    """Every status of the node, as each arrives, until one meets ``condition`` (the last)."""
    seen: list[Diagnostics] = []

    def check() -> bool:
        status = session.probe.status(NODE)
        if status is not None and (not seen or seen[-1] is not status):
            seen.append(status)
        return bool(seen) and condition(seen[-1])

    assert session.probe.spin_until(check, TIMEOUT_S), seen[-1:]
    return seen


def test_every_tier_reports_in_diagnostics_and_the_near_field_answers_every_scan(
    session: NodeSession, kitti_points: np.ndarray
) -> None:
    stamps = _frames(session, kitti_points, 3)
    got = session.probe.received
    # Not which of a scan's near and full outputs arrives first: tier 1 runs on a lane of
    # its own with the earlier deadline, and on a loaded host the two lanes race.
    # `bench deadlines` and `bench e2e` measure the tiers' latencies.
    for ns in stamps:
        near, full = got["near_obstacles"][ns], got["obstacles"][ns]
        assert near.frame_id == full.frame_id == got["near_objects"][ns].frame_id == "base_link"
        assert read_table(near.msg).dtype.names == OBSTACLE_DTYPE.names
        assert near.table is not None and near.table.shape[0] <= full.msg.width
    values = _watch(
        session, lambda s: int(s.values.get("tier4.best_effort.completed", 0)) >= len(stamps)
    )[-1].values
    specs = parameters.node_specs(NODE)
    for key, name in TIER_NAMES.items():
        prefix = f"tier{key}.{name}"
        deadline = specs[f"tiers.{name}_deadline_ms"].default
        assert float(values[f"{prefix}.deadline_ms"]) == deadline
        assert int(values[f"{prefix}.completed"]) >= len(stamps)
        for counter in ("misses", "dropped", "failed", "queued"):
            assert int(values[f"{prefix}.{counter}"]) >= 0
        for reason in DROP_REASONS:
            assert int(values[f"{prefix}.dropped.{reason}"]) >= 0
        assert float(values[f"{prefix}.p99_ms"]) > 0.0
    assert float(values["transport.points.p99_ms"]) > 0.0
    assert int(values["near_field_out"]) >= len(stamps)
    assert values["executor.far_field_keep_fraction"] == "1.0"


def test_markers_nobody_reads_are_not_built(session: NodeSession, kitti_points: np.ndarray) -> None:
    before = _watch(session, lambda s: MARKERS_UNREAD in s.values)[-1]
    unread = int(before.values[MARKERS_UNREAD])
    session.probe.read_markers(False)
    try:
        assert session.probe.spin_until(
            lambda: session.probe.count_subscribers("markers") == 0, TIMEOUT_S
        )
        topics = tuple(t for t in FRAME_TOPICS if t != "markers")
        for _ in range(3):
            ns = FIRST_NS + next(_later) * STEP_NS
            pose = Pose2D(EGO_SPEED_MPS * ns / 1e9)
            timing = session.frame(kitti_points, ns, pose, TIMEOUT_S, topics)
            assert timing.after_publish_ms[PREDICTED] is not None, timing
        _watch(session, lambda s: int(s.values[MARKERS_UNREAD]) >= unread + 3)
    finally:
        session.probe.read_markers(True)
        assert session.probe.wait_for_graph({}, {"markers": 1}, TIMEOUT_S)
    _frames(session, kitti_points, 1)


def _tier2_lost(status: Diagnostics) -> int:
    values = status.values
    return int(values["tier2.planning.misses"]) + int(values["tier2.planning.dropped"])


def test_tier_deadlines_change_live_and_bad_values_are_refused(
    session: NodeSession,
    kitti_points: np.ndarray,
    node_overrides: dict[str, bool | int | float | str],
) -> None:
    probe = session.probe
    names = set(probe.remote_parameter_names(NODE, TIMEOUT_S))
    library = parameters.BUILTIN_PARAMETERS | parameters.LIBRARY_PARAMETERS
    assert names - library == set(parameters.node_specs(NODE))
    before = probe.status(NODE)
    assert before is not None
    # A frame's tier-2 work that misses its deadline is counted as a miss; one refused or
    # superseded while the frame before still runs (as under load) is counted as a drop.
    lost = _tier2_lost(before)
    subsampled = int(before.values["frames_far_field_subsampled"])
    # Set one at a time, in this order, each is checked against the others: tier 1
    # first, so that no tier's deadline is ever shorter than the one above it.
    # Degraded mode held for longer than the test runs: however long the first frame takes
    # to come back, the second one still finds it on.
    overload = {
        "tiers.collision_deadline_ms": UNREACHABLE_MS,
        "tiers.planning_deadline_ms": UNREACHABLE_MS,
        "tiers.far_field_keep_fraction": DEGRADED_KEEP,
        "tiers.degrade_hold_s": HELD_S,
    }
    assert all(r.successful for r in probe.set_remote_parameters(NODE, overload, TIMEOUT_S))
    _frames(session, kitti_points, 2)
    # The first frame misses both deadlines, so the second runs degraded; neither frame's
    # tier 2 can finish in time, so both are lost, each counted once.
    seen = _watch(
        session,
        lambda s: (
            s.values["tier2.planning.deadline_ms"] == str(UNREACHABLE_MS)
            and _tier2_lost(s) >= lost + 2
            and int(s.values["frames_far_field_subsampled"]) >= subsampled + 1
        ),
    )
    assert seen[-1].values["executor.far_field_keep_fraction"] == str(DEGRADED_KEEP)
    assert any(s.level == 2 and "tier 1 missed" in s.message for s in seen)

    specs = parameters.node_specs(NODE)
    restore = {
        "tiers.planning_deadline_ms": specs["tiers.planning_deadline_ms"].default,
        "tiers.collision_deadline_ms": specs["tiers.collision_deadline_ms"].default,
        "tiers.far_field_keep_fraction": node_overrides["tiers.far_field_keep_fraction"],
        "tiers.degrade_hold_s": specs["tiers.degrade_hold_s"].default,
    }
    assert all(r.successful for r in probe.set_remote_parameters(NODE, restore, TIMEOUT_S))
    refused = {
        "tiers.collision_deadline_ms": (500.0, "must not decrease"),
        "tiers.degrade_exit_backlog_ms": (500.0, "must not exceed"),
        "tiers.far_field_keep_fraction": (0.0, "out of range"),
        "tiers.max_queue_depth": (2.5, "type"),
        "executor.shared_workers": (2, "read-only"),
    }
    for name, (value, reason) in refused.items():
        result = probe.set_remote_parameters(NODE, {name: value}, TIMEOUT_S)[0]
        assert not result.successful and reason in result.reason, (name, result.reason)
    # Back to the defaults, and a period without tier-1 misses is no longer an error.
    default_ms = specs["tiers.collision_deadline_ms"].default
    _watch(
        session,
        lambda s: float(s.values["tier1.collision.deadline_ms"]) == default_ms and s.level < 2,
    )


def test_sigterm_exits_0(
    session: NodeSession, wait_gone: Callable[[list[int], float], list[int]]
) -> None:
    proc = session.processes[0]
    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert proc.stop(signal.SIGTERM) == 0, proc.log()[-1000:]
    assert wait_gone(children, TIMEOUT_S) == []
