"""A ROS client of the perception nodes: publishes clouds and odometry, records what comes back."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import numpy as np
import rclpy
from autoware_perception_msgs.msg import DetectedObjects, PredictedObjects, TrackedObjects
from diagnostic_msgs.msg import DiagnosticArray
from nav_msgs.msg import Odometry
from rcl_interfaces.msg import SetParametersResult
from rclpy.context import Context
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.executors import Executor, SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.publisher import Publisher
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.serialization import deserialize_message
from rclpy.subscription import Subscription
from rclpy.task import Future
from sensor_msgs.msg import PointCloud2
from tf2_ros import StaticTransformBroadcaster, TransformBroadcaster
from visualization_msgs.msg import MarkerArray

from dynshape_perception.errors import DynshapeError
from dynshape_perception.io.cdr import NS_PER_S, first_element_header, header_of
from dynshape_perception.io.objects import (
    obstacles_from_detected_objects,
    predictions_from_predicted_objects,
    tracks_from_tracked_objects,
)
from dynshape_perception.io.pointcloud2 import CloudData, cloud_to_table, points_to_cloud
from dynshape_perception.nodes.inputs import waited
from dynshape_perception.nodes.messages import (
    cloud_msg,
    header,
    stamp_ns,
    time_msg,
    transform_msg,
    yaw_quaternion,
)
from dynshape_perception.perception.objects import UuidIndex
from dynshape_perception.perception.records import OBSTACLE_DTYPE, PREDICTION_DTYPE, TRACK_DTYPE
from dynshape_perception.perception.transforms import Matrix

TABLE_TOPICS: dict[str, np.dtype] = {
    "near_obstacles": OBSTACLE_DTYPE,
    "obstacles": OBSTACLE_DTYPE,
    "tracks": TRACK_DTYPE,
    "predictions": PREDICTION_DTYPE,
}
# The standard outputs, read back into the tables (ids of tracks and predictions: small
# integers the probe gives each UUID).
OBJECT_TOPICS: dict[str, Any] = {
    "near_objects": DetectedObjects,
    "detected_objects": DetectedObjects,
    "tracked_objects": TrackedObjects,
    "predicted_objects": PredictedObjects,
}
SPIN_STEP_S = 0.02
RECORD_DEPTH = 100
# The frame the probe's odometry is in, and so the nodes' tracks and predictions.
ODOM_FRAME = "odom"


@dataclass
class Received:
    """One output with its arrival time; a message kept as its CDR bytes until ``msg`` is
    first read, and its table read when ``table`` or ``error`` is first asked for."""

    t_s: float
    frame_id: str
    message: Any
    msg_type: Any = None
    reader: Callable[[Any], np.ndarray] | None = field(default=None, repr=False)
    # When its writer published it (object topics; None where the middleware gives none).
    published_s: float | None = None
    backlog: Backlog | None = field(default=None, repr=False)
    _table: np.ndarray | None = field(default=None, repr=False)
    _error: str = field(default="", repr=False)

    @property
    def msg(self) -> Any:
        if isinstance(self.message, bytes):
            self.message = deserialize_message(self.message, self.msg_type)
        return self.message

    @property
    def table(self) -> np.ndarray | None:
        self._settle()
        return self._table

    @property
    def error(self) -> str:
        self._settle()
        return self._error

    def _settle(self) -> None:
        if self.backlog is not None:
            self.backlog.read_through(self)

    def read(self) -> None:
        reader, self.reader, self.backlog = self.reader, None, None
        if reader is None:
            return
        try:
            self._table = reader(self.message)
        except DynshapeError as err:
            self._error = str(err)


class Backlog:
    """Outputs whose tables are not read yet, in arrival order.

    Reading waits until a table is asked for, so that the callback that stamps an arrival
    never makes the next one wait; it then goes in arrival order up to the one asked for,
    since the ids given to track UUIDs depend on the order the messages are read in.
    """

    def __init__(self) -> None:
        self._items: deque[Received] = deque()

    def add(self, item: Received) -> Received:
        item.backlog = self
        self._items.append(item)
        return item

    def read_through(self, item: Received) -> None:
        while self._items and item.backlog is self:
            self._items.popleft().read()

    def keep(self, wanted: Callable[[Received], bool]) -> None:
        """Leave unread only the items ``wanted`` (the rest were forgotten)."""
        self._items = deque(item for item in self._items if wanted(item))


@dataclass
class Diagnostics:
    t_s: float
    level: int
    message: str
    values: dict[str, str] = field(default_factory=dict)


# The updater's rate and stamp tasks end in this; a node's own tasks are merged into one.
TOPIC_TASK = " topic status"


def spin_executor_until(
    executor: Executor,
    condition: Callable[[], bool],
    timeout_s: float,
    step_s: float = SPIN_STEP_S,
) -> bool:
    """Serve ``executor``'s callbacks until ``condition`` holds (True) or ``timeout_s``
    passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        executor.spin_once(timeout_sec=step_s)
    return True


