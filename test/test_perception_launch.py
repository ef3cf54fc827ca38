"""launch_testing of both launch files: perception.launch.py with the three nodes and
perception.launch.xml with the composed pipeline, scans through to PredictedObjects, shut down
with every exit code 0."""

from __future__ import annotations

import unittest

import pytest

from dynshape_perception.testing import launch_stack_required

pytestmark = pytest.mark.ros

try:
    import launch_testing
    import launch_testing.asserts
    from launch.launch_description import LaunchDescription

    from dynshape_perception.testing.launching import (
        FRAME_S,
        FRAMES,
        STARTUP_S,
        check_outputs,
        drive_through,
        launch_description,
        scan,
    )
except ImportError:
    # Neither a ROS 2 install nor the launch wheels: make test installs them for Kilted, and
    # the Jazzy wheels have no launch stack.
    if launch_stack_required():
        raise
    pytest.skip("launch_testing is not installed", allow_module_level=True)

# The nodes each value of the `composed` argument starts.
NODES = {
    "false": {"pointcloud_node", "tracker_node", "prediction_node"},
    "true": {"perception_pipeline"},
}


@pytest.mark.launch_test
@launch_testing.parametrize(
    "launch_file, composed", [("perception.launch.py", "false"), ("perception.launch.xml", "true")]
)
def generate_test_description(
    launch_file: str, composed: str
) -> tuple[LaunchDescription, dict[str, object]]:
    return launch_description(launch_file, {"composed": composed})


class TestScansComeThrough(unittest.TestCase):
    def test_standard_outputs_of_every_stage(self, domain: int, composed: str) -> None:
        outputs = drive_through(domain, scan(), FRAMES, STARTUP_S, FRAME_S)
        check_outputs(self, outputs, NODES[composed])


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    def test_exit_codes(self, proc_info: launch_testing.ProcInfoHandler, composed: str) -> None:
        launch_testing.asserts.assertExitCodes(proc_info)
        self.assertEqual(len(proc_info.process_names()), len(NODES[composed]))
