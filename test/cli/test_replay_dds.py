"""``replay --mode dds``: a bag published over real DDS with /clock, to a probe and to a node."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rclpy
from builtin_interfaces.msg import Time
from nav_msgs.msg import Odometry
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import PointCloud2

from dynshape_perception.io import bags, msgtypes
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights, save_weights
from dynshape_perception.testing.probe import Diagnostics, Probe, probe_session
from dynshape_perception.testing.processes import dds_env, domain_lease, start_node
from dynshape_perception.tools.replay import sources
from dynshape_perception.tools.sim.drive import DriveConfig

pytestmark = pytest.mark.ros

DRIVE = DriveConfig(seed=6, frames=6, segment_frames=3, points_range=(5_000, 8_000))
DEPTH = 1000
LOOPED = 8
TIMEOUT_S = 180
# Simulated time the probe's /clock starts at past the bag's last scan, and its step.
CLOCK_AFTER_BAG_NS = 5 * 10**9
CLOCK_STEP_S = 0.1


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A private DDS domain on loopback, for this process and the ones it starts."""
    with domain_lease() as domain:
        settings = dds_env(domain)
        for key in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE"):
            monkeypatch.setenv(key, settings[key])
        for key in (
            "FASTDDS_BUILTIN_TRANSPORTS",
            "FASTDDS_DEFAULT_PROFILES_FILE",
            "FASTRTPS_DEFAULT_PROFILES_FILE",
        ):
            monkeypatch.setenv(key, settings[key])
        yield settings


# A type rosbags knows and this ROS 2 has no package for.
NOT_INSTALLED = "shape_msgs/msg/Plane"


@pytest.fixture
def drive_bag(tmp_path: Path) -> Path:
    bag = tmp_path / "drive"
    sources.write_generated(bag, "mcap", DRIVE, vision_msgs=True)
    return bag


@pytest.fixture
def bag_with_a_foreign_type(drive_bag: Path, tmp_path: Path) -> Path:
    bag = tmp_path / "foreign"
    plane = msgtypes.typestore().types[NOT_INSTALLED](coef=np.array([0.0, 0.0, 1.0, 0.0]))
    with bags.BagReader(drive_bag) as reader, bags.BagWriter(bag) as writer:
        for message in reader.messages():
            writer.add_topic(message.topic, message.msgtype)
            writer.write_raw(message.topic, message.log_ns, message.raw)
        writer.write("/plane", reader.start_ns, plane)
    return bag


def _replay(bag: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "dynshape_perception.cli.main", "replay", str(bag)),
            *("--mode", "dds", *extra),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_player_publishes_the_bag_and_the_clock(
    drive_bag: Path, bag_with_a_foreign_type: Path, env: dict[str, str]
) -> None:
    context = rclpy.Context()
    rclpy.init(context=context)
    got: dict[str, list[int]] = {"points": [], "odom": [], "clock": []}
    widths: list[int] = []
    try:
        node = Node("replay_probe", context=context)
        best_effort = QoSProfile(depth=DEPTH, reliability=ReliabilityPolicy.BEST_EFFORT)

        def on_points(msg: PointCloud2) -> None:
            got["points"].append(msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec)
            widths.append(msg.width)

        node.create_subscription(PointCloud2, "points", on_points, best_effort)
        node.create_subscription(
            Odometry,
            "odom",
            lambda m: got["odom"].append(m.header.stamp.sec * 10**9 + m.header.stamp.nanosec),
            DEPTH,
        )
        node.create_subscription(
            Clock,
            "/clock",
            lambda m: got["clock"].append(m.clock.sec * 10**9 + m.clock.nanosec),
            best_effort,
        )
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        options = ("--rate", "2", "--wait-for-subscribers", "20", "--loop")
        proc = _replay(bag_with_a_foreign_type, env, *options, "--max-frames", str(LOOPED))
        deadline = time.monotonic() + 5.0
        while len(got["points"]) < LOOPED and time.monotonic() < deadline:
            time.sleep(0.05)
        executor.shutdown()
        spinner.join(timeout=5.0)
        node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (
        f"skipped /plane ({NOT_INSTALLED}): message type not installed in this ROS 2" in proc.stdout
    )
    for topic, msgtype in (
        ("/detections", bags.DETECTION3D_ARRAY),
        ("/tf_static", bags.TF_MESSAGE),
    ):
        assert f"publish {topic} ({msgtype}, " in proc.stdout
    with bags.BagReader(drive_bag) as reader:
        stamps = {
            t: [bags.stamp_ns(reader.deserialize(m).header.stamp) for m in reader.messages([t])]
            for t in ("/points", "/odom")
        }
        sizes = [reader.deserialize(m).width for m in reader.messages(["/points"])]
    frames = DRIVE.frames
    assert len(got["points"]) == LOOPED and got["points"][:frames] == stamps["/points"]
    assert widths == sizes + sizes[: LOOPED - frames]
    looped = got["points"][frames:]
    assert looped[0] > got["points"][frames - 1], "the second pass is stamped later"
    shift = looped[0] - stamps["/points"][0]
    assert looped == [s + shift for s in stamps["/points"][: LOOPED - frames]]
    assert got["odom"][: len(stamps["/odom"])] == stamps["/odom"]
    assert got["odom"] == sorted(got["odom"])
    clock = got["clock"]
    assert clock == sorted(clock), "simulated time never runs backwards"
    assert clock[0] <= stamps["/odom"][0] and clock[-1] >= looped[-1]
    assert len(clock) > len(got["points"]) + len(got["odom"]), "it ticks in between"


