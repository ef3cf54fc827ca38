"""DDS replay: publish a bag's messages to running nodes in (scaled) real time with /clock."""

from __future__ import annotations

import importlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rclpy
from rclpy.duration import Duration
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import PointCloud2

from dynshape_perception.errors import ConfigError
from dynshape_perception.io import bags
from dynshape_perception.io.playback import (
    CLOCK_TOPIC,
    PlayItem,
    Track,
    check_play_timing,
    header_stamp,
    plan_tracks,
    timetable,
)
from dynshape_perception.io.qos import TopicQos
from dynshape_perception.io.topics import OBJECT_TOPICS, OUTPUT_TOPICS, Skipped

NODE_NAME = "dynshape_bag_player"
DEFAULT_CLOCK_HZ = 100.0
QOS_DEPTH = 10
DISCOVERY_SETTLE_S = 0.5
FLUSH_TIMEOUT_S = 5.0


def message_class(msgtype: str) -> Any | None:
    """The rclpy message class of ``pkg/msg/Name``, or None where it is not installed."""
    package, kind, name = msgtype.split("/")
    try:
        return getattr(importlib.import_module(f"{package}.{kind}"), name)
    except (ImportError, AttributeError):
        return None


@dataclass(frozen=True)
class PlayOptions:
    topics: tuple[str, ...] | None = None
    remaps: dict[str, str] = field(default_factory=dict)
    rate: float = 1.0
    loop: bool = False
    start_offset_s: float = 0.0
    clock_hz: float = DEFAULT_CLOCK_HZ
    wait_for_subscribers_s: float = 0.0
    # Seconds to keep listening for outputs after the last message (recording only).
    drain_s: float = 1.0
    # Stop after this many frames of the driver topic (points, else detections).
    max_frames: int | None = None
    # Per topic (its name in the bag): reliability, durability, history, depth to offer
    # instead of the recorded QoS (tools.replay.qos.parse_overrides).
    qos_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_play_timing(self.start_offset_s, self.rate)
        if not (math.isfinite(self.clock_hz) and self.clock_hz > 0):
            raise ConfigError(
                f"the clock rate must be a finite number > 0 Hz, got {self.clock_hz!r}"
            )
        for name in ("wait_for_subscribers_s", "drain_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.max_frames is not None and (
            isinstance(self.max_frames, bool)
            or not isinstance(self.max_frames, int)
            or self.max_frames < 1
        ):
            raise ConfigError(f"max_frames must be an integer >= 1, got {self.max_frames!r}")


@dataclass
class PlayResult:
    tracks: list[Track]
    skipped: list[Skipped]
    published: dict[str, int] = field(default_factory=dict)
    undecodable: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)
    # Per driver stamp: wall seconds from its publication to each output's arrival.
    latency_s: dict[int, dict[str, float]] = field(default_factory=dict)
    wall_s: float = 0.0
    interrupted: bool = False


class OutputListener:
    """Receives the nodes' standard outputs and debug tables raw (no decoding) for a sink."""

    def __init__(
        self,
        node: Node,
        sink: Callable[[str, int, bytes], None],
        on_stamp: Callable[[str, int], None],
        object_topics: Sequence[str] = (),
    ) -> None:
        qos = QoSProfile(depth=QOS_DEPTH, reliability=ReliabilityPolicy.RELIABLE)
        types = {t: PointCloud2 for t in OUTPUT_TOPICS}
        for topic in object_topics:
            cls = message_class(OBJECT_TOPICS[topic])
            if cls is not None:
                types[topic] = cls
        self._subs = [
            node.create_subscription(
                cls, topic, self._callback(topic, sink, on_stamp), qos, raw=True
            )
            for topic, cls in types.items()
        ]

    @staticmethod
    def _callback(
        topic: str, sink: Callable[[str, int, bytes], None], on_stamp: Callable[[str, int], None]
    ) -> Callable[[Any], None]:
        def receive(raw: Any) -> None:
            data = bytes(raw)
            stamp = header_stamp(data)
            on_stamp(topic, stamp)
            sink(topic, stamp, data)

        return receive


