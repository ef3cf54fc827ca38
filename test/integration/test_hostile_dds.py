"""The four node executables over DDS: the worst bytes on every input, then a second signal."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import rclpy
from autoware_perception_msgs.msg import DetectedObjects, PredictedObjects, TrackedObjects
from nav_msgs.msg import Odometry
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import serialize_message
from sensor_msgs.msg import PointCloud2
from tf2_msgs.msg import TFMessage

from dynshape_perception.io.pointcloud2 import points_to_cloud
from dynshape_perception.nodes.messages import cloud_msg, header, time_msg
from dynshape_perception.resources import config_path
from dynshape_perception.testing.hostile import sample, worst
from dynshape_perception.testing.processes import (
    NodeProcess,
    dds_env,
    domain_lease,
    start_node,
)

pytestmark = pytest.mark.ros

STARTUP_S = 150.0
ANSWER_S = 60.0
EXIT_S = 30.0
# The two stop signals each node gets, and the gap between them: within its shutdown.
SIGNALS = {
    "pc": (signal.SIGTERM, signal.SIGINT),
    "pp": (signal.SIGINT, signal.SIGTERM),
    "tr": (signal.SIGTERM, signal.SIGTERM),
    "pr": (signal.SIGINT, signal.SIGINT),
}
GAPS_S = (0.05, 0.15, 0.3, 0.1)
# Each node in a namespace of its own: its relative topics are its alone, /tf is shared.
NODES = {
    "pc": ("pointcloud_node", ("points",), ("detected_objects", DetectedObjects)),
    "pp": ("perception_pipeline", ("points", "odom"), ("tracked_objects", TrackedObjects)),
    "tr": ("tracker_node", ("detected_objects", "odom"), ("tracked_objects", TrackedObjects)),
    "pr": ("prediction_node", ("tracked_objects", "odom"), ("predicted_objects", PredictedObjects)),
}
TYPES = {
    "points": PointCloud2,
    "odom": Odometry,
    "detected_objects": DetectedObjects,
    "tracked_objects": TrackedObjects,
    "/tf": TFMessage,
    "/tf_static": TFMessage,
}


def _cloud(ns: int) -> bytes:
    """A ground patch ahead of the vehicle in its frame: nothing cropped, nothing looked up."""
    x, y = np.meshgrid(np.linspace(3.0, 20.0, 35), np.linspace(-6.0, 6.0, 25))
    points = np.stack([x.ravel(), y.ravel(), np.zeros(x.size), np.full(x.size, 0.3)], axis=1)
    msg = cloud_msg(points_to_cloud(points.astype(np.float32)), header(time_msg(ns), "base_link"))
    return bytes(serialize_message(msg))


def _valid(topic: str, ns: int) -> bytes:
    return _cloud(ns) if topic == "points" else sample(topic, ns)


class Client(Node):
    """Publishes bytes on every node's inputs and counts each node's answers."""

    def __init__(self, context: Context) -> None:
        super().__init__("hostile_client", context=context)
        qos = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
        self.pubs = {
            (ns, topic): self.create_publisher(TYPES[topic], f"/{ns}/{topic}", qos)
            for ns, (_, topics, _) in NODES.items()
            for topic in topics
        }
        self.pubs[("", "/tf")] = self.create_publisher(TFMessage, "/tf", qos)
        static = QoSProfile(depth=50, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.pubs[("", "/tf_static")] = self.create_publisher(TFMessage, "/tf_static", static)
        self.answers = dict.fromkeys(NODES, 0)
        for ns, (_, _, (topic, msg_type)) in NODES.items():
            self.create_subscription(msg_type, f"/{ns}/{topic}", self._count(ns), qos, raw=True)
        self.executor_ = SingleThreadedExecutor(context=context)
        self.executor_.add_node(self)

    def _count(self, ns: str) -> Callable[[bytes], None]:
        def on(_: bytes) -> None:
            self.answers[ns] += 1

        return on

    def ready(self) -> bool:
        outputs = (f"/{ns}/{out[0]}" for ns, (_, _, out) in NODES.items())
        return all(p.get_subscription_count() > 0 for p in self.pubs.values()) and all(
            self.count_publishers(topic) > 0 for topic in outputs
        )


def _spin(client: Client, until: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not until():
        if time.monotonic() > deadline:
            return False
        client.executor_.spin_once(timeout_sec=0.05)
    return True


@dataclass
class Running:
    procs: dict[str, NodeProcess]
    client: Client


@pytest.fixture(scope="module")
def running(
    tmp_path_factory: pytest.TempPathFactory, node_overrides: dict[str, bool | int | float | str]
) -> Iterator[Running]:
    """The four node executables, each in a namespace of its own on one domain, and a client
    there: started once for the tests of this module, in their order."""
    overrides = {**node_overrides, "jit.mode": "off"}
    log_dir = tmp_path_factory.mktemp("hostile_dds")
    with domain_lease() as domain:
        procs: dict[str, NodeProcess] = {}
        context = Context()
        client: Client | None = None
        try:
            for ns, (executable, _, _) in NODES.items():
                procs[ns] = start_node(
                    executable,
                    env=dds_env(domain),
                    log_dir=log_dir,
                    params_file=config_path("x86_dev.param.yaml"),
                    overrides=overrides,
                    remaps=[("__ns", f"/{ns}")],
                    name=f"{executable}_{ns}",
                )
            rclpy.init(context=context, domain_id=domain)
            client = Client(context)
            assert _spin(client, client.ready, STARTUP_S), {
                n: p.log()[-1500:] for n, p in procs.items()
            }
            yield Running(procs, client)
        finally:
            if client is not None:
                client.executor_.shutdown(timeout_sec=1.0)
                client.destroy_node()
            context.try_shutdown()
            for proc in procs.values():
                proc.stop(signal.SIGKILL)


def test_the_worst_bytes_on_every_input_leave_every_node_answering(running: Running) -> None:
    procs, client = running.procs, running.client
    for (_, topic), pub in client.pubs.items():
        for data in worst(topic, sample(topic, time.time_ns())).values():
            pub.publish(data)
        _spin(client, lambda: False, 0.05)
    _spin(client, lambda: False, 1.0)
    assert all(p.alive() for p in procs.values()), {n: p.log()[-3000:] for n, p in procs.items()}
    answered = dict(client.answers)

    def all_answer() -> bool:
        ns_now = time.time_ns()
        for (_, topic), pub in client.pubs.items():
            if topic == "odom":
                pub.publish(sample("odom", ns_now))
        for (ns, topic), pub in client.pubs.items():
            if ns and topic != "odom":
                pub.publish(_valid(topic, ns_now))
        _spin(client, lambda: False, 0.5)
        return all(client.answers[ns] > answered[ns] for ns in NODES)

    assert _spin(client, all_answer, ANSWER_S), (
        client.answers,
        {n: p.log()[-3000:] for n, p in procs.items()},
    )
    for ns, proc in procs.items():
        log = proc.log()
        assert "internal_error" not in log, log[-3000:]
        assert "dropped input" in log, ns


def test_a_second_signal_during_shutdown_still_exits_0(running: Running) -> None:
    """SIGINT or SIGTERM again while the node closes after the first (its executor, engines
    and rclpy): exit status 0 all the same, not death by the signal."""
    procs = running.procs
    assert all(p.alive() for p in procs.values())
    for (ns, (first, second)), gap in zip(SIGNALS.items(), GAPS_S, strict=True):
        procs[ns].popen.send_signal(first)
        time.sleep(gap)
        procs[ns].popen.send_signal(second)
    codes: dict[str, int | None] = {}
    for ns, proc in procs.items():
        try:
            codes[ns] = proc.popen.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            codes[ns] = None
    assert codes == dict.fromkeys(NODES, 0), {ns: procs[ns].log()[-2000:] for ns in NODES}
