"""ROS messages from and to the core's arrays: clouds, tables, odometry, markers, diagnostics."""

from __future__ import annotations

import importlib
import math
from functools import cache
from typing import Any

import numpy as np
from builtin_interfaces.msg import Duration, Time
from geometry_msgs.msg import Point, Quaternion, TransformStamped
from nav_msgs.msg import Odometry
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import PointCloud2, PointField
from std_msgs.msg import ColorRGBA, Header
from visualization_msgs.msg import Marker, MarkerArray

from dynshape_perception.errors import MessageError
from dynshape_perception.io.cdr import ENCAPSULATION, OdometryPose, header_of, read_odometry
from dynshape_perception.io.markers import (
    LABEL_RGB,
    MARKER_NS_BOXES,
    MARKER_NS_IDS,
    MARKER_NS_PATHS,
    TEXT_RGB,
    MarkerStyle,
    encode_markers,
    layout_matches,
    path_bounds,
)
from dynshape_perception.io.pointcloud2 import CloudData, encode_cloud
from dynshape_perception.perception.records import LABEL_UNKNOWN
from dynshape_perception.perception.transforms import Matrix, normalised_quaternion, quaternion_of

NS_PER_S = 1_000_000_000


def stamp_s(stamp: Time) -> float:
    """Seconds; NaN for a nanosec field of a second or more, which no valid time holds (the
    stamp screens drop it as an outlier)."""
    return seconds(stamp.sec, stamp.nanosec)


def seconds(sec: int, nanosec: int) -> float:
    """``stamp_s`` of a stamp's two fields."""
    if not 0 <= nanosec < NS_PER_S:
        return math.nan
    return float(sec) + float(nanosec) / NS_PER_S


def stamp_ns(stamp: Time) -> int:
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)


def time_msg(ns: int) -> Time:
    return Time(sec=ns // NS_PER_S, nanosec=ns % NS_PER_S)


def header(stamp: Time, frame_id: str) -> Header:
    return Header(stamp=Time(sec=stamp.sec, nanosec=stamp.nanosec), frame_id=frame_id)


def serialized_header(data: bytes) -> Header:
    """The header of a stamped message's CDR bytes; MessageError if unreadable."""
    sec, nanosec, frame_id = header_of(data)
    return Header(stamp=Time(sec=sec, nanosec=nanosec), frame_id=frame_id)


def deserialized(data: bytes, msg_type: Any) -> Any:
    """The ``msg_type`` message in CDR bytes; MessageError if they hold none."""
    try:
        return deserialize_message(data, msg_type)
    except Exception as err:
        raise MessageError(f"unreadable {msg_type.__name__} CDR: {err}") from err


def cloud_msg(data: CloudData, head: Header) -> PointCloud2:
    msg = PointCloud2()
    msg.header = head
    msg.height, msg.width = data.height, data.width
    msg.fields = [
        PointField(name=f.name, offset=f.offset, datatype=f.datatype, count=f.count)
        for f in data.fields
    ]
    msg.is_bigendian = data.is_bigendian
    msg.point_step, msg.row_step = data.point_step, data.row_step
    msg.data = data.data
    msg.is_dense = data.is_dense
    return msg


def table_msg(table: np.ndarray, head: Header) -> PointCloud2:
    return cloud_msg(encode_cloud(table), head)


def transform_msg(parent: str, child: str, m: Matrix, stamp: Time) -> TransformStamped:
    """The 4x4 rigid transform ``m`` of ``child`` in ``parent`` at ``stamp``."""
    msg = TransformStamped()
    msg.header = header(stamp, parent)
    msg.child_frame_id = child
    move, turn = msg.transform.translation, msg.transform.rotation
    move.x, move.y, move.z = (float(v) for v in m[:3, 3])
    turn.x, turn.y, turn.z, turn.w = quaternion_of(m)
    return msg


def odometry_of(data: bytes) -> OdometryPose:
    """The header and pose of a nav_msgs/Odometry's CDR bytes; MessageError if they hold
    none. Plain little-endian CDR, what rmw writes on the hosts this runs on, is read from the
    bytes; any other encapsulation through rclpy."""
    if data[: len(ENCAPSULATION)] == ENCAPSULATION:
        return read_odometry(data)
    return odometry_fields(deserialized(data, Odometry))


def odometry_fields(msg: Odometry) -> OdometryPose:
    """The header and pose of an rclpy Odometry."""
    p, q = msg.pose.pose.position, msg.pose.pose.orientation
    return OdometryPose(
        int(msg.header.stamp.sec),
        int(msg.header.stamp.nanosec),
        str(msg.header.frame_id),
        (float(p.x), float(p.y), float(p.z)),
        (float(q.x), float(q.y), float(q.z), float(q.w)),
    )


def odometry_pose(odom: OdometryPose) -> tuple[float, float, float, float]:
    """(stamp s, x m, y m, yaw rad) of the child frame in the odometry frame; the quaternion
    is normalised first (DegenerateQuaternion for a zero or non-finite one)."""
    x, y, z, w = normalised_quaternion(*odom.orientation)
    return (
        seconds(odom.sec, odom.nanosec),
        odom.position[0],
        odom.position[1],
        math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z)),
    )


