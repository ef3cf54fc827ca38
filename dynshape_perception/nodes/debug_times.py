"""Autoware's debug timing topics: ``~/debug/processing_time_ms`` and ``~/debug/cyclic_time_ms``."""

from __future__ import annotations

import re
import struct
import threading
import time
from collections.abc import Mapping
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
    """Per stage: its processing time, and the wall time since its previous frame (cyclic)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.msg_type = message_type()
        self._publishers: dict[str, tuple[Any, Any]] = {}
        self._last_s: dict[str, float] = {}
        self._closed = False
        # Stages report from the executor's lanes as well as the node's callbacks.
        self._lock = threading.Lock()

    def close(self) -> None:
        """Leave the graph (switched off); switching on again makes a new one."""
        with self._lock:
            self._closed = True
            for pair in self._publishers.values():
                for publisher in pair:
                    self.node.destroy_publisher(publisher)
            self._publishers.clear()
            self._last_s.clear()

    def record(self, stages: dict[str, float]) -> None:
        now = time.monotonic()
        for stage, ms in stages.items():
            with self._lock:
                if self._closed:
                    return
                pair = self._publishers.get(stage)
                if pair is None:
                    qos = QoSProfile(depth=DEPTH)
                    processing, cyclic = topic_names(stage)
                    pair = (
                        quiet_publisher(self.node, self.msg_type, processing, qos),
                        quiet_publisher(self.node, self.msg_type, cyclic, qos),
                    )
                    self._publishers[stage] = pair
                last = self._last_s.get(stage)
                self._last_s[stage] = now
                pair[0].publish(self._message(ms))
                if last is not None:
                    pair[1].publish(self._message((now - last) * MS_PER_S))

    def _message(self, value_ms: float) -> bytes:
        """The message's CDR bytes: a node publishes several per frame from the lanes, and
        rclpy's ``publish`` of a message object costs many times more than of its bytes."""
        if self.msg_type is Float64:
            return float64_bytes(value_ms)
        sec, nanosec = divmod(self.node.get_clock().now().nanoseconds, NS_PER_S)
        return float64_stamped_bytes(sec, nanosec, value_ms)


def float64_bytes(value: float) -> bytes:
    """``std_msgs/Float64`` in little-endian CDR."""
    return _CDR_LE + _F64.pack(float(value))


def float64_stamped_bytes(sec: int, nanosec: int, value: float) -> bytes:
    """Autoware's ``Float64Stamped`` (a ``builtin_interfaces/Time``, then the value at an
    8-byte boundary) in little-endian CDR."""
    return _CDR_LE + _STAMPED.pack(sec, nanosec, float(value))


def switch_debug_times(
    current: DebugTimes | None, node: Node, values: Mapping[str, Any]
) -> DebugTimes | None:
    """``debug.publish_processing_time``: the debug topics come and go with it."""
    on = bool(values["debug.publish_processing_time"])
    if on and current is None:
        return DebugTimes(node)
    if not on and current is not None:
        current.close()
        return None
    return current
