"""The README's ``ros2`` commands as typed: launch (three nodes, composed), param set and dump,
topic hz while a generated drive plays, pkg prefix; every node ends with exit 0 on SIGINT."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dynshape_perception.nodes.debug_times import message_type
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.resources import PACKAGE, config_path
from dynshape_perception.testing.probe import probe_session
from dynshape_perception.testing.processes import domain_lease, live_processes
from dynshape_perception.testing.ros2cli import (
    RETRY_S,
    Launched,
    Ros2,
    daemons,
    launch_exits,
    ros2_executable,
    ros2_on,
)
from dynshape_perception.tools.sim.drive import DriveConfig, drive_frames

pytestmark = pytest.mark.ros

if ros2_executable() is None:
    if os.environ.get("CI") == "true":
        pytest.fail("no ros2 command in the venv (make venv installs it)", pytrace=False)
    pytest.skip("no ros2 command in the venv (make venv installs it)", allow_module_level=True)

# Jazzy's wheels have no ros2launch: there the composed node starts with `ros2 run`.
HAS_LAUNCH = importlib.util.find_spec("ros2launch") is not None
COMPOSED = "/perception_pipeline"
SEPARATE = {"/pointcloud_node", "/tracker_node", "/prediction_node"}
# The first start may build the models (later starts load them from the artefact cache).
STARTUP_S = 600.0
HZ_WAIT_S = 60.0
# A node that stopped leaves the ros2 daemon's graph once its participant's goodbye is read:
# at once on an idle host, later under load.
GONE_S = 30.0
DRIVE_FRAMES = 40
PERIOD_S = 0.1
# Parameters a node has that no params file sets: rclpy's and diagnostic_updater's own.
RCLPY_PARAMETERS = {"use_sim_time", "start_type_description_service", "diagnostic_updater.use_fqn"}
AVERAGE_RATE = re.compile(r"average rate: (\d+\.\d+)")
_DEBUG = message_type()
DEBUG_TYPE = f"{_DEBUG.__module__.split('.')[0]}/msg/{_DEBUG.__name__}"
ECHO_DATA = re.compile(r"^data: (\S+)$", re.MULTILINE)
DEBUG_TOPICS = (
    f"{COMPOSED}/debug/processing_time_ms",
    f"{COMPOSED}/debug/cyclic_time_ms",
    f"{COMPOSED}/debug/processing_time/predict_ms",
)


def flatten(tree: dict[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def node_names(ros2: Ros2, *options: str) -> set[str]:
    return set(ros2.call("node", "list", *options).out.split())


def wait_for_nodes(ros2: Ros2, names: set[str], system: Launched) -> None:
    deadline = time.monotonic() + STARTUP_S
    while not names <= node_names(ros2):
        assert system.popen.poll() is None, system.log()[-3000:]
        assert time.monotonic() < deadline, f"{names} not up in {STARTUP_S} s"
        time.sleep(2.0)


def left_graph(ros2: Ros2, name: str) -> bool:
    """Whether ``name`` leaves ``ros2 node list`` within ``GONE_S``."""
    deadline = time.monotonic() + GONE_S
    while name in node_names(ros2):
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)
    return True


def stop(system: Launched, group: bool) -> tuple[int, str]:
    code = system.interrupt(group=group)
    leftovers = system.leftovers()
    assert not leftovers, leftovers
    return code, system.log()


@pytest.fixture(scope="module")
def ros2() -> Iterator[Ros2]:
    with domain_lease() as domain:
        with ros2_on(domain) as ros2:
            yield ros2
        assert not daemons(domain), "the ros2 daemon outlived the tests"


@pytest.fixture(scope="module")
def composed(ros2: Ros2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    """The composed pipeline as the README starts it: ``ros2 launch ... composed:=true``, or,
    without ros2launch, ``ros2 run`` with the same parameters file."""
    log = tmp_path_factory.mktemp("ros2_composed") / "composed.log"
    if HAS_LAUNCH:
        args = ["launch", PACKAGE, "perception.launch.py", "composed:=true"]
    else:
        params = str(config_path("x86_dev.param.yaml"))
        args = ["run", PACKAGE, "perception_pipeline", "--ros-args", "--params-file", params]
    system = ros2.popen(*args, log=log)
    try:
        wait_for_nodes(ros2, {COMPOSED}, system)
        yield system
    finally:
        system.interrupt(group=not HAS_LAUNCH)
        system.kill()


def test_pkg_prefix(ros2: Ros2) -> None:
    result = ros2.call("pkg", "prefix", PACKAGE)
    assert result.returncode == 0, result
    prefix = Path(result.out.strip())
    assert prefix.resolve() == Path(sys.prefix).resolve(), result
    launch = prefix / "share" / PACKAGE / "launch" / "perception.launch.py"
    assert launch.is_file(), launch


def test_param_dump_equals_the_params_file(ros2: Ros2, composed: Launched) -> None:
    result = ros2.until(["param", "dump", COMPOSED], lambda r: r.returncode == 0)
    assert result.returncode == 0, result
    dumped = flatten(yaml.safe_load(result.out)[COMPOSED]["ros__parameters"])
    params_file = yaml.safe_load(config_path("x86_dev.param.yaml").read_text())
    written = flatten(params_file["/**"]["ros__parameters"])
    assert written
    declared = {k: v for k, v in written.items() if k in dumped}
    # The composed node runs every stage: it declares nearly every key of the file.
    assert len(declared) >= 0.9 * len(written), sorted(set(written) - set(dumped))
    assert {k: dumped[k] for k in declared} == declared
    assert set(dumped) - set(written) <= RCLPY_PARAMETERS, sorted(set(dumped) - set(written))


def test_param_set_taken_and_refused(ros2: Ros2, composed: Launched) -> None:
    key = "tiers.collision_deadline_ms"
    taken = ros2.until(["param", "set", COMPOSED, key, "20.0"], lambda r: r.returncode == 0)
    assert "Set parameter successful" in taken.said, taken
    got = ros2.call("param", "get", COMPOSED, key)
    assert "Double value is: 20.0" in got.out, got
    # The README's example: above tier 2's 100 ms, refused with the reason.
    refused = ros2.call("param", "set", COMPOSED, key, "500.0")
    assert "parameter failed" in refused.said, refused
    assert "tier deadlines must not decrease from tier 1 to tier 4" in refused.said, refused
    assert "Double value is: 20.0" in ros2.call("param", "get", COMPOSED, key).out
    restored = ros2.call("param", "set", COMPOSED, key, "10.0")
    assert "Set parameter successful" in restored.said, restored


def test_topic_hz_and_debug_echo_while_a_drive_plays(
    ros2: Ros2, composed: Launched, tmp_path: Path
) -> None:
    """``ros2 topic hz /predicted_objects``, and ``ros2 topic echo --once`` of the node's
    Autoware debug topics (the whole frame's, and one stage's)."""
    hz = ros2.popen("topic", "hz", "/predicted_objects", log=tmp_path / "hz.log")
    echoes = {
        topic: ros2.popen("topic", "echo", "--once", topic, DEBUG_TYPE, log=tmp_path / f"e{k}.log")
        for k, topic in enumerate(DEBUG_TOPICS)
    }
    rates: list[float] = []
    try:
        config = DriveConfig(
            frames=DRIVE_FRAMES, segment_frames=DRIVE_FRAMES, points_range=(5_000, 30_000)
        )
        frames = list(drive_frames(config))
        with probe_session(ros2.domain_id, name="ros2_cli_drive") as probe:
            assert probe.wait_for_graph({"points": 1}, {"predicted_objects": 1}, STARTUP_S)
            ns = time.time_ns()
            deadline = time.monotonic() + HZ_WAIT_S
            k = 0
            while time.monotonic() < deadline and not (
                rates and all(e.popen.poll() is not None for e in echoes.values())
            ):
                frame = frames[k % len(frames)]
                ns += int(PERIOD_S * 1e9)
                pose = Pose2D(*frame.pose)
                probe.publish_odometry(ns, pose.x, pose.y, pose.yaw)
                probe.publish_points(frame.points, ns)
                probe.spin_for(PERIOD_S)
                rates = [float(r) for r in AVERAGE_RATE.findall(hz.log())]
                k += 1
    finally:
        hz.interrupt()
        codes = {topic: echo.interrupt() for topic, echo in echoes.items()}
    assert rates, hz.log()[-3000:]
    assert all(rate > 0.0 for rate in rates), rates
    for topic, echo in echoes.items():
        assert codes[topic] == 0, echo.log()[-2000:]
        values = [float(v) for v in ECHO_DATA.findall(echo.log())]
        assert len(values) == 1 and values[0] >= 0.0, echo.log()[-2000:]


def test_one_parameter_turns_the_debug_topics_off(ros2: Ros2, composed: Launched) -> None:
    key = "debug.publish_processing_time"

    def debug_topics() -> set[str]:
        listed = ros2.call("topic", "list").out.split()
        return {t for t in listed if t.startswith(f"{COMPOSED}/debug/")}

    assert set(DEBUG_TOPICS) <= debug_topics()
    off = ros2.until(["param", "set", COMPOSED, key, "false"], lambda r: r.returncode == 0)
    assert "Set parameter successful" in off.said, off
    deadline = time.monotonic() + RETRY_S
    while debug_topics() and time.monotonic() < deadline:
        time.sleep(1.0)
    assert not debug_topics()
    on = ros2.call("param", "set", COMPOSED, key, "true")
    assert "Set parameter successful" in on.said, on


def test_composed_stops_with_exit_0(ros2: Ros2, composed: Launched) -> None:
    code, log = stop(composed, group=not HAS_LAUNCH)
    assert code == 0, log[-3000:]
    if HAS_LAUNCH:
        assert launch_exits(log) == {"perception_pipeline-1": 0}, log[-3000:]
    if not left_graph(ros2, COMPOSED):
        # Which lingers: a participant still alive (a process left over), or the daemon's
        # memory of one whose goodbye it never read (a fresh participant does not see it).
        fresh = sorted(node_names(ros2, "--no-daemon"))
        alive = [
            b" ".join(args).decode(errors="replace")
            for _, _, args in live_processes()
            if any(b"perception_pipeline" in a for a in args)
        ]
        pytest.fail(
            f"{COMPOSED} still in the daemon's graph {GONE_S} s after it exited; without the "
            f"daemon the graph holds {fresh}; processes named for it: {alive}"
        )


@pytest.mark.skipif(not HAS_LAUNCH, reason="no ros2launch on this distro's wheels")
def test_launch_three_nodes_stop_with_exit_0(ros2: Ros2, tmp_path: Path) -> None:
    system = ros2.popen("launch", PACKAGE, "perception.launch.py", log=tmp_path / "launch.log")
    try:
        wait_for_nodes(ros2, SEPARATE, system)
    finally:
        code, log = stop(system, group=False)
    assert code == 0, log[-3000:]
    exits = launch_exits(log)
    assert sorted(name.rsplit("-", 1)[0] for name in exits) == sorted(
        name.lstrip("/") for name in SEPARATE
    ), log[-3000:]
    assert set(exits.values()) == {0}, exits
