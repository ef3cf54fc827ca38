"""Autoware's debug timing topics: ``~/debug/processing_time_ms`` and ``~/debug/cyclic_time_ms``."""

from __future__ import annotations

import re
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rclpy.node import Node
from rclpy.qos import QoSProfile

try:
    # Autoware's own type where it is installed (a vehicle with Autoware).
    from autoware_internal_debug_msgs.msg import Float64Stamped as _Stamped
except ImportError:
    _Stamped = None
from std_msgs.msg import Float64

from dynshape_perception.nodes.outputs import quiet_publisher

# The stage whose time is the node's whole frame: the un-suffixed topics carry it.
TOTAL = "total"
PREFIX = "~/debug"
PROCESSING, CYCLIC = "processing_time", "cyclic_time"
# Autoware's DebugPublisher keeps 1.
DEPTH = 1
_NOT_A_NAME = re.compile(r"[^A-Za-z0-9_]")
MS_PER_S = 1e3
# Values waiting for a frame's work to end: a few frames' stages.
MAX_PENDING = 64
NS_PER_S = 1_000_000_000
# The encapsulation header of little-endian plain CDR.
_CDR_LE = b"\x00\x01\x00\x00"
_F64 = struct.Struct("<d")
_STAMPED = struct.Struct("<iId")


def message_type() -> Any:
    """Autoware's ``Float64Stamped`` where installed, else ``std_msgs/Float64``."""
    return _Stamped if _Stamped is not None else Float64


def topic_names(stage: str) -> tuple[str, str]:
    """(processing, cyclic) topics of a stage, as Autoware's multi-stage nodes name them:
    ``~/debug/processing_time_ms`` for the whole frame, ``~/debug/processing_time/<stage>_ms``
    for a part of it."""
    if stage == TOTAL:
        return f"{PREFIX}/{PROCESSING}_ms", f"{PREFIX}/{CYCLIC}_ms"
    name = _NOT_A_NAME.sub("_", stage)
    return f"{PREFIX}/{PROCESSING}/{name}_ms", f"{PREFIX}/{CYCLIC}/{name}_ms"


class DebugTimes:
    """Per stage: its processing time, and the wall time since its previous frame (cyclic).

    With ``busy`` (a node with an executor: is a frame's work under way?), the values
    recorded during a frame wait: each publish holds the GIL for tens of microseconds, and a
    frame's stages report a dozen of them from the lanes while its later stages wait for the
    GIL. They go out with the frame's last output (``record(..., flush=True)``), or, where
    none flushes them, on rclpy's executor once the frame's work has ended
    (``work_ended``). The values and the cyclic times are taken when recorded.
    """

    def __init__(self, node: Node, busy: Callable[[], bool] | None = None) -> None:
        self.node = node
        self.msg_type = message_type()
        self._publishers: dict[str, tuple[Any, Any]] = {}
        self._last_s: dict[str, float] = {}
        self._closed = False
        self._busy = busy
        self._pending: list[_Value] = []
        # Stages report from the executor's lanes as well as the node's callbacks. The
        # publishers' lock is taken before the values', never the other way round.
        self._lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._wake = node.create_guard_condition(self.flush) if busy is not None else None

    def close(self) -> None:
        """Leave the graph (switched off); switching on again makes a new one."""
        with self._lock:
            with self._pending_lock:
                self._closed = True
                self._pending.clear()
                self._last_s.clear()
            for pair in self._publishers.values():
                for publisher in pair:
                    self.node.destroy_publisher(publisher)
            self._publishers.clear()
            if self._wake is not None:
                self.node.destroy_guard_condition(self._wake)
                self._wake = None

    def record(self, stages: dict[str, float], flush: bool = False) -> None:
        """Take a frame's stage times; ``flush``: its outputs are out, publish them now."""
        now = time.monotonic()
        stamp = self._stamp()
        with self._pending_lock:
            if self._closed:
                return
            for stage, ms in stages.items():
                last = self._last_s.get(stage)
                self._last_s[stage] = now
                cyclic = None if last is None else (now - last) * MS_PER_S
                self._pending.append(_Value(stage, ms, cyclic, stamp))
            # A node busy frame after frame still publishes, a bounded number late.
            defer = (
                not flush
                and self._busy is not None
                and len(self._pending) < MAX_PENDING
                and self._busy()
            )
        if not defer:
            self.flush()

    def work_ended(self) -> None:
        """The node's frame work has ended (a ``WorkCount`` listener: any thread, never
        blocks): the values it recorded go out on the executor."""
        with self._pending_lock:
            if self._pending and not self._closed and self._wake is not None:
                self._wake.trigger()

    def flush(self) -> None:
        """Publish every value recorded and not yet published, in the order recorded."""
        with self._lock:
            with self._pending_lock:
                values, self._pending = self._pending, []
            if self._closed:
                return
            for value in values:
                processing, cyclic = self._pair(value.stage)
                processing.publish(self._message(value.ms, value.stamp))
                if value.cyclic_ms is not None:
                    cyclic.publish(self._message(value.cyclic_ms, value.stamp))

    def _pair(self, stage: str) -> tuple[Any, Any]:
        pair = self._publishers.get(stage)
        if pair is None:
            qos = QoSProfile(depth=DEPTH)
            processing, cyclic = topic_names(stage)
            pair = (
                quiet_publisher(self.node, self.msg_type, processing, qos),
                quiet_publisher(self.node, self.msg_type, cyclic, qos),
            )
            self._publishers[stage] = pair
        return pair

    def _stamp(self) -> tuple[int, int] | None:
        if self.msg_type is Float64:
            return None
        sec, nanosec = divmod(self.node.get_clock().now().nanoseconds, NS_PER_S)
        return sec, nanosec

    def _message(self, value_ms: float, stamp: tuple[int, int] | None) -> bytes:
        """The message's CDR bytes: a node publishes several per frame, and rclpy's
        ``publish`` of a message object costs many times more than of its bytes."""
        if stamp is None:
            return float64_bytes(value_ms)
        return float64_stamped_bytes(stamp[0], stamp[1], value_ms)


@dataclass(frozen=True)
class _Value:
    """One stage's time as recorded, until it is published."""

    stage: str
    ms: float
    cyclic_ms: float | None
    stamp: tuple[int, int] | None


def float64_bytes(value: float) -> bytes:
    """``std_msgs/Float64`` in little-endian CDR."""
    return _CDR_LE + _F64.pack(float(value))


def float64_stamped_bytes(sec: int, nanosec: int, value: float) -> bytes:
    """Autoware's ``Float64Stamped`` (a ``builtin_interfaces/Time``, then the value at an
    8-byte boundary) in little-endian CDR."""
    return _CDR_LE + _STAMPED.pack(sec, nanosec, float(value))


def switch_debug_times(
    current: DebugTimes | None,
    node: Node,
    values: Mapping[str, Any],
    busy: Callable[[], bool] | None = None,
) -> DebugTimes | None:
    """``debug.publish_processing_time``: the debug topics come and go with it."""
    on = bool(values["debug.publish_processing_time"])
    if on and current is None:
        return DebugTimes(node, busy)
    if not on and current is not None:
        current.close()
        return None
    return current
