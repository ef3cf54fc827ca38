"""prediction_node processes in namespaces of their own, fed tracked objects over DDS."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from autoware_perception_msgs.msg import PredictedObjects, TrackedObjects
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from dynshape_perception.errors import ConfigError
from dynshape_perception.io.objects import TrackStates, tracked_objects
from dynshape_perception.nodes.messages import stamp_ns
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.perception.records import TRACK_DTYPE
from dynshape_perception.resources import config_path
from dynshape_perception.testing.processes import (
    NodeProcess,
    dds_env,
    dds_settings_applied,
    domain_lease,
    start_node,
)

Value = bool | int | float | str
SPIN_S = 0.005
DEPTH = 100
UUID_NAMESPACE = uuid.UUID(int=7)
EXISTENCE = 0.9
FIXED_FRAME = "map"
PREDICTION_TASK = "prediction"


def tracked_message(stamp: int, rows: np.ndarray) -> bytes:
    """TrackedObjects (CDR) of track table ``rows``, a UUID per id (the same for a given id)."""
    names = (uuid.uuid5(UUID_NAMESPACE, str(int(i))).bytes for i in rows["id"])
    uuids = np.array([np.frombuffer(b, np.uint8) for b in names], dtype=np.uint8).reshape(-1, 16)
    n = rows.shape[0]
    states = TrackStates(rows, uuids, np.full(n, EXISTENCE), np.zeros(n, np.int64))
    return tracked_objects(stamp, FIXED_FRAME, states, ObjectParams())


@dataclass
class PredictionSession:
    """Publishes to ``/<name>/tracked_objects`` of each variant and records what comes back
    on ``/<name>/predicted_objects`` by stamp, with the round trip."""

    node: Node
    executor: SingleThreadedExecutor
    processes: list[NodeProcess]
    publishers: dict[str, Any] = field(default_factory=dict)
    received: dict[str, dict[int, Any]] = field(default_factory=dict)
    arrived_s: dict[str, dict[int, float]] = field(default_factory=dict)
    sent_s: dict[str, dict[int, float]] = field(default_factory=dict)
    tasks: dict[str, dict[str, str]] = field(default_factory=dict)
    # Each diagnostics task's latest message, by task name.
    messages: dict[str, str] = field(default_factory=dict)

    def spin_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > end:
                return False
            self.executor.spin_once(timeout_sec=SPIN_S)
        return True

    def check_alive(self) -> None:
        for proc in self.processes:
            if not proc.alive():
                raise ConfigError(f"{proc.name} exited:\n{proc.log()[-2000:]}")

    def publish(self, name: str, stamp: int, rows: np.ndarray) -> None:
        msg = tracked_message(stamp, rows)
        self.sent_s[name][stamp] = time.perf_counter()
        self.publishers[name].publish(msg)

    def round_trip(self, name: str, stamp: int, rows: np.ndarray, timeout_s: float) -> float | None:
        """Publish one table and wait for its predictions: milliseconds, None if none came."""
        self.publish(name, stamp, rows)
        if not self.spin_until(lambda: stamp in self.received[name], timeout_s):
            return None
        return (self.arrived_s[name][stamp] - self.sent_s[name][stamp]) * 1000.0

    def forget(self, upto_stamp: int) -> None:
        """Drop what was sent and received up to ``upto_stamp``: a long benchmark would
        otherwise keep every PredictedObjects it got, thousands, as rclpy objects."""
        for record in (*self.received.values(), *self.arrived_s.values(), *self.sent_s.values()):
            for stamp in [s for s in record if s <= upto_stamp]:
                del record[stamp]

    def prime(self, first_ns: int, step_ns: int, attempts: int, timeout_s: float) -> int:
        """Send empty tables until every node answers one (discovery settles); next stamp."""
        stamp = first_ns
        empty = np.zeros(0, dtype=TRACK_DTYPE)
        for _ in range(attempts):
            for name in self.publishers:
                self.publish(name, stamp, empty)

            def answered_all(stamp: int = stamp) -> bool:
                return all(stamp in got for got in self.received.values())

            answered = self.spin_until(answered_all, timeout_s)
            stamp += step_ns
            if answered:
                return stamp
            self.check_alive()
        raise ConfigError(f"the prediction nodes did not answer in {attempts} attempts")

    def task(self, name: str, task: str = PREDICTION_TASK) -> dict[str, str] | None:
        return self.tasks.get(f"prediction_{name}: {task}")

    def message(self, name: str, task: str = PREDICTION_TASK) -> str | None:
        return self.messages.get(f"prediction_{name}: {task}")


@contextmanager
def prediction_session(
    variants: Mapping[str, Mapping[str, Value]],
    overrides: Mapping[str, Value] | None = None,
    log_dir: Path | None = None,
    startup_timeout_s: float = 120.0,
) -> Iterator[PredictionSession]:
    """One prediction_node per variant (its parameter overrides), named ``prediction_<name>``
    in namespace ``/<name>``, on a leased domain; always stopped again."""
    with ExitStack() as stack:
        domain = stack.enter_context(domain_lease())
        logs = log_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        env = dds_env(domain)
        processes: list[NodeProcess] = []
        for name, values in variants.items():
            proc = start_node(
                "prediction_node",
                env=env,
                log_dir=logs,
                params_file=config_path("x86_dev.param.yaml"),
                overrides={**(overrides or {}), **values},
                remaps=[("__ns", f"/{name}")],
                name=f"prediction_{name}",
            )
            processes.append(proc)
            stack.callback(proc.stop)
        stack.enter_context(dds_settings_applied())
        context = Context()
        rclpy.init(context=context, domain_id=domain)
        stack.callback(context.try_shutdown)
        node = Node("prediction_session", context=context)
        stack.callback(node.destroy_node)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        session = PredictionSession(node, executor, processes)
        _wire(session, list(variants))
        if not session.spin_until(
            lambda: all(p.get_subscription_count() for p in session.publishers.values()),
            startup_timeout_s,
        ):
            session.check_alive()
            raise ConfigError(f"the prediction nodes were not up within {startup_timeout_s} s")
        yield session


def _wire(session: PredictionSession, names: list[str]) -> None:
    qos = QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=DEPTH, reliability=ReliabilityPolicy.RELIABLE
    )
    node = session.node
    for name in names:
        session.received[name], session.arrived_s[name], session.sent_s[name] = {}, {}, {}
        session.publishers[name] = node.create_publisher(
            TrackedObjects, f"/{name}/tracked_objects", qos
        )

        def keep(msg: Any, name: str = name) -> None:
            stamp = stamp_ns(msg.header.stamp)
            session.arrived_s[name][stamp] = time.perf_counter()
            session.received[name][stamp] = msg

        node.create_subscription(PredictedObjects, f"/{name}/predicted_objects", keep, qos)

    def on_diagnostics(msg: Any) -> None:
        for status in msg.status:
            session.tasks[status.name] = {kv.key: kv.value for kv in status.values}
            session.messages[status.name] = status.message

    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, qos)
