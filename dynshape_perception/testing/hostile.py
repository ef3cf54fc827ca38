"""Hostile CDR for every subscribed type: a valid sample per topic, and what an attacker sends."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import rclpy
from nav_msgs.msg import Odometry
from rclpy.serialization import serialize_message
from tf2_msgs.msg import TFMessage
from vision_msgs.msg import Detection3D, Detection3DArray, ObjectHypothesisWithPose

from dynshape_perception.io.cdr import ENCAPSULATION
from dynshape_perception.io.objects import TrackStates, detected_objects, tracked_objects
from dynshape_perception.io.pointcloud2 import points_to_cloud
from dynshape_perception.nodes.base import PerceptionNode
from dynshape_perception.nodes.messages import (
    cloud_msg,
    header,
    time_msg,
    transform_msg,
    yaw_quaternion,
)
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.perception.transforms import planar
from dynshape_perception.testing.processes import domain_lease, ros_value

BIG_ENDIAN = b"\x00\x00\x00\x00"
# Sequence and string lengths an attacker picks: all bits, 2^30, 2^31.
HUGE_COUNTS = (0xFFFFFFFF, 1 << 30, 1 << 31)
TF_TOPICS = ("/tf", "/tf_static")
# Frames the nodes never look up: what parses of a hostile /tf moves none of their inputs.
TF_FRAMES, TF_STATIC_FRAMES = ("hostile_world", "hostile_body"), ("hostile_body", "hostile_eye")
TOPICS = ("points", "odom", *TF_TOPICS, "detected_objects", "detections", "tracked_objects")


def obstacles(n: int = 3) -> np.ndarray:
    rows = np.zeros(n, OBSTACLE_DTYPE)
    rows["x"] = np.arange(n, dtype=np.float32) * 4.0 + 5.0
    rows["y"] = 1.0
    rows["length"], rows["width"], rows["height"] = 4.0, 2.0, 1.5
    rows["score"], rows["label"], rows["num_points"] = 0.9, 1, 30
    return rows


def track_states(n: int = 2) -> TrackStates:
    tracks = np.zeros(n, TRACK_DTYPE)
    for name in OBSTACLE_DTYPE.names or ():
        tracks[name] = obstacles(n)[name]
    tracks["id"] = np.arange(1, n + 1)
    uuids = np.arange(n * 16, dtype=np.uint8).reshape(n, 16)
    return TrackStates(tracks, uuids, np.full(n, 0.9, np.float32), np.zeros(n, np.int32))


def _detections(ns: int, frame_id: str) -> Detection3DArray:
    msg = Detection3DArray(header=header(time_msg(ns), frame_id))
    for row in obstacles():
        det = Detection3D(header=msg.header, id="car")
        det.bbox.center.position.x, det.bbox.center.position.y = float(row["x"]), float(row["y"])
        det.bbox.center.orientation.w = 1.0
        det.bbox.size.x, det.bbox.size.y, det.bbox.size.z = 4.0, 2.0, 1.5
        hyp = ObjectHypothesisWithPose()
        hyp.hypothesis.class_id, hyp.hypothesis.score = "car", 0.9
        det.results = [hyp]
        msg.detections.append(det)
    return msg


def sample(topic: str, ns: int) -> bytes:
    """A valid message of ``topic`` stamped ``ns``, as CDR bytes."""
    makers: dict[str, Callable[[], bytes]] = {
        "points": lambda: bytes(
            serialize_message(
                cloud_msg(
                    points_to_cloud(np.array([[5.0, 0, 0.2, 0.5], [6, 1, 0.4, 0.5]], np.float32)),
                    header(time_msg(ns), "lidar"),
                )
            )
        ),
        "odom": lambda: _odometry(ns),
        "/tf": lambda: bytes(
            serialize_message(
                TFMessage(
                    transforms=[transform_msg("odom", "base_link", planar(1.0), time_msg(ns))]
                )
            )
        ),
        "/tf_static": lambda: bytes(
            serialize_message(
                TFMessage(
                    transforms=[transform_msg(*TF_STATIC_FRAMES, planar(z=1.8), time_msg(ns))]
                )
            )
        ),
        "detected_objects": lambda: detected_objects(ns, "base_link", obstacles()),
        "detections": lambda: bytes(serialize_message(_detections(ns, "base_link"))),
        "tracked_objects": lambda: tracked_objects(ns, "odom", track_states(), ObjectParams()),
    }
    return makers[topic]()


def _odometry(ns: int) -> bytes:
    msg = Odometry()
    msg.header = header(time_msg(ns), "odom")
    msg.child_frame_id = "base_link"
    msg.pose.pose.orientation = yaw_quaternion(0.0)
    return bytes(serialize_message(msg))


def with_count(data: bytes, at: int, count: int) -> bytes:
    """``data`` with the 32-bit word at ``at`` (a length, if it is one) set to ``count``."""
    return data[:at] + struct.pack("<I", count) + data[at + 4 :]


def frame_id_length_at(topic: str) -> int:
    """Where the (first) header's frame_id length lies: after the encapsulation, the stamp,
    and for a TFMessage its transforms' count."""
    return len(ENCAPSULATION) + (4 if topic in TF_TOPICS else 0) + 8


