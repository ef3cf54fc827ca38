"""launch_testing of perception.launch.py: nodes ready, clouds of several sizes through, exit 0."""

from __future__ import annotations

import os
import time
import unittest

import pytest

pytest.importorskip(
    "launch_testing",
    reason="launch_testing comes with a ROS 2 install (apt ros-$ROS_DISTRO-launch-testing); "
    "it is not on PyPI, so test/integration covers the same ground with plain processes",
)
import launch_ros.substitutions
import launch_testing.actions
import launch_testing.asserts
import numpy as np
import rclpy

import launch
from dynshape_perception.testing.probe import Probe

SIZES = (1_000, 20_000, 60_000, 120_000)
TIMEOUT_S = 60.0


@pytest.mark.launch_test
def generate_test_description() -> tuple[launch.LaunchDescription, dict[str, object]]:
    share = launch_ros.substitutions.FindPackageShare("dynshape_perception")
    included = launch.actions.IncludeLaunchDescription(
        launch.launch_description_sources.PythonLaunchDescriptionSource(
            launch.substitutions.PathJoinSubstitution([share, "launch", "perception.launch.py"])
        ),
        launch_arguments={"composed": "false"}.items(),
    )
    return launch.LaunchDescription(
        [
            launch.actions.SetEnvironmentVariable("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST"),
            included,
            launch_testing.actions.ReadyToTest(),
        ]
    ), {}


class TestCloudsComeThrough(unittest.TestCase):
    def setUp(self) -> None:
        rclpy.init()
        self.probe = Probe()

    def tearDown(self) -> None:
        self.probe.destroy_node()
        rclpy.shutdown()

    def test_clouds_of_varying_sizes(self) -> None:
        self.assertTrue(
            self.probe.wait_for_graph({"points": 1, "obstacles": 2, "tracks": 2}, {}, TIMEOUT_S)
        )
        rng = np.random.default_rng(0)
        stamp = time.time_ns()
        for size in SIZES:
            points = rng.uniform(-20.0, 20.0, size=(size, 4)).astype(np.float32)
            stamp += 100_000_000
            self.probe.publish_odometry(stamp, 0.0, 0.0, 0.0)
            self.probe.publish_points(points, stamp)
            self.assertTrue(
                self.probe.spin_until(
                    lambda s=stamp: s in self.probe.received["predictions"], TIMEOUT_S
                ),
                f"no predictions for the {size}-point cloud",
            )
            self.assertIsNotNone(self.probe.received["obstacles"][stamp].table)
        self.assertIn("FASTDDS_BUILTIN_TRANSPORTS", os.environ)


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    def test_exit_codes(self, proc_info: launch_testing.ProcInfoHandler) -> None:
        launch_testing.asserts.assertExitCodes(proc_info)
