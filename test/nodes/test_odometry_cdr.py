"""nav_msgs/Odometry read from its CDR bytes against rclpy's own reading of the same bytes."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nav_msgs.msg import Odometry
from rclpy.serialization import serialize_message

from dynshape_perception.errors import MessageError
from dynshape_perception.io.cdr import OdometryPose, read_odometry
from dynshape_perception.nodes.messages import NS_PER_S, odometry_of, odometry_pose

pytestmark = pytest.mark.ros

DOUBLES = st.floats(allow_nan=True, allow_infinity=True, width=64)
# Frame names of every length modulo 8: each pads the pose's float64s differently.
FRAMES = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=19)


def _odometry(
    stamp: tuple[int, int], frames: tuple[str, str], pose: list[float], rest: list[float]
) -> Odometry:
    msg = Odometry()
    msg.header.stamp.sec, msg.header.stamp.nanosec = stamp
    msg.header.frame_id, msg.child_frame_id = frames
    p, q = msg.pose.pose.position, msg.pose.pose.orientation
    p.x, p.y, p.z, q.x, q.y, q.z, q.w = pose
    msg.pose.covariance = rest[:36]
    msg.twist.twist.linear.x = rest[36]
    msg.twist.covariance = rest[37:73]
    return msg


def _expected(msg: Odometry) -> OdometryPose:
    p, q = msg.pose.pose.position, msg.pose.pose.orientation
    return OdometryPose(
        msg.header.stamp.sec,
        msg.header.stamp.nanosec,
        msg.header.frame_id,
        (p.x, p.y, p.z),
        (q.x, q.y, q.z, q.w),
    )


def _same(a: OdometryPose, b: OdometryPose) -> bool:
    """Equal, NaN to NaN."""
    numbers = [*a.position, *a.orientation], [*b.position, *b.orientation]
    return (a.sec, a.nanosec, a.frame_id) == (b.sec, b.nanosec, b.frame_id) and all(
        x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(*numbers, strict=True)
    )


@settings(max_examples=200, deadline=None)
@given(
    stamp=st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**32 - 1)),
    frames=st.tuples(FRAMES, FRAMES),
    pose=st.lists(DOUBLES, min_size=7, max_size=7),
    rest=st.lists(DOUBLES, min_size=73, max_size=73),
)
def test_the_pose_read_from_bytes_is_rclpys(
    stamp: tuple[int, int], frames: tuple[str, str], pose: list[float], rest: list[float]
) -> None:
    msg = _odometry(stamp, frames, pose, rest)
    data = serialize_message(msg)
    assert _same(read_odometry(data), _expected(msg))
    assert _same(odometry_of(data), _expected(msg))
    # Bytes after the message, as a transport may pad it, are not read.
    assert _same(read_odometry(data + b"\xff" * 8), _expected(msg))


def test_every_truncation_is_a_message_error() -> None:
    data = serialize_message(_odometry((100, 5), ("odom", "base_link"), [1.0] * 7, [0.0] * 73))
    for n in range(len(data)):
        with pytest.raises(MessageError):
            read_odometry(data[:n])


def test_a_frame_id_without_its_nul_is_a_message_error() -> None:
    data = bytearray(serialize_message(_odometry((1, 0), ("odom", "b"), [0.0] * 7, [0.0] * 73)))
    # "odom" and its NUL follow the stamp and the length.
    data[4 + 8 + 4 + 4] = ord("x")
    with pytest.raises(MessageError, match="NUL"):
        read_odometry(bytes(data))


def _big_endian(msg: Odometry) -> bytes:
    """``msg`` in big-endian plain CDR, which rmw on a big-endian host writes."""
    out = bytearray(b"\x00\x00\x00\x00")

    def align(n: int) -> None:
        out.extend(b"\x00" * (-(len(out) - 4) % n))

    def string(text: str) -> None:
        raw = text.encode() + b"\x00"
        align(4)
        out.extend(struct.pack(">I", len(raw)) + raw)

    out.extend(struct.pack(">iI", msg.header.stamp.sec, msg.header.stamp.nanosec))
    string(msg.header.frame_id)
    string(msg.child_frame_id)
    align(8)
    p, q = msg.pose.pose.position, msg.pose.pose.orientation
    out.extend(struct.pack(">7d", p.x, p.y, p.z, q.x, q.y, q.z, q.w))
    out.extend(struct.pack(">36d", *msg.pose.covariance))
    t = msg.twist.twist
    out.extend(struct.pack(">6d", t.linear.x, t.linear.y, t.linear.z, *[0.0] * 3))
    out.extend(struct.pack(">36d", *msg.twist.covariance))
    return bytes(out)


def test_other_encapsulations_are_read_through_rclpy() -> None:
    msg = _odometry(
        (1_700_000_000, 250_000_000),
        ("map", "base"),
        [3.0, 4.0, 0.0, 0.0, 0.0, 0.6, 0.8],
        [0.5] * 73,
    )
    odom = odometry_of(_big_endian(msg))
    assert _same(odom, _expected(msg))
    with pytest.raises(MessageError):
        read_odometry(_big_endian(msg))
    stamp, x, y, yaw = odometry_pose(odom)
    assert stamp == 1_700_000_000 + 250_000_000 / NS_PER_S
    assert (x, y) == (3.0, 4.0)
    assert yaw == pytest.approx(2.0 * math.atan2(0.6, 0.8))
