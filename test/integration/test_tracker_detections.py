"""tracker_node on vision_msgs/Detection3DArray input: the one parser (the class map of the
replays), TrackedObjects with stable UUIDs; with a warm-up profile its compile workers run and
stop on SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from vision_msgs.msg import Detection3DArray

from dynshape_perception.io import bags, msgtypes
from dynshape_perception.nodes.messages import message_class
from dynshape_perception.perception.records import LABEL_CAR, LABEL_PEDESTRIAN, OBSTACLE_DTYPE
from dynshape_perception.testing.probe import Probe
from dynshape_perception.testing.processes import NodeProcess

pytestmark = pytest.mark.ros

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
    node_with_probe: Callable[..., AbstractContextManager[tuple[NodeProcess, Probe]]],
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

    def add_detections_publisher(probe: Probe) -> None:
        probe.detections_pub = probe.create_publisher(  # type: ignore[attr-defined]
            Detection3DArray,
            "detections",
            QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
        )

    graph = ({"detections": 1}, {"tracked_objects": 1})
    with node_with_probe(
        "tracker_node", folder, overrides, graph, STARTUP_S, add_detections_publisher
    ) as running:
        yield running


def _detections(obstacles: np.ndarray, ns: int) -> Detection3DArray:
    """The Detection3DArray make-bag writes (class ids: names), as an rclpy message."""
    raw = msgtypes.typestore().serialize_cdr(
        bags.detections_message(obstacles, ns, "lidar"), bags.DETECTION3D_ARRAY
    )
    return deserialize_message(bytes(raw), message_class(bags.DETECTION3D_ARRAY))


def test_detections_in_tracks_with_stable_uuids_out(tracker: tuple[NodeProcess, Probe]) -> None:
    _, probe = tracker
    rng = np.random.default_rng(0)
    obstacles = np.zeros(OBSTACLES, OBSTACLE_DTYPE)
    obstacles["x"] = rng.uniform(5.0, 40.0, OBSTACLES)
    obstacles["y"] = rng.uniform(-10.0, 10.0, OBSTACLES)
    obstacles["length"], obstacles["width"], obstacles["height"] = 4.0, 2.0, 1.5
    obstacles["label"] = [LABEL_CAR, LABEL_PEDESTRIAN] * (OBSTACLES // 2)
    obstacles["score"] = 0.8
    ns = 1_000_000_000

    def send() -> bool:
        obstacles["x"] += 0.1
        probe.detections_pub.publish(_detections(obstacles, ns))  # type: ignore[attr-defined]
        return probe.spin_until(lambda: ns in probe.received["tracked_objects"], DISCOVERY_S)

    # The first messages may go out before the new reader is fully matched.
    for _ in range(int(TIMEOUT_S / DISCOVERY_S)):
        ns += STEP_NS
        if send():
            break
    uuids = []
    for _ in range(8):
        ns += STEP_NS
        assert send(), f"no tracks for stamp {ns}"
        msg = probe.received["tracked_objects"][ns].msg
        # Tracks are published once confirmed (tracking.min_hits_to_confirm).
        if len(msg.objects) == OBSTACLES:
            uuids.append(sorted(bytes(o.object_id.uuid) for o in msg.objects))
    assert len(uuids) >= 4
    tracks = probe.received["tracked_objects"][ns].table
    assert tracks is not None and tracks.shape[0] == OBSTACLES
    # Names through the one class map: cars and pedestrians both ways.
    assert sorted(tracks["label"].tolist()) == sorted(obstacles["label"].tolist())
    assert all(u == uuids[0] for u in uuids) and len(set(uuids[0])) == OBSTACLES
    probe.spin_for(1.0)
    status = probe.status("tracker_node")
    assert status is not None and "Detection3DArray" in status.values["input"]


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