class SideReader:
    """A node and executor of their own, spun only by ``spin_until``: what its subscriptions
    read waits in the middleware until then, and wakes no one while a frame is in flight."""

    def __init__(
        self, name: str, context: Context | None, namespace: str = "", step_s: float = SPIN_STEP_S
    ) -> None:
        # No parameter services: each is an entity of the wait set rclpy's executor builds
        # again, in Python, at every wake-up.
        self.node = Node(name, context=context, namespace=namespace, start_parameter_services=False)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.step_s = step_s

    def spin_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Take in what came, until ``condition`` holds or ``timeout_s`` passed."""
        return spin_executor_until(self.executor, condition, timeout_s, self.step_s)

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


# rclpy's MessageInfo (a TypedDict in Kilted, a plain dict in Jazzy, which has no such class).
MessageInfo = Mapping[str, object]


# Paired reads of the two clocks taken for each conversion; the tightest pair is used.
CLOCK_PAIRS = 3


def perf_minus_system_s() -> float:
    """``time.perf_counter`` minus the system clock, in seconds, from the tightest of a few
    paired reads: a thread preempted between its two reads would shift every time converted
    with that pair by as long as it waited."""
    best_gap, offset = math.inf, 0.0
    for _ in range(CLOCK_PAIRS):
        before = time.perf_counter()
        system_ns = time.time_ns()
        after = time.perf_counter()
        if after - before < best_gap:
            best_gap, offset = after - before, (before + after) / 2 - system_ns / NS_PER_S
    return offset


def _stamp_s(info: MessageInfo, key: str, offset_s: float) -> float | None:
    ns = info.get(key, 0)
    if not isinstance(ns, int) or ns <= 0:
        return None
    return ns / NS_PER_S + offset_s


def received_at(info: MessageInfo) -> float:
    """When the middleware took the message in, on ``time.perf_counter``'s clock.

    Not when its callback runs: messages of several topics pending together are served in
    the wait set's order, so a callback's time could put a node's output before its input's.
    The middleware stamps the system clock.
    """
    return stamps_of(info)[0]


def stamps_of(info: MessageInfo) -> tuple[float, float | None]:
    """When the message was received (``received_at``) and when its writer published it
    (None where the middleware gives no source time), on one conversion of the clocks.

    Publication times keep the order that causality gives, whatever the load: a node
    publishes its output after its input was published. Reception times at a third process
    need not: there two topics' messages are taken in by the middleware's own threads, in
    whatever order those get a core.
    """
    now = time.perf_counter()
    offset = perf_minus_system_s()
    received = _stamp_s(info, "received_timestamp", offset)
    published = _stamp_s(info, "source_timestamp", offset)
    return (now if received is None else min(received, now)), published


class Probe(Node):
    """Records outputs by stamp (ns) with their arrival time (``time.perf_counter``)."""

    # An instrument: its executor walks every QoS event handler of the node at each wake-up,
    # before the callback that stamps an arrival, and rclpy gives each publisher and
    # subscription two by default.
    def create_publisher(self, *args: Any, **kwargs: Any) -> Publisher[Any]:
        kwargs.setdefault("event_callbacks", PublisherEventCallbacks(use_default_callbacks=False))
        return super().create_publisher(*args, **kwargs)

    def create_subscription(self, *args: Any, **kwargs: Any) -> Subscription[Any]:
        kwargs.setdefault(
            "event_callbacks", SubscriptionEventCallbacks(use_default_callbacks=False)
        )
        return super().create_subscription(*args, **kwargs)

    def __init__(
        self,
        context: Context | None = None,
        name: str = "dynshape_probe",
        namespace: str = "",
        markers: bool = True,
        deferred: Sequence[str] = (),
    ) -> None:
        unknown = set(deferred) - set(OBJECT_TOPICS)
        if unknown:
            raise DynshapeError(f"only object topics can be read later, not {sorted(unknown)}")
        # As the side readers: its executor's wake-ups take a core from the nodes it times.
        super().__init__(name, context=context, namespace=namespace, start_parameter_services=False)
        # The readers of ``deferred`` topics sit on a node and executor of their own, which
        # only ``read_deferred`` spins: a frame's earlier outputs wait in the middleware,
        # which stamps their arrival, and the probe takes no core from the nodes it times
        # while that frame is still in flight.
        self.deferred = tuple(deferred)
        self._later = SideReader(f"{name}_deferred", context, namespace) if self.deferred else None
        qos = QoSProfile(
            history=HistoryPolicy.KEEP_LAST,
            depth=RECORD_DEPTH,
            reliability=ReliabilityPolicy.RELIABLE,
        )
        self.points_pub = self.create_publisher(PointCloud2, "points", qos_profile_sensor_data)
        self.odom_pub = self.create_publisher(Odometry, "odom", qos)
        self.obstacles_pub = self.create_publisher(PointCloud2, "obstacles", qos)
        self.detected_pub = self.create_publisher(DetectedObjects, "detected_objects", qos)
        self.tf_static = StaticTransformBroadcaster(self)
        self.tf = TransformBroadcaster(self)
        self.published: dict[int, float] = {}
        self.received: dict[str, dict[int, Received]] = {
            t: {} for t in (*TABLE_TOPICS, *OBJECT_TOPICS)
        }
        self.received["markers"] = {}
        # Object messages whose header could not be read, by topic: the last reason.
        self.unreadable: dict[str, str] = {}
        self.diagnostics: dict[str, Diagnostics] = {}
        self.tasks: dict[str, Diagnostics] = {}
        self.backlog = Backlog()
        self.track_ids = UuidIndex()
        self.prediction_ids = UuidIndex()
        self.readers: dict[str, Subscription] = {}
        for topic in TABLE_TOPICS:
            self.readers[topic] = self.create_subscription(
                PointCloud2, topic, self._table_cb(topic), qos
            )
        for topic, msg_type in OBJECT_TOPICS.items():
            reader = self._later.node if self._later and topic in self.deferred else self
            # Raw: the arrival is stamped before any message object is built.
            self.readers[topic] = reader.create_subscription(
                msg_type,
                topic,
                self._objects_cb(topic),
                qos,
                raw=True,
                event_callbacks=SubscriptionEventCallbacks(use_default_callbacks=False),
            )
        self._record_qos = qos
        self.read_markers(markers)
        self.writers: dict[str, Publisher] = {
            "points": self.points_pub,
            "odom": self.odom_pub,
            "obstacles": self.obstacles_pub,
            "detected_objects": self.detected_pub,
        }
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, qos)
        self.executor_ = SingleThreadedExecutor(context=context)
        self.executor_.add_node(self)

    def _table_cb(self, topic: str) -> Callable[[PointCloud2, MessageInfo], None]:
        def on_table(msg: PointCloud2, info: MessageInfo) -> None:
            now = received_at(info)
            reader = partial(cloud_to_table, dtype=TABLE_TOPICS[topic])
            item = Received(now, msg.header.frame_id, msg, reader=reader)
            self.received[topic][stamp_ns(msg.header.stamp)] = self.backlog.add(item)

        return on_table

    def _objects_cb(self, topic: str) -> Callable[[bytes, MessageInfo], None]:
        def on_objects(data: bytes, info: MessageInfo) -> None:
            now, published = stamps_of(info)
            try:
                sec, nanosec, frame_id = header_of(data)
            except DynshapeError as err:
                self.unreadable[topic] = str(err)
                return
            reader = partial(self._object_table, topic)
            item = Received(
                now, frame_id, data, OBJECT_TOPICS[topic], reader, published_s=published
            )
            self.received[topic][sec * NS_PER_S + nanosec] = self.backlog.add(item)

        return on_objects

    def _object_table(self, topic: str, msg: bytes) -> np.ndarray:
        """The message as its table: obstacles, tracks, or one row per path pose."""
        if topic == "tracked_objects":
            states = tracks_from_tracked_objects(msg)
            table = states.tracks
            table["id"] = self.track_ids.update(states.uuids)
            return table
        if topic == "predicted_objects":
            objects = predictions_from_predicted_objects(msg)
            ids = self.prediction_ids.update(
                np.array([np.frombuffer(o.uuid, np.uint8) for o in objects]).reshape(-1, 16)
            )
            rows = [
                (int(agent), k, step, float(x), float(y), float(o.confidences[k]))
                for agent, o in zip(ids.tolist(), objects, strict=True)
                for k, path in enumerate(o.paths)
                for step, (x, y, _) in enumerate(path.tolist())
            ]
            return np.array(rows, dtype=PREDICTION_DTYPE)
        return obstacles_from_detected_objects(msg)

    def read_markers(self, read: bool) -> None:
        """Subscribe to ``markers``, or leave them unread (the nodes then build none)."""
        reader = self.readers.pop("markers", None)
        if reader is not None:
            self.destroy_subscription(reader)
        if read:
            self.readers["markers"] = self.create_subscription(
                MarkerArray, "markers", self._on_markers, self._record_qos, raw=True
            )

    def _on_markers(self, data: bytes) -> None:
        now = time.perf_counter()
        try:
            first = first_element_header(data)
        except DynshapeError as err:
            self.unreadable["markers"] = str(err)
            return
        if first is not None:
            sec, nanosec, frame_id = first
            item = Received(now, frame_id, data, msg_type=MarkerArray)
            self.received["markers"][sec * NS_PER_S + nanosec] = item

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        """Every status by name; a node's own tasks (not the topic rates) also merged under
        its name: the worst level, the problems, all values."""
        now = time.perf_counter()
        merged: dict[str, Diagnostics] = {}
        for status in msg.status:
            level = (
                int.from_bytes(status.level, "little")
                if isinstance(status.level, bytes)
                else int(status.level)
            )
            item = Diagnostics(
                now, level, status.message, {kv.key: kv.value for kv in status.values}
            )
            self.tasks[status.name] = item
            node, _, task = status.name.partition(": ")
            if task.endswith(TOPIC_TASK):
                continue
            into = merged.setdefault(node, Diagnostics(now, 0, "", {}))
            into.level = max(into.level, level)
            if level:
                into.message = "; ".join(m for m in (into.message, status.message) if m)
            into.values.update(item.values)
        for node, item in merged.items():
            item.message = item.message or "ok"
            self.diagnostics[node] = item

    def forget(self, upto_ns: int) -> None:
        """Drop what was published and received up to stamp ``upto_ns``: a long run would
        otherwise keep every output (a soak: hundreds of thousands)."""
        for record in self.received.values():
            for stamp in [ns for ns in record if ns <= upto_ns]:
                del record[stamp]
        for stamp in [ns for ns in self.published if ns <= upto_ns]:
            del self.published[stamp]
        kept = {id(item) for record in self.received.values() for item in record.values()}
        self.backlog.keep(lambda item: id(item) in kept)

    # -- publishing ---------------------------------------------------------------------
    def publish_cloud(self, cloud: CloudData, ns: int, frame_id: str = "lidar") -> None:
        msg = cloud_msg(cloud, header(time_msg(ns), frame_id))
        self.published[ns] = time.perf_counter()
        self.points_pub.publish(msg)

    def publish_points(self, points: np.ndarray, ns: int, frame_id: str = "lidar") -> None:
        self.publish_cloud(points_to_cloud(points), ns, frame_id)

    def publish_transforms(
        self, transforms: Sequence[tuple[str, str, Matrix]], ns: int = 0, static: bool = False
    ) -> None:
        """(parent, child, transform) on /tf_static (latched: one message holds them all) or
        on /tf at stamp ``ns``."""
        msgs = [transform_msg(parent, child, m, time_msg(ns)) for parent, child, m in transforms]
        if static:
            self.tf_static.sendTransform(msgs)
        else:
            self.tf.sendTransform(msgs)

    def publish_odometry(
        self,
        ns: int,
        x: float,
        y: float,
        yaw: float,
        frame_id: str = ODOM_FRAME,
        child_frame_id: str = "base_link",
    ) -> None:
        msg = Odometry()
        msg.header = header(time_msg(ns), frame_id)
        msg.child_frame_id = child_frame_id
        msg.pose.pose.position.x, msg.pose.pose.position.y = float(x), float(y)
        msg.pose.pose.orientation = yaw_quaternion(yaw)
        self.odom_pub.publish(msg)

    # -- waiting ------------------------------------------------------------------------
    def spin_for(self, seconds: float) -> None:
        """Serve callbacks for ``seconds``, returning at their end, not a spin step after."""
        deadline = time.monotonic() + seconds
        while (left_s := deadline - time.monotonic()) > 0.0:
            self.executor_.spin_once(timeout_sec=min(SPIN_STEP_S, left_s))

    def spin_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        return spin_executor_until(self.executor_, condition, timeout_s)

    def await_objects(
        self, topics: Sequence[str], condition: Callable[[], bool], timeout_s: float
    ) -> bool:
        """``spin_until`` served by the readers of ``topics`` (object topics, not deferred)
        alone: a wait set of just them, each message straight to its callback, as the nodes'
        input threads take theirs. rclpy's executor builds a wait set of every entity of the
        probe, in Python, at each wake-up: up to a millisecond of a core a frame, taken from
        the nodes being timed. What else comes waits in the middleware for ``spin_until``."""
        others = [t for t in topics if t not in OBJECT_TOPICS or t in self.deferred]
        if others:
            raise DynshapeError(f"only object topics the probe reads at once, not {others}")
        readers = [self.readers[t] for t in topics]
        handle = self.context.handle
        if handle is None:
            raise DynshapeError("the probe's context has shut down")
        wait_set = _rclpy.WaitSet(len(readers), 0, 0, 0, 0, 0, handle)
        deadline = time.monotonic() + timeout_s
        while not condition():
            left_s = deadline - time.monotonic()
            if left_s <= 0.0:
                return False
            with waited(wait_set, readers, int(min(left_s, SPIN_STEP_S) * NS_PER_S)) as ready:
                for reader in readers:
                    if reader.handle.pointer not in ready:
                        continue
                    taken = reader.handle.take_message(reader.msg_type, reader.raw)
                    if taken is not None:
                        # The probe's object readers take the message and its info.
                        cast(Callable[[Any, Any], None], reader.callback)(*taken)
        return True

    def read_deferred(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Take what came on the ``deferred`` topics until ``condition`` holds."""
        if self._later is None:
            return condition()
        return self._later.spin_until(condition, timeout_s)

    def destroy_node(self) -> None:
        if self._later is not None:
            self._later.close()
        super().destroy_node()

    def wait_future(self, future: Future, timeout_s: float) -> Any:
        if not self.spin_until(future.done, timeout_s):
            raise TimeoutError(f"no reply within {timeout_s} s")
        return future.result()

    def wait_for_graph(
        self, subscribers: Mapping[str, int], publishers: Mapping[str, int], timeout_s: float
    ) -> bool:
        """Until every topic has at least that many subscribers and publishers, and the
        probe's own endpoints on those topics are matched with as many.

        The graph shows an endpoint before DDS has matched it with the probe's: a
        best-effort cloud published in between is lost without a trace."""

        def matched() -> bool:
            return all(
                self.writers[t].get_subscription_count() >= n
                for t, n in subscribers.items()
                if t in self.writers
            ) and all(
                self.readers[t].get_publisher_count() >= n
                for t, n in publishers.items()
                if t in self.readers
            )

        return self.spin_until(
            lambda: (
                all(self.count_subscribers(t) >= n for t, n in subscribers.items())
                and all(self.count_publishers(t) >= n for t, n in publishers.items())
                and matched()
            ),
            timeout_s,
        )

    def status(self, node_name: str) -> Diagnostics | None:
        """The node's own tasks merged (input, pose, jit, tiers)."""
        for name, diag in self.diagnostics.items():
            if name.lstrip("/").split("/")[-1] == node_name:
                return diag
        return None

    def task(self, node_name: str, task: str) -> Diagnostics | None:
        """One status of the node: a task (``pose``) or a topic's (``/points topic status``)."""
        for name, diag in self.tasks.items():
            node, _, rest = name.partition(": ")
            if node.lstrip("/").split("/")[-1] == node_name and rest == task:
                return diag
        return None

    # -- parameters ---------------------------------------------------------------------
    def parameter_client(self, node_name: str, timeout_s: float) -> AsyncParameterClient:
        client = AsyncParameterClient(self, node_name)
        if not self.spin_until(lambda: client.services_are_ready(), timeout_s):
            raise TimeoutError(f"parameter services of {node_name} not ready in {timeout_s} s")
        return client

    def remote_parameter_names(self, node_name: str, timeout_s: float) -> list[str]:
        client = self.parameter_client(node_name, timeout_s)
        return list(self.wait_future(client.list_parameters(), timeout_s).result.names)

    def set_remote_parameters(
        self, node_name: str, values: Mapping[str, Any], timeout_s: float
    ) -> list[SetParametersResult]:
        client = self.parameter_client(node_name, timeout_s)
        params = [Parameter(name, value=value) for name, value in values.items()]
        return list(self.wait_future(client.set_parameters(params), timeout_s).results)


@contextmanager
def probe_session(
    domain_id: int,
    name: str = "dynshape_probe",
    namespace: str = "",
    markers: bool = True,
    deferred: Sequence[str] = (),
) -> Iterator[Probe]:
    """A probe in its own rclpy context on ``domain_id`` (no signal handlers installed); its
    topics resolve in ``namespace``; without ``markers`` it leaves that topic unread; it
    reads the ``deferred`` topics only in ``read_deferred``."""
    context = Context()
    rclpy.init(context=context, domain_id=domain_id)
    probe: Probe | None = None
    try:
        probe = Probe(
            context=context, name=name, namespace=namespace, markers=markers, deferred=deferred
        )
        yield probe
    finally:
        if probe is not None:
            probe.executor_.shutdown(timeout_sec=1.0)
            probe.destroy_node()
        context.try_shutdown()
