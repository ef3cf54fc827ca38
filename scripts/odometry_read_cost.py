"""Microseconds to read one nav_msgs/Odometry's pose: rclpy's deserialisation vs the CDR read.

Usage: PYTHON scripts/odometry_read_cost.py [REPEATS] [FLUSH_MB]  (default: 300 64)
Each way reads the stamp, frame, position and yaw of the same serialised message, as a node's
odometry input does: "rclpy" deserialises the whole message and reads the pose from the
object, "cdr" reads header and pose from the bytes (``nodes.messages.odometry_of``). Prints
the median of REPEATS, hot (back to back) and cold (after writing FLUSH_MB of memory between
reads, as a frame's clouds and models pass through the caches between two odometry messages).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from nav_msgs.msg import Odometry
from rclpy.serialization import deserialize_message, serialize_message

from dynshape_perception.nodes.messages import odometry_fields, odometry_of, odometry_pose

US_PER_S = 1e6


def _message() -> bytes:
    msg = Odometry()
    msg.header.stamp.sec, msg.header.stamp.nanosec = 1_700_000_000, 100_000_000
    msg.header.frame_id, msg.child_frame_id = "odom", "base_link"
    msg.pose.pose.position.x, msg.pose.pose.position.y = 12.5, -3.25
    msg.pose.pose.orientation.z, msg.pose.pose.orientation.w = 0.6, 0.8
    return bytes(serialize_message(msg))


def _through_rclpy(data: bytes) -> tuple[float, float, float, float]:
    return odometry_pose(odometry_fields(deserialize_message(data, Odometry)))


def _median_us(read: Callable[[], object], repeats: int, flush: np.ndarray | None) -> float:
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush += 1
        start = time.perf_counter()
        read()
        times.append((time.perf_counter() - start) * US_PER_S)
    return statistics.median(times)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    flush_mb = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    data = _message()
    ways: dict[str, Callable[[], object]] = {
        "rclpy": lambda: _through_rclpy(data),
        "cdr": lambda: odometry_pose(odometry_of(data)),
    }
    if ways["rclpy"]() != ways["cdr"]():
        raise SystemExit("the two reads disagree")
    flush = np.zeros(flush_mb << 17)
    for name, read in ways.items():
        hot = _median_us(read, repeats, None)
        cold = _median_us(read, repeats, flush)
        print(f"{name}: {len(data)} bytes, hot {hot:.1f} us, cold {cold:.1f} us")


if __name__ == "__main__":
    main()
