"""tracker_node asked for vision_msgs input where it is missing: a clear error, the table input
still works; with a warm-up profile its compile workers run and stop on SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

from dynshape_perception.io.tables import OBSTACLE_DTYPE
from dynshape_perception.nodes.messages import header, table_msg, time_msg
from dynshape_perception.resources import config_path
from dynshape_perception.testing.probe import Probe, probe_session
from dynshape_perception.testing.processes import (
    NodeProcess,
    dds_env,
    domain_lease,
    start_node,
)

TIMEOUT_S = 20.0
# Start-up builds the generic libraries on a cold cache and waits for the idle-priority
# compile worker to import TVM: on a loaded host that alone can take over TIMEOUT_S. The same
# bound as a node session's start-up.
STARTUP_S = 120.0
OBSTACLES = 6
STEP_NS = 100_000_000
DISCOVERY_S = 1.0


@pytest.fixture(scope="module")
def tracker(
    node_overrides: dict[str, bool | int | float | str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NodeProcess, Probe]]:
    folder = tmp_path_factory.mktemp("vision")
    profile = folder / "profile.yaml"
    dims = {"N": OBSTACLES, "M": OBSTACLES}
    models = {"associator": [{"function": "forward", "dims": dims, "calls": 100}]}
    profile.write_text(yaml.safe_dump({"version": 1, "models": models}))
    overrides = {
        **node_overrides,
        "tracker.input_type": "vision_msgs",
        "jit.warm_up_shapes": str(profile),
        "jit.compile_mode": "process",
    }
    with domain_lease() as domain:
        proc = start_node(
            "tracker_node",
            env=dds_env(domain),
            log_dir=folder,
            params_file=config_path("x86_dev.param.yaml"),
            overrides=overrides,
        )
        try:
            with probe_session(domain) as probe:
                up = probe.wait_for_graph({"obstacles": 2}, {"tracks": 2}, STARTUP_S)
                assert up, proc.log()[-2000:]
                yield proc, probe
        finally:
            proc.stop(signal.SIGINT)


def test_clear_error_and_fallback_to_the_table(tracker: tuple[NodeProcess, Probe]) -> None:
    proc, probe = tracker
    log = proc.log()
    assert "vision_msgs package is not installed" in log
    assert "falling back to the obstacle table on 'obstacles'" in log
    rng = np.random.default_rng(0)
    obstacles = np.zeros(OBSTACLES, OBSTACLE_DTYPE)
    obstacles["x"] = rng.uniform(5.0, 40.0, OBSTACLES)
    obstacles["y"] = rng.uniform(-10.0, 10.0, OBSTACLES)
    obstacles["length"], obstacles["width"], obstacles["height"] = 4.0, 2.0, 1.5
    ns = 1_000_000_000

    def send() -> bool:
        obstacles["x"] += 0.1
        probe.obstacles_pub.publish(table_msg(obstacles, header(time_msg(ns), "lidar")))
        return probe.spin_until(lambda: ns in probe.received["tracks"], DISCOVERY_S)

    # The first tables may go out before the new reader is fully matched.
    for _ in range(int(TIMEOUT_S / DISCOVERY_S)):
        ns += STEP_NS
        if send():
            break
    for _ in range(4):
        ns += STEP_NS
        assert send(), f"no tracks for stamp {ns}"
    stamps = [ns]
    tracks = probe.received["tracks"][stamps[-1]].table
    assert tracks is not None and tracks.shape[0] == OBSTACLES
    probe.spin_for(1.0)
    status = probe.status("tracker_node")
    assert status is not None and "vision_msgs unavailable" in status.values["input"]
    assert status.level == 1


def test_sigterm_stops_the_compile_workers(
    tracker: tuple[NodeProcess, Probe], wait_gone: Callable[[list[int], float], list[int]]
) -> None:
    proc, probe = tracker
    node = psutil.Process(proc.pid)

    def workers() -> list[psutil.Process]:
        return [
            c
            for c in node.children(recursive=True)
            if "resource_tracker" not in " ".join(c.cmdline())
        ]

    assert probe.spin_until(lambda: bool(workers()), TIMEOUT_S), "no compile worker started"
    pids = [c.pid for c in node.children(recursive=True)]
    assert proc.stop(signal.SIGTERM) == 0, proc.log()[-1500:]
    assert wait_gone(pids, TIMEOUT_S) == []
    assert Path(proc.log_path).is_file()
