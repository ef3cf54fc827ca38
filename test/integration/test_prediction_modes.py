"""prediction_node over DDS: incremental and full predict alike; speculation changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rclpy
from autoware_perception_msgs.msg import PredictedObjects, TrackedObjects
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from dynshape_perception.io.objects import (
    TrackStates,
    predictions_from_predicted_objects,
    tracked_objects,
)
from dynshape_perception.io.tables import LABEL_PEDESTRIAN, TRACK_DTYPE
from dynshape_perception.nodes.messages import ros_message, stamp_ns
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.resources import config_path
from dynshape_perception.testing.processes import (
    NodeProcess,
    dds_env,
    domain_lease,
    start_node,
)
from dynshape_perception.tools.sim.scenes import pedestrian_scene

RTOL, ATOL = 1e-4, 1e-5
FRAMES = 90
AGENTS = 10
FIRST_NS = 20_000_000_000
STEP_NS = 100_000_000
TIMEOUT_S = 20.0
STARTUP_S = 120.0
# Each variant is one prediction_node in a namespace of its own.
VARIANTS: dict[str, dict[str, bool | int | float | str]] = {
    "full": {"prediction.mode": "full"},
    "incremental": {"prediction.mode": "incremental"},
    "speculative": {"prediction.mode": "incremental", "prediction.speculation": True},
}
# Long enough that the frames hold both kinds of agent: below the window and at it.
HISTORY_STEPS = 16
SPIN_S = 0.02


@dataclass
class Harness:
    node: Node
    executor: SingleThreadedExecutor
    publishers: dict[str, Any]
    received: dict[str, dict[int, Any]]
    diagnostics: dict[str, dict[str, str]]

    def spin_until(self, done: Any, timeout_s: float) -> bool:
        end = rclpy.clock.Clock().now().nanoseconds + int(timeout_s * 1e9)
        while not done():
            if rclpy.clock.Clock().now().nanoseconds > end:
                return False
            self.executor.spin_once(timeout_sec=SPIN_S)
        return True


def _harness(context: Context) -> Harness:
    node = Node("prediction_modes_probe", context=context)
    qos = QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=100, reliability=ReliabilityPolicy.RELIABLE
    )
    received: dict[str, dict[int, Any]] = {name: {} for name in VARIANTS}
    diagnostics: dict[str, dict[str, str]] = {}
    publishers = {}
    for name in VARIANTS:
        publishers[name] = node.create_publisher(TrackedObjects, f"/{name}/tracked_objects", qos)

        def keep(msg: Any, name: str = name) -> None:
            received[name][stamp_ns(msg.header.stamp)] = msg

        node.create_subscription(PredictedObjects, f"/{name}/predicted_objects", keep, qos)

    def on_diagnostics(msg: Any) -> None:
        for status in msg.status:
            diagnostics[status.name] = {kv.key: kv.value for kv in status.values}

    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, qos)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    return Harness(node, executor, publishers, received, diagnostics)


@pytest.fixture(scope="module")
def harness(
    node_overrides: dict[str, bool | int | float | str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Harness]:
    logs = tmp_path_factory.mktemp("prediction_modes_logs")
    with ExitStack() as stack:
        domain = stack.enter_context(domain_lease())
        env = dds_env(domain)
        processes: list[NodeProcess] = []
        for name, overrides in VARIANTS.items():
            processes.append(
                start_node(
                    "prediction_node",
                    env=env,
                    log_dir=logs,
                    params_file=config_path("x86_dev.param.yaml"),
                    overrides={
                        **node_overrides,
                        **overrides,
                        "prediction.history_steps": HISTORY_STEPS,
                        # Generic kernels compute a row alike in any batch: exact comparisons.
                        "jit.mode": "off",
                    },
                    remaps=[("__ns", f"/{name}")],
                    name=f"prediction_{name}",
                )
            )
            stack.callback(processes[-1].stop)
        context = Context()
        rclpy.init(context=context, domain_id=domain)
        stack.callback(context.try_shutdown)
        harness = _harness(context)
        stack.callback(harness.node.destroy_node)
        ready = harness.spin_until(
            lambda: all(p.get_subscription_count() for p in harness.publishers.values()),
            STARTUP_S,
        )
        assert ready, "\n".join(p.log()[-2000:] for p in processes)
        yield harness


def _tables(frames: int) -> Iterator[tuple[int, np.ndarray]]:
    paths = pedestrian_scene(seed=7, num_agents=AGENTS, num_steps=frames, dt_s=STEP_NS * 1e-9)
    for k in range(frames):
        # Agent 3 leaves half way; the others stay.
        keep = np.arange(AGENTS) != 3 if k > frames // 2 else np.ones(AGENTS, bool)
        rows = np.zeros(int(keep.sum()), TRACK_DTYPE)
        rows["id"] = np.arange(1, AGENTS + 1)[keep]
        rows["x"], rows["y"] = paths[keep, k, 0], paths[keep, k, 1]
        rows["length"] = rows["width"] = 0.6
        rows["height"] = 1.7
        rows["score"] = 0.9
        rows["label"] = LABEL_PEDESTRIAN
        yield FIRST_NS + k * STEP_NS, rows


def _states(rows: np.ndarray) -> TrackStates:
    namespace = uuid.UUID(int=7)
    uuids = np.array(
        [np.frombuffer(uuid.uuid5(namespace, str(int(i))).bytes, np.uint8) for i in rows["id"]],
        dtype=np.uint8,
    ).reshape(-1, 16)
    n = rows.shape[0]
    return TrackStates(rows, uuids, np.full(n, 0.9), np.zeros(n, np.int64))


def _paths(msg: Any) -> dict[bytes, tuple[np.ndarray, np.ndarray]]:
    return {
        p.uuid: (np.asarray(p.confidences), np.stack([q[:, :2] for q in p.paths]))
        for p in predictions_from_predicted_objects(msg)
        if p.paths
    }


def test_every_mode_predicts_alike_through_the_node(harness: Harness, tmp_path: Path) -> None:
    predicted_agents = 0
    for ns, rows in _tables(FRAMES):
        for name in VARIANTS:
            msg = tracked_objects(ros_message, ns, "map", _states(rows), ObjectParams())
            harness.publishers[name].publish(msg)
        got = harness.spin_until(
            lambda ns=ns: all(ns in harness.received[name] for name in VARIANTS), TIMEOUT_S
        )
        assert got, f"no predictions of stamp {ns} from every variant"
        full = _paths(harness.received["full"][ns])
        incremental = _paths(harness.received["incremental"][ns])
        assert incremental.keys() == full.keys()
        for key, (probs, paths) in incremental.items():
            np.testing.assert_allclose(paths, full[key][1], rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(probs, full[key][0], rtol=RTOL, atol=ATOL)
        speculative = _paths(harness.received["speculative"][ns])
        assert speculative.keys() == incremental.keys()
        for key, (probs, paths) in speculative.items():
            np.testing.assert_array_equal(paths, incremental[key][1])
            np.testing.assert_array_equal(probs, incremental[key][0])
        predicted_agents += len(full)
    assert predicted_agents > AGENTS * FRAMES // 2

    def reported() -> bool:
        tasks = [harness.diagnostics.get(f"prediction_{n}: prediction") for n in VARIANTS]
        return all(t is not None and int(t["prediction.frames"]) == FRAMES for t in tasks)

    assert harness.spin_until(reported, TIMEOUT_S)
    full_task = harness.diagnostics["prediction_full: prediction"]
    incremental = harness.diagnostics["prediction_incremental: prediction"]
    speculative = harness.diagnostics["prediction_speculative: prediction"]
    assert full_task["prediction.mode"] == "full" and int(full_task["prediction.forward_calls"]) > 0
    assert int(incremental["prediction.step_decode_calls"]) > 0
    assert int(incremental["prediction.forwarded"]) > 0
    assert int(speculative["prediction.speculation.candidates"]) > 0
    assert "prediction.speculation.saved_ms_total" in speculative