def _spin_until_set(probe: Probe, done: threading.Event) -> None:
    while not done.is_set():
        probe.executor_.spin_once(timeout_sec=0.1)


def _final_status(probe: Probe, sent: list[int]) -> Diagnostics | None:
    """The node's status once every scan it received is answered or counted as dropped.

    The node runs on simulated time, which stops with the bag: the probe moves /clock on from
    past the bag's end so that the node's diagnostics timer fires again."""
    clock = probe.create_publisher(Clock, "/clock", 10)
    now_ns = sent[-1] + CLOCK_AFTER_BAG_NS
    status = None
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        sec, nanosec = divmod(now_ns, 10**9)
        clock.publish(Clock(clock=Time(sec=sec, nanosec=nanosec)))
        probe.spin_for(CLOCK_STEP_S)
        now_ns += int(CLOCK_STEP_S * 1e9)
        status = probe.status("perception_pipeline")
        if status is not None and _settled(status.values, len(sent)):
            break
    return status


def _settled(values: dict[str, str], frames: int) -> bool:
    answered = int(values["frames_out"]) + int(values["tier2.planning.dropped"])
    return int(values["frames_in"]) == frames and answered == frames


def test_replay_drives_a_running_pipeline_node(
    drive_bag: Path, env: dict[str, str], tmp_path: Path, cache_root: Path
) -> None:
    weights = tmp_path / "weights"
    for name in MODEL_NAMES:
        init = init_weights(parameter_shapes(model_definition(name)), seed=0)
        save_weights(name, init, {"version": "test-init"}, weights)
    node = start_node(
        "perception_pipeline",
        env=env,
        log_dir=tmp_path / "logs",
        overrides={
            "use_sim_time": True,
            "weights_dir": str(weights),
            "model_cache_dir": str(cache_root),
        },
    )
    run = tmp_path / "run"
    with bags.BagReader(drive_bag) as reader:
        sent = [
            bags.stamp_ns(reader.deserialize(m).header.stamp) for m in reader.messages(["/points"])
        ]
    try:
        with probe_session(int(env["ROS_DOMAIN_ID"])) as probe:
            done = threading.Event()
            spinner = threading.Thread(target=_spin_until_set, args=(probe, done), daemon=True)
            spinner.start()
            try:
                proc = _replay(
                    drive_bag,
                    env,
                    "--rate",
                    "1",
                    "--wait-for-subscribers",
                    "120",
                    "--record",
                    str(run),
                )
            finally:
                done.set()
                spinner.join(timeout=5.0)
            status = _final_status(probe, sent)
    finally:
        code = node.stop()
    log = node.log()
    assert proc.returncode == 0, proc.stderr + log[-2000:]
    # A node that did not stop in time wrote its threads' stacks to the log's end.
    assert code == 0, log[-6000:]
    with bags.BagReader(run / "output") as reader:
        tracked = [reader.deserialize(m) for m in reader.messages(["/tracked_objects"])]
        detected = [reader.deserialize(m) for m in reader.messages(["/detected_objects"])]
    tracks = [bags.stamp_ns(m.header.stamp) for m in tracked]
    # A scan that comes while the node is still busy may be superseded by the next one (the
    # newest wins) and counted as dropped: every scan is answered or counted, the newest
    # always answered, and the stamps carried through.
    assert status is not None, "the node reported its counts"
    values = status.values
    assert _settled(values, len(sent)), values
    assert tracks == sorted(set(tracks)) and set(tracks) <= set(sent)
    assert tracks[-1] == sent[-1], "the newest scan is never superseded"
    assert len(tracks) == int(values["frames_out"])
    # The bag's /tf carried the fixed frame, its /tf_static (latched) the lidar mount.
    assert {m.header.frame_id for m in tracked} == {"odom"}
    assert {m.header.frame_id for m in detected} == {"base_link"}
    assert "mount_* parameters" not in log and "fixed frame from TF" in log
    doc = json.loads((run / "metrics.json").read_text())
    assert doc["run"]["mode"] == "dds" and doc["stages"] == [
        "detected_objects",
        "tracked_objects",
        "predicted_objects",
    ]
    assert [frame["stamp_ns"] for frame in doc["frames"]] == tracks, "a record per answered scan"
    for frame in doc["frames"]:
        assert 0.0 < frame["latency_ms"]["tracked_objects"] < 60_000.0
