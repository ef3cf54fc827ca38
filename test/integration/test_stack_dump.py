"""``kill -USR1 <pid>``: a running node writes every thread's stack to its log and runs on."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from dynshape_perception.interrupts import STACKS_SIGNAL
from dynshape_perception.testing.processes import catches, dds_env, domain_lease, start_node

pytestmark = pytest.mark.ros

NODE = "perception_pipeline"
# Long enough for a cold start of the whole node on a loaded machine; a failure bound only.
WAIT_S = 120.0
# What the node logs once its engines are built and its lanes started.
BUILT = "tiered executor:"
# faulthandler's line above each thread's stack.
THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$", re.M)


def test_usr1_writes_every_threads_stack_and_the_node_runs_on(
    node_overrides: dict[str, bool | int | float | str], tmp_path: Path
) -> None:
    with domain_lease() as domain:
        node = start_node(NODE, env=dds_env(domain), log_dir=tmp_path, overrides=node_overrides)
        try:
            assert node.wait_until(lambda: BUILT in node.log(), WAIT_S), node.log()[-3000:]
            assert catches(node.pid, STACKS_SIGNAL)
            os.kill(node.pid, STACKS_SIGNAL)
            # The main thread, rclpy's and Fast DDS's threads that run Python, the lanes.
            dumped = node.wait_until(lambda: len(THREAD.findall(node.log())) >= 2, WAIT_S)
            assert dumped, node.log()[-3000:]
            log = node.log()
            assert "dynshape_perception" in log[log.index("most recent call first") :], log
            time.sleep(1.0)
            assert node.alive(), node.log()[-3000:]
        finally:
            code = node.stop()
        log = node.log()
        assert code == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
