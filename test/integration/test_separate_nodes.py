"""The three node executables as separate processes over real DDS: data, bad input, params, exit."""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import yaml
from autoware_perception_msgs.msg import DetectedObjects
from rclpy.serialization import deserialize_message, serialize_message

from dynshape_perception import parameters
from dynshape_perception.config import default_config
from dynshape_perception.io.objects import detected_objects
from dynshape_perception.io.pointcloud2 import (
    FLOAT64,
    REASONS,
    CloudData,
    FieldSpec,
    encode_cloud,
    points_to_cloud,
)
from dynshape_perception.io.tables_reader import read_table
from dynshape_perception.nodes.base import NO_ODOMETRY
from dynshape_perception.nodes.messages import cloud_msg, header, time_msg
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.perception.records import OBSTACLE_DTYPE, PREDICTION_DTYPE, TRACK_DTYPE
from dynshape_perception.resources import config_path
from dynshape_perception.testing.session import (
    DETECTED,
    OUTPUTS,
    PREDICTED,
    TRACKED,
    NodeSession,
    node_session,
)

pytestmark = pytest.mark.ros

EGO_SPEED_MPS = 1.0
# The debug tables some tests read come as messages of their own, after the standard outputs
# or before them: such a frame is complete when all have arrived.
FRAME_TOPICS = (*OUTPUTS, "near_obstacles", "obstacles", "tracks", "predictions")
FRAME_S = 0.1
TIMEOUT_S = 15.0
PRIME_WITHIN_S = 60.0
COUNTER_TIMEOUT_S = 5.0
MAX_HISTORY_STEPS = 64
K = int(default_config().section("predictor")["K"])
H = int(default_config().section("predictor")["H"])


@pytest.fixture(scope="module")
def session(
    node_overrides: dict[str, bool | int | float | str],
    tmp_path_factory: pytest.TempPathFactory,
    kitti_points: np.ndarray,
) -> Iterator[NodeSession]:
    overrides = {**node_overrides, "bounds.max_history_steps": MAX_HISTORY_STEPS}
    logs = tmp_path_factory.mktemp("separate_logs")
    with node_session("separate", overrides=overrides, log_dir=logs) as running:
        running.prime(
            kitti_points, 1_000_000_000, within_s=PRIME_WITHIN_S, frame_timeout_s=TIMEOUT_S
        )
        yield running


_stamps = count()


def next_stamp() -> tuple[int, float]:
    """Stamps after those of the priming frames, 0.1 s apart: (ns, seconds)."""
    k = next(_stamps)
    return 10_000_000_000 + k * 100_000_000, 10.0 + k * FRAME_S


def ego(t_s: float) -> Pose2D:
    return Pose2D(EGO_SPEED_MPS * t_s, 0.0, 0.0)


def counter(session: NodeSession, node: str, key: str) -> int:
    status = session.probe.status(node)
    return int(status.values[key]) if status is not None else 0


def wait_counter(session: NodeSession, node: str, key: str, at_least: int) -> int:
    session.probe.spin_until(lambda: counter(session, node, key) >= at_least, COUNTER_TIMEOUT_S)
    return counter(session, node, key)