@cache
def message_class(msgtype: str) -> Any:
    """The rclpy class of ``pkg/msg/Name``."""
    package, kind, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{package}.{kind}"), name)


def ros_message(msgtype: str, /, **fields: Any) -> Any:
    """An rclpy message of ``msgtype`` (a factory of ``testing.object_messages``)."""
    return message_class(msgtype)(**fields)


def yaw_quaternion(yaw: float) -> Quaternion:
    return Quaternion(x=0.0, y=0.0, z=math.sin(yaw / 2.0), w=math.cos(yaw / 2.0))


def _color(rgb: tuple[float, float, float], alpha: float) -> ColorRGBA:
    return ColorRGBA(r=rgb[0], g=rgb[1], b=rgb[2], a=float(alpha))


def marker_array(
    tracks: np.ndarray, predictions: np.ndarray, head: Header, style: MarkerStyle
) -> MarkerArray:
    """A DELETEALL, then per track a box and its id, and per (agent, k) a path, alpha = prob."""
    markers = [Marker(header=head, action=Marker.DELETEALL)]
    for row in tracks:
        track_id = int(row["id"])
        rgb = LABEL_RGB.get(int(row["label"]), LABEL_RGB[LABEL_UNKNOWN])
        box = Marker(header=head, ns=MARKER_NS_BOXES, id=track_id, type=Marker.CUBE)
        box.pose.position.x, box.pose.position.y = float(row["x"]), float(row["y"])
        box.pose.position.z = float(row["z"])
        box.pose.orientation = yaw_quaternion(float(row["yaw"]))
        box.scale.x, box.scale.y = float(row["length"]), float(row["width"])
        box.scale.z = float(row["height"])
        box.color = _color(rgb, style.box_alpha)
        text = Marker(header=head, ns=MARKER_NS_IDS, id=track_id, type=Marker.TEXT_VIEW_FACING)
        text.pose.position.x, text.pose.position.y = box.pose.position.x, box.pose.position.y
        text.pose.position.z = float(row["z"]) + float(row["height"]) / 2.0 + style.text_size_m
        text.pose.orientation.w = 1.0
        text.scale.z = style.text_size_m
        text.color = _color(TEXT_RGB, 1.0)
        text.text = str(track_id)
        markers += [box, text]
    rows, bounds = path_bounds(predictions)
    for path_index, (lo, hi) in enumerate(bounds):
        path = rows[lo:hi]
        line = Marker(header=head, ns=MARKER_NS_PATHS, id=path_index, type=Marker.LINE_STRIP)
        line.pose.orientation.w = 1.0
        line.scale.x = style.path_width_m
        line.color = _color(LABEL_RGB[LABEL_UNKNOWN], float(path["prob"][0]))
        line.points = [
            Point(x=float(x), y=float(y), z=0.0)
            for x, y in zip(path["x"].tolist(), path["y"].tolist(), strict=True)
        ]
        markers.append(line)
    for marker in markers:
        marker.lifetime = Duration()
    return MarkerArray(markers=markers)


def _installed_fields(msgtype: str) -> dict[str, str]:
    fields: dict[str, str] = message_class(msgtype).get_fields_and_field_types()
    return fields


# Jazzy and Kilted lay Marker out as io.markers writes it; elsewhere (Humble) rclpy serialises.
MARKERS_AS_CDR = layout_matches(_installed_fields)


def marker_bytes(
    tracks: np.ndarray, predictions: np.ndarray, head: Header, style: MarkerStyle
) -> bytes:
    """The CDR bytes of ``marker_array(...)``, written from the arrays without its objects."""
    if not MARKERS_AS_CDR:
        return bytes(serialize_message(marker_array(tracks, predictions, head, style)))
    stamp = head.stamp
    return encode_markers((stamp.sec, stamp.nanosec, head.frame_id), tracks, predictions, style)
