"""launch_testing of launch/perception.launch.py: the three nodes up, scans through to
PredictedObjects, shut down with every exit code 0."""

from __future__ import annotations

import os
import unittest

import pytest

try:
    import launch_testing
    import launch_testing.asserts

    from dynshape_perception.testing.launching import (
        FRAME_S,
        FRAMES,
        STARTUP_S,
        check_outputs,
        drive_through,
        launch_description,
        scan,
    )
    from launch import LaunchDescription
except ImportError:
    # Neither a ROS 2 install nor the launch wheels (make test installs them).
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("launch_testing is not installed", allow_module_level=True)

NODES = {"pointcloud_node", "tracker_node", "prediction_node"}


@pytest.mark.launch_test
def generate_test_description() -> tuple[LaunchDescription, dict[str, object]]:
    return launch_description("perception.launch.py", {"composed": "false"})


class TestScansComeThrough(unittest.TestCase):
    def test_standard_outputs_of_every_stage(self, domain: int) -> None:
        outputs = drive_through(domain, scan(), FRAMES, STARTUP_S, FRAME_S)
        check_outputs(self, outputs, NODES)


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    def test_exit_codes(self, proc_info: launch_testing.ProcInfoHandler) -> None:
        launch_testing.asserts.assertExitCodes(proc_info)
        self.assertEqual(len(proc_info.process_names()), len(NODES))