def without_nul(topic: str, data: bytes) -> bytes:
    """``data`` with its (first) header's frame_id losing its terminating NUL."""
    at = frame_id_length_at(topic)
    (length,) = struct.unpack_from("<I", data, at)
    end = at + 4 + length - 1
    return data[:end] + b"A" + data[end + 1 :]


def after_header(topic: str, data: bytes) -> int:
    """Where the first word after the (first) header lies: a sequence length in most."""
    at = frame_id_length_at(topic)
    (length,) = struct.unpack_from("<I", data, at)
    end = at + 4 + length
    return end + (-(end - len(ENCAPSULATION)) % 4)


def worst(topic: str, data: bytes) -> dict[str, bytes]:
    """The worst cases of one valid message of ``topic``: each kind of hostile bytes once."""
    at = frame_id_length_at(topic)
    return {
        "3 bytes": data[:3],
        "no header": data[: len(ENCAPSULATION) + 6],
        "half": data[: len(data) // 2],
        "random after encapsulation": ENCAPSULATION + np.random.default_rng(0).bytes(4096),
        "big-endian": BIG_ENDIAN + data[len(ENCAPSULATION) :],
        "huge frame_id length": with_count(data, at, HUGE_COUNTS[0]),
        "frame_id without NUL": without_nul(topic, data),
        "huge count after the header": with_count(data, after_header(topic, data), HUGE_COUNTS[0]),
        "huge count first": with_count(data, len(ENCAPSULATION), HUGE_COUNTS[0]),
        "valid prefix, garbage tail": data[: len(data) * 2 // 3] + b"\xff" * 64,
    }


@contextmanager
def nodes_in_process(
    factories: Sequence[Callable[[], PerceptionNode]],
    overrides: Mapping[str, bool | int | float | str],
) -> Iterator[dict[str, PerceptionNode]]:
    """The nodes ``factories`` make, by kind, in this process on a domain of their own; rclpy
    initialised (with ``overrides`` as parameters) for them and shut down after."""
    args = ["--ros-args"]
    for name, value in overrides.items():
        args += ["-p", f"{name}:={ros_value(value)}"]
    with domain_lease() as domain:
        rclpy.init(args=args, domain_id=domain)
        made: dict[str, PerceptionNode] = {}
        try:
            for factory in factories:
                node = factory()
                made[node.kind] = node
            yield made
        finally:
            for node in made.values():
                node.close()
            rclpy.shutdown()


def callback_of(node: PerceptionNode, topic: str) -> Callable[[Any], None]:
    """The callback rclpy calls with a message of ``topic``: the node's real entry point."""
    name = node.resolve_topic_name(topic)
    for sub in node.subscriptions:
        if sub.topic_name == name:
            return sub.callback  # type: ignore[return-value]
    raise LookupError(f"{node.kind} has no subscription on {name}")