def test_kitti_scan_through_all_stages(session: NodeSession, kitti_points: np.ndarray) -> None:
    timings = []
    for _ in range(8):
        ns, t_s = next_stamp()
        timings.append(session.frame(kitti_points, ns, ego(t_s), TIMEOUT_S, FRAME_TOPICS))
    assert all(v is not None for t in timings for v in t.after_publish_ms.values()), timings
    got = session.probe.received
    last = timings[-1].stamp_ns
    obstacles, tracks = got["obstacles"][last], got["tracks"][last]
    near = got["near_obstacles"][last]
    assert near.frame_id == "base_link"
    assert read_table(near.msg).dtype.names == OBSTACLE_DTYPE.names
    predictions, markers = got["predictions"][last], got["markers"][last]
    # The documented layouts, read with io/tables_reader.py (docs/interfaces.md).
    assert read_table(obstacles.msg).dtype.names == OBSTACLE_DTYPE.names
    assert read_table(tracks.msg).dtype.names == TRACK_DTYPE.names
    assert read_table(predictions.msg).dtype.names == PREDICTION_DTYPE.names
    assert [(f.name, f.datatype) for f in tracks.msg.fields][-4:] == [
        ("id", 6),
        ("vx", 7),
        ("vy", 7),
        ("age", 6),
    ]
    assert obstacles.table is not None and tracks.table is not None
    assert predictions.table is not None
    # Frames: obstacles in the vehicle frame (no TF mount: the sensor frame is base_link);
    # tracking runs in the odometry frame.
    assert obstacles.frame_id == "base_link"
    assert tracks.frame_id == predictions.frame_id == markers.frame_id == "odom"
    assert obstacles.table.shape[0] > 0
    assert tracks.table.shape[0] > 0 and np.unique(tracks.table["id"]).size == tracks.table.size
    # The same scan every frame from an ego moving at 1 m/s: in the odometry frame every
    # object moves with the ego.
    np.testing.assert_allclose(np.median(tracks.table["vx"]), EGO_SPEED_MPS, atol=0.05)
    np.testing.assert_allclose(np.median(tracks.table["vy"]), 0.0, atol=0.05)
    pred = predictions.table
    assert pred.shape[0] > 0
    # The prediction node knows tracks by UUID: its table's ids are its own (the UUIDs of
    # predicted and tracked objects are compared below).
    ids, per_agent = np.unique(pred["id"], return_counts=True)
    assert ids.size <= tracks.table.size and (per_agent == K * H).all()
    for agent in ids:
        rows = pred[(pred["id"] == agent) & (pred["step"] == 0)]
        assert sorted(rows["k"].tolist()) == list(range(K))
        assert rows["prob"].sum() == pytest.approx(1.0, abs=1e-4)
    boxes = [m for m in markers.msg.markers if m.ns == "track_boxes"]
    paths = [m for m in markers.msg.markers if m.ns == "predicted_paths"]
    assert markers.msg.markers[0].action == 3
    assert len(boxes) == tracks.table.shape[0] and len(paths) == ids.size * K
    _standard_messages(got, [t.stamp_ns for t in timings], tracks.table)