class BagPlayer:
    """Publishes a bag's topics with their recorded timing, and /clock for use_sim_time."""

    def __init__(self, node: Node) -> None:
        self.node = node
        data_qos = QoSProfile(
            depth=QOS_DEPTH,
            history=HistoryPolicy.KEEP_LAST,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.VOLATILE,
        )
        self._clock = node.create_publisher(Clock, CLOCK_TOPIC, data_qos)
        self._publishers: dict[str, Any] = {}

    def publish_clock(self, ns: int) -> None:
        msg = Clock()
        msg.clock.sec, msg.clock.nanosec = divmod(int(ns), 1_000_000_000)
        self._clock.publish(msg)

    def _publisher(self, track: Track) -> Any:
        pub = self._publishers.get(track.name)
        if pub is None:
            cls = message_class(track.msgtype)
            if cls is None:
                raise ConfigError(f"{track.msgtype} is not installed in this ROS 2")
            pub = self.node.create_publisher(cls, track.name, qos_profile(track.qos))
            self._publishers[track.name] = pub
        return pub

    def wait_for_subscribers(
        self, tracks: Sequence[Track], names: Sequence[str], timeout_s: float
    ) -> list[str]:
        """Wait until each of ``names`` has a subscriber and discovery has settled.

        Settled: no publisher (``/clock`` included) gained a subscriber for
        ``DISCOVERY_SETTLE_S``, so a node's other inputs are matched too. Returns the names
        still without a subscriber when ``timeout_s`` ran out.
        """
        for track in tracks:
            self._publisher(track)
        publishers = {**self._publishers, CLOCK_TOPIC: self._clock}
        deadline = time.monotonic() + timeout_s
        counts: dict[str, int] = {}
        stable_since = time.monotonic()
        while True:
            now = time.monotonic()
            latest = {n: p.get_subscription_count() for n, p in publishers.items()}
            if latest != counts:
                counts, stable_since = latest, now
            lonely = [n for n in names if not counts.get(n)]
            settled = now - stable_since >= DISCOVERY_SETTLE_S
            if (not lonely and settled) or now >= deadline:
                return lonely
            time.sleep(0.05)

    def flush(self, timeout_s: float) -> None:
        """Wait until reliable subscribers acknowledged everything (before shutting down)."""
        for pub in [*self._publishers.values(), self._clock]:
            pub.wait_for_all_acked(Duration(seconds=timeout_s))

    def play(
        self,
        reader: bags.BagReader,
        tracks: Sequence[Track],
        options: PlayOptions,
        on_item: Callable[[PlayItem, float], None] | None = None,
        driver: str | None = None,
        undecodable: dict[str, int] | None = None,
    ) -> dict[str, int]:
        """Publish in order at the scaled recorded pace; /clock ticks between messages."""
        published: dict[str, int] = {}
        wall0 = time.monotonic()
        tick = 1.0 / options.clock_hz
        first_ns: int | None = None
        items = timetable(
            reader, tracks, options.start_offset_s, options.rate, options.loop, undecodable
        )
        if options.max_frames is not None and driver not in {t.name for t in tracks}:
            # Counted on the driver topic: without it the limit would never stop the play.
            raise ConfigError(
                f"--max-frames counts frames of the driver topic, and {driver!r} is not among "
                f"the topics played ({', '.join(t.name for t in tracks) or 'none'})"
            )
        for item in items:
            frames = published.get(driver or "", 0)
            if options.max_frames is not None and frames >= options.max_frames:
                break
            if first_ns is None:
                first_ns = item.bag_ns - round(item.due_s * options.rate * 1e9)
            while (now := time.monotonic() - wall0) < item.due_s:
                self.publish_clock(first_ns + round(now * options.rate * 1e9))
                time.sleep(min(tick, item.due_s - now))
            self.publish_clock(item.bag_ns)
            self._publisher(item.track).publish(item.raw)
            published[item.track.name] = published.get(item.track.name, 0) + 1
            if on_item is not None:
                on_item(item, time.monotonic())
        return published