def mapped_libraries(pid: int) -> set[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {Path(line.split()[-1]).name for line in maps.splitlines() if ".so" in line}


def test_the_nodes_load_tvm_and_never_pytorch(session: NodeSession) -> None:
    """tvm_ffi imports PyTorch whenever it is installed; the nodes keep it out."""
    pytest.importorskip("torch", reason="only where PyTorch is installed can it be kept out")
    for proc in session.processes:
        assert proc.alive(), f"{proc.name} is not running"
        libraries = mapped_libraries(proc.pid)
        assert any(name.startswith("libtvm") for name in libraries), proc.name
        assert not any(name.startswith("libtorch") for name in libraries), proc.name


def _standard_messages(got: dict[str, Any], stamps: list[int], tracks: np.ndarray) -> None:
    """The same frames as DetectedObjects, TrackedObjects and PredictedObjects."""
    last = stamps[-1]
    detected = got[DETECTED][last]
    assert detected.frame_id == "base_link" and detected.table is not None
    np.testing.assert_allclose(
        np.sort(detected.table["x"]), np.sort(got["obstacles"][last].table["x"]), atol=1e-5
    )
    # A track keeps its UUID from frame to frame.
    previous: dict[bytes, tuple[float, float]] = {}
    kept = 0
    for ns in stamps[-4:]:
        msg = got[TRACKED][ns].msg
        assert got[TRACKED][ns].frame_id == "odom"
        now = {
            bytes(o.object_id.uuid): (
                o.kinematics.pose_with_covariance.pose.position.x,
                o.kinematics.pose_with_covariance.pose.position.y,
            )
            for o in msg.objects
        }
        for uuid, (x, y) in now.items():
            if uuid in previous:
                kept += 1
                # The ego drives 0.1 m a frame past a standing scene: tracks move with it.
                assert math.hypot(x - previous[uuid][0], y - previous[uuid][1]) < 0.5
        previous = now
    assert kept >= 3 * len(previous) // 2
    tracked = got[TRACKED][last]
    assert tracked.table is not None and tracked.table.shape[0] == tracks.shape[0]
    objects = tracked.msg.objects
    assert all(0.0 < o.existence_probability < 1.0 for o in objects)
    assert all(o.kinematics.pose_with_covariance.covariance[0] > 0.0 for o in objects)
    np.testing.assert_allclose(np.median(tracked.table["vx"]), EGO_SPEED_MPS, atol=0.05)
    predicted = got[PREDICTED][last]
    assert predicted.frame_id == "odom"
    with_paths = [o for o in predicted.msg.objects if o.kinematics.predicted_paths]
    assert {bytes(o.object_id.uuid) for o in predicted.msg.objects} == {
        bytes(o.object_id.uuid) for o in objects
    }
    assert len(with_paths) == np.unique(got["predictions"][last].table["id"]).size > 0
    z_of = {
        bytes(o.object_id.uuid): o.kinematics.pose_with_covariance.pose.position.z for o in objects
    }
    for obj in with_paths:
        paths = obj.kinematics.predicted_paths
        assert len(paths) == K and all(len(p.path) == H for p in paths)
        assert sum(p.confidence for p in paths) == pytest.approx(1.0, abs=1e-4)
        assert all((p.time_step.sec, p.time_step.nanosec) == (0, 400_000_000) for p in paths)
        z = z_of[bytes(obj.object_id.uuid)]
        assert all(q.position.z == pytest.approx(z) for p in paths for q in p.path)


def _ground_cloud(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    points = np.empty((n, 4), np.float32)
    points[:, 0] = rng.uniform(2.0, 50.0, n)
    points[:, 1] = rng.uniform(-20.0, 20.0, n)
    points[:, 2] = rng.normal(-1.7, 0.05, n)
    points[:, 3] = rng.uniform(0.0, 1.0, n)
    return points


def _layouts(points: np.ndarray) -> dict[str, CloudData]:
    driver = np.zeros(
        points.shape[0],
        dtype={
            "names": ["x", "y", "z", "intensity", "ring"],
            "formats": ["<f4", "<f4", "<f4", "<u2", "<u2"],
            "offsets": [0, 4, 8, 16, 18],
            "itemsize": 32,
        },
    )
    for i, name in enumerate(("x", "y", "z")):
        driver[name] = points[:, i]
    holes = points.copy()
    holes[::7, :3] = np.nan
    return {
        "big_endian": points_to_cloud(points, is_bigendian=True),
        "organised": points_to_cloud(points, height=16),
        "driver_layout": encode_cloud(driver, height=8, row_padding=16),
        "non_dense_nan": points_to_cloud(holes, is_dense=False),
    }


def test_an_uncounted_frame_leaves_its_outputs_unread(
    session: NodeSession, kitti_points: np.ndarray
) -> None:
    ns, t_s = next_stamp()
    timing = session.frame(kitti_points, ns, ego(t_s), TIMEOUT_S, counted=False)
    assert all(v is not None for v in timing.after_publish_ms.values()), timing
    assert timing.counts == {}
    # Their tables are read once asked for, and not before.
    predicted = session.probe.received[PREDICTED][ns]
    assert predicted.reader is not None
    assert predicted.table is not None and predicted.table.shape[0] > 0
    assert predicted.reader is None


@pytest.mark.parametrize("size", [1, 640, 8_000, 40_000, 100_000, 150_000])
def test_generated_clouds_of_varying_sizes(session: NodeSession, size: int) -> None:
    ns, t_s = next_stamp()
    timing = session.frame(_ground_cloud(size, size), ns, ego(t_s), TIMEOUT_S)
    assert timing.after_publish_ms[DETECTED] is not None, f"{size} points never came back"
    assert timing.after_publish_ms[PREDICTED] is not None


@pytest.mark.parametrize("layout", ["big_endian", "organised", "driver_layout", "non_dense_nan"])
def test_cloud_layouts(session: NodeSession, layout: str) -> None:
    cloud = _layouts(_ground_cloud(4_096, 5))[layout]
    before = counter(session, "pointcloud_node", "points_non_finite_removed")
    ns, t_s = next_stamp()
    timing = session.frame(cloud, ns, ego(t_s), TIMEOUT_S, wait_for=(DETECTED,))
    assert timing.after_publish_ms[DETECTED] is not None
    if layout == "non_dense_nan":
        removed = wait_counter(session, "pointcloud_node", "points_non_finite_removed", 1)
        assert removed - before == len(range(0, 4_096, 7))


def _bad_clouds(points: np.ndarray, bound: int) -> dict[str, CloudData]:
    good = points_to_cloud(points)
    wrong_type = tuple(
        FieldSpec(f.name, f.offset, FLOAT64 if f.name == "x" else f.datatype) for f in good.fields
    )
    nan = points.copy()
    nan[10, 1] = np.nan
    return {
        "bad_length": replace(good, data=good.data[:-5]),
        "missing_fields": replace(good, fields=good.fields[1:]),
        "unsupported_datatype": replace(good, fields=wrong_type[:1] + good.fields[1:]),
        "non_finite": points_to_cloud(nan, is_dense=True),
        "over_bound": points_to_cloud(_ground_cloud(bound + 1, 1)),
        "empty": replace(good, width=0, row_step=0, data=b""),
        "duplicate_fields": replace(good, fields=(*good.fields, good.fields[0])),
        "overlapping_fields": replace(
            good, fields=(good.fields[0], replace(good.fields[1], offset=2), *good.fields[2:])
        ),
    }


@pytest.mark.parametrize(
    "reason",
    [
        "bad_length",
        "missing_fields",
        "unsupported_datatype",
        "non_finite",
        "over_bound",
        "empty",
        "duplicate_fields",
        "overlapping_fields",
    ],
)
def test_bad_cloud_is_dropped_and_the_next_one_processed(
    session: NodeSession, kitti_points: np.ndarray, reason: str
) -> None:
    bad = _bad_clouds(kitti_points, parameters.all_specs()["bounds.max_points"].default)[reason]  # type: ignore[arg-type]
    key = f"drops.{reason}"
    before = counter(session, "pointcloud_node", key)
    bad_ns, t_s = next_stamp()
    session.probe.publish_cloud(bad, bad_ns)
    ns, t_s = next_stamp()
    timing = session.frame(kitti_points, ns, ego(t_s), TIMEOUT_S, wait_for=(DETECTED,))
    assert timing.after_publish_ms[DETECTED] is not None, "the next valid cloud was lost"
    assert bad_ns not in session.probe.received[DETECTED]
    assert wait_counter(session, "pointcloud_node", key, before + 1) == before + 1
    assert all(p.alive() for p in session.processes)
    assert re.search(rf"dropped input \({reason}, \d+ so far\)", session.processes[0].log())


def test_unreadable_cloud_bytes_are_dropped_and_the_next_cloud_processed(
    session: NodeSession, kitti_points: np.ndarray
) -> None:
    """The point nodes read a cloud's CDR bytes themselves: bytes cut short, as a raw
    publisher could send them, are a bad_layout drop, not a dead node."""
    bad_ns, _ = next_stamp()
    whole = serialize_message(
        cloud_msg(points_to_cloud(kitti_points), header(time_msg(bad_ns), "lidar"))
    )
    before = counter(session, "pointcloud_node", "drops.bad_layout")
    session.probe.points_pub.publish(whole[: len(whole) // 2])
    assert wait_counter(session, "pointcloud_node", "drops.bad_layout", before + 1) == before + 1
    ns, t_s = next_stamp()
    timing = session.frame(kitti_points, ns, ego(t_s), TIMEOUT_S, wait_for=(DETECTED,))
    assert timing.after_publish_ms[DETECTED] is not None, "the next valid cloud was lost"
    assert all(p.alive() for p in session.processes)
    assert re.search(r"unreadable PointCloud2 CDR", session.processes[0].log())


def test_warnings_are_throttled(session: NodeSession, kitti_points: np.ndarray) -> None:
    bad = _bad_clouds(kitti_points, 1)["bad_length"]
    log = session.processes[0]
    lines_before = log.log().count("dropped input (bad_length")
    before = counter(session, "pointcloud_node", "drops.bad_length")
    for _ in range(4):
        session.probe.publish_cloud(bad, next_stamp()[0])
    assert wait_counter(session, "pointcloud_node", "drops.bad_length", before + 4) == before + 4
    assert log.log().count("dropped input (bad_length") - lines_before <= 1


def test_bad_objects_stale_stamp_and_odometry_going_back(
    session: NodeSession, kitti_points: np.ndarray
) -> None:
    probe = session.probe
    bad_before = counter(session, "tracker_node", "drops.bad_message")
    stale_before = counter(session, "tracker_node", "drops.stale_stamp")
    odom_before = counter(session, "tracker_node", "drops.odom_time_backwards")
    pred_odom_before = counter(session, "prediction_node", "drops.odom_time_backwards")
    ns, t_s = next_stamp()
    session.frame(kitti_points, ns, ego(t_s), TIMEOUT_S)
    boxes = np.zeros(2, OBSTACLE_DTYPE)
    boxes["length"], boxes["width"], boxes["height"] = 1.0, 1.0, 1.0
    # An orientation that is no rotation where the tracker expects detected objects:
    # refused, counted.
    bad = deserialize_message(detected_objects(ns + 1, "base_link", boxes), DetectedObjects)
    orientation = bad.objects[1].kinematics.pose_with_covariance.pose.orientation
    orientation.z = orientation.w = 0.0
    probe.detected_pub.publish(bad)
    # The stamp of the last frame again: the tracker must not step back.
    probe.detected_pub.publish(detected_objects(ns, "base_link", boxes))
    probe.publish_odometry(ns - 5_000_000_000, 0.0, 0.0, 0.0)
    assert wait_counter(session, "tracker_node", "drops.bad_message", bad_before + 1) == (
        bad_before + 1
    )
    assert wait_counter(session, "tracker_node", "drops.stale_stamp", stale_before + 1) == (
        stale_before + 1
    )
    assert wait_counter(session, "tracker_node", "drops.odom_time_backwards", odom_before + 1) == (
        odom_before + 1
    )
    assert (
        wait_counter(session, "prediction_node", "drops.odom_time_backwards", pred_odom_before + 1)
        == pred_odom_before + 1
    )
    ns, t_s = next_stamp()
    timing = session.frame(kitti_points, ns, ego(t_s), TIMEOUT_S)
    assert timing.after_publish_ms[PREDICTED] is not None
    assert all(p.alive() for p in session.processes)


def test_an_obstacle_of_no_size_is_a_counted_drop_and_the_others_are_tracked(
    session: NodeSession, kitti_points: np.ndarray
) -> None:
    before = counter(session, "tracker_node", "drops.bad_object")
    ns, t_s = next_stamp()
    session.frame(kitti_points, ns, ego(t_s), TIMEOUT_S)
    table = np.zeros(2, OBSTACLE_DTYPE)
    table["length"] = table["width"] = table["height"] = 1.0
    bad_ns, _ = next_stamp()
    bad = deserialize_message(detected_objects(bad_ns, "base_link", table), DetectedObjects)
    bad.objects[1].shape.dimensions.y = -1.0  # a width of -1
    session.probe.detected_pub.publish(bad)
    assert wait_counter(session, "tracker_node", "drops.bad_object", before + 1) == before + 1
    # The box of a size is tracked all the same.
    assert session.probe.spin_until(lambda: bad_ns in session.probe.received[TRACKED], TIMEOUT_S)
    ns, t_s = next_stamp()
    timing = session.frame(kitti_points, ns, ego(t_s), TIMEOUT_S)
    assert timing.after_publish_ms[TRACKED] is not None
    assert all(p.alive() for p in session.processes)


def test_declared_parameters_are_the_yaml_keys(session: NodeSession) -> None:
    for node in ("pointcloud_node", "tracker_node", "prediction_node"):
        names = set(session.probe.remote_parameter_names(node, TIMEOUT_S))
        library = parameters.BUILTIN_PARAMETERS | parameters.LIBRARY_PARAMETERS
        assert names - library == set(parameters.node_specs(node)), node
        assert parameters.UPDATER_PERIOD in names


def test_tunable_parameters_change_live_and_bad_values_are_refused(
    session: NodeSession, kitti_points: np.ndarray
) -> None:
    probe = session.probe
    results = probe.set_remote_parameters(
        "pointcloud_node", {"segmentation.min_points": 1_000_000}, TIMEOUT_S
    )
    assert results[0].successful
    ns, t_s = next_stamp()
    assert session.frame(kitti_points, ns, ego(t_s), TIMEOUT_S).counts[DETECTED] == 0
    default = parameters.all_specs()["segmentation.min_points"].default
    assert probe.set_remote_parameters(
        "pointcloud_node", {"segmentation.min_points": default}, TIMEOUT_S
    )[0].successful
    ns, t_s = next_stamp()
    assert session.frame(kitti_points, ns, ego(t_s), TIMEOUT_S).counts[DETECTED] > 0

    refused = {
        ("pointcloud_node", "target_profile", "aarch64"): "read-only",
        ("pointcloud_node", "segmentation.score_threshold", 1.5): "out of range",
        ("tracker_node", "tracking.gate_distance_m", float("nan")): "out of range",
        ("prediction_node", "prediction.min_history_steps", MAX_HISTORY_STEPS + 1): "ever be",
        ("tracker_node", "jit.mode", "off"): "read-only",
        ("pointcloud_node", "tiers.collision_deadline_ms", 500.0): "must not decrease",
        ("pointcloud_node", "near_field.min_z_m", 5.0): "min_z_m < max_z_m",
        ("pointcloud_node", "executor.reserved_workers", 0): "read-only",
    }
    for (node, name, value), reason in refused.items():
        result = probe.set_remote_parameters(node, {name: value}, TIMEOUT_S)[0]
        assert not result.successful and reason in result.reason, (name, result.reason)
    for node, name, value in (
        ("tracker_node", "tracking.gate_distance_m", 3.0),
        ("tracker_node", "jit.hotness_threshold", 4),
        ("prediction_node", "jit.max_entries", 16),
        ("prediction_node", "markers.box_alpha", 0.8),
        ("pointcloud_node", "near_field.ahead_m", 25.0),
        ("pointcloud_node", "tiers.chunk_budget_ms", 8.0),
    ):
        assert probe.set_remote_parameters(node, {name: value}, TIMEOUT_S)[0].successful, name


def test_diagnostics(session: NodeSession) -> None:
    session.probe.spin_for(0.5)
    for node in ("pointcloud_node", "tracker_node", "prediction_node"):
        status = session.probe.status(node)
        assert status is not None, node
        values = status.values
        for reason in REASONS:
            assert f"drops.{reason}" in values
        for key in ("calls", "hits", "hit_rate", "compiles_ok", "compiles_failed", "evictions"):
            assert f"jit.{key}" in values
        assert int(values["frames_out"]) > 0 and float(values["latency_ms.total.mean"]) > 0.0
    tracker = session.probe.status("tracker_node")
    assert tracker is not None and tracker.values["odometry"] == "ok (frame odom)"
    assert tracker.values["odometry"] != NO_ODOMETRY
    # Only the lidar node runs the tiered executor: near field (1) and full cloud (2).
    lidar = session.probe.status("pointcloud_node")
    assert lidar is not None
    for key in ("tier1.collision.completed", "tier2.planning.completed", "near_field_out"):
        assert int(lidar.values[key]) > 0, key
    assert int(lidar.values["tier3.comfort.completed"]) == 0
    assert not any(k.startswith("tier1.") for k in tracker.values)
    _diagnostic_tasks(session)


def _diagnostic_tasks(session: NodeSession) -> None:
    """diagnostic_updater: a task per concern, a rate and stamp check per topic; each status
    lands in exactly one group of the aggregator's analyzers (config/)."""
    probe = session.probe
    for node, tasks in {
        "pointcloud_node": ("input", "pose", "jit", "tiers"),
        "tracker_node": ("input", "pose", "jit"),
        "prediction_node": ("input", "pose", "jit"),
    }.items():
        for task in tasks:
            assert probe.task(node, task) is not None, (node, task)
    topics = {
        "pointcloud_node": ("/points", "/detected_objects", "/near_objects"),
        "tracker_node": ("/detected_objects", "/tracked_objects"),
        "prediction_node": ("/tracked_objects", "/predicted_objects", "/markers"),
    }
    for node, names in topics.items():
        for name in names:
            status = probe.task(node, f"{name} topic status")
            assert status is not None, (node, name)
            assert "Events since startup" in status.values, status.values
    stamped = probe.task("tracker_node", "/tracked_objects topic status")
    assert stamped is not None and "Latest timestamp delay:" in stamped.values
    analyzers = yaml.safe_load((config_path("diagnostic_aggregator.yaml")).read_text())
    groups = [
        a["regex"]
        for a in analyzers["analyzers"]["ros__parameters"].values()
        if isinstance(a, dict)
    ]
    for name in probe.tasks:
        matched = [g for g in groups if any(re.fullmatch(p, name) for p in g)]
        assert len(matched) == 1, (name, matched)


def test_sigint_and_sigterm_exit_0_and_stop_compile_workers(
    session: NodeSession, wait_gone: Callable[[list[int], float], list[int]]
) -> None:
    children = {
        p.name: [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        for p in session.processes
    }
    signals = {
        "pointcloud_node": signal.SIGINT,
        "tracker_node": signal.SIGTERM,
        "prediction_node": signal.SIGTERM,
    }
    codes = {p.name: p.stop(signals[p.name]) for p in session.processes}
    assert codes == dict.fromkeys(signals, 0), [
        Path(p.log_path).read_text()[-800:] for p in session.processes
    ]
    for pids in children.values():
        assert wait_gone(pids, COUNTER_TIMEOUT_S) == []