def qos_profile(qos: TopicQos) -> QoSProfile:
    """The rclpy profile of a track's QoS (recorded, or overridden)."""
    return QoSProfile(
        history=HistoryPolicy.KEEP_ALL if qos.history == "keep_all" else HistoryPolicy.KEEP_LAST,
        depth=qos.depth,
        reliability=(
            ReliabilityPolicy.BEST_EFFORT
            if qos.reliability == "best_effort"
            else ReliabilityPolicy.RELIABLE
        ),
        durability=(
            DurabilityPolicy.TRANSIENT_LOCAL
            if qos.durability == "transient_local"
            else DurabilityPolicy.VOLATILE
        ),
    )


def tracks_for(reader: bags.BagReader, options: PlayOptions) -> tuple[list[Track], list[Skipped]]:
    return plan_tracks(
        reader.topics(),
        options.topics,
        options.remaps,
        lambda t: message_class(t) is not None,
        reader.definition_differs,
        reader.offered_qos,
        options.qos_overrides,
    )


def replay_dds(
    bag: Path,
    options: PlayOptions,
    driver_topic: str | None = None,
    sink: Callable[[str, int, bytes], None] | None = None,
    on_plan: Callable[[list[Track], list[Skipped]], None] | None = None,
    on_item: Callable[[PlayItem, float], None] | None = None,
    object_topics: Sequence[str] = (),
) -> PlayResult:
    """Play ``bag`` to the running nodes; with ``sink``, also receive their outputs (the
    tables, and ``object_topics``, the standard messages the recorder can write).

    ``driver_topic`` (the published name of the points or detections) pairs each output
    with the input frame of the same header stamp, for end-to-end latencies.
    """
    context = rclpy.Context()
    rclpy.init(context=context)
    executor: SingleThreadedExecutor | None = None
    spinner: threading.Thread | None = None
    try:
        node = Node(NODE_NAME, context=context)
        with bags.BagReader(bag) as reader:
            tracks, skipped = tracks_for(reader, options)
            result = PlayResult(tracks, skipped)
            if on_plan is not None:
                on_plan(tracks, skipped)
            if not tracks:
                return result
            sent_at: dict[int, float] = {}
            lock = threading.Lock()

            def on_stamp(topic: str, stamp: int) -> None:
                now = time.monotonic()
                with lock:
                    result.received[topic] = result.received.get(topic, 0) + 1
                    if stamp in sent_at:
                        result.latency_s.setdefault(stamp, {})[topic] = now - sent_at[stamp]

            def record_item(item: PlayItem, at: float) -> None:
                if item.track.name == driver_topic and item.track.stamped:
                    with lock:
                        sent_at[header_stamp(item.raw)] = at
                if on_item is not None:
                    on_item(item, at)

            if sink is not None:
                OutputListener(node, sink, on_stamp, object_topics)
                executor = SingleThreadedExecutor(context=context)
                executor.add_node(node)
                spinner = threading.Thread(target=executor.spin, daemon=True)
                spinner.start()
            player = BagPlayer(node)
            if options.wait_for_subscribers_s > 0:
                names = [driver_topic] if driver_topic else [t.name for t in tracks]
                lonely = player.wait_for_subscribers(tracks, names, options.wait_for_subscribers_s)
                for name in lonely:
                    node.get_logger().warning(f"{name}: no subscriber yet, publishing anyway")
            wall0 = time.monotonic()
            try:
                result.published = player.play(
                    reader, tracks, options, record_item, driver_topic, result.undecodable
                )
                player.flush(FLUSH_TIMEOUT_S)
                if sink is not None:
                    time.sleep(options.drain_s)
            except (KeyboardInterrupt, ExternalShutdownException):
                result.interrupted = True
            result.wall_s = time.monotonic() - wall0
            return result
    finally:
        if executor is not None:
            executor.shutdown()
        if spinner is not None:
            spinner.join(timeout=2.0)
        rclpy.try_shutdown(context=context)
