"""PointCloud2 read from its CDR bytes against rclpy's own reading of the same bytes."""

from __future__ import annotations

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import PointCloud2

from dynshape_perception.io.cdr import read_point_cloud2
from dynshape_perception.io.pointcloud2 import (
    BAD_LAYOUT,
    FLOAT32,
    UINT16,
    CloudData,
    CloudError,
    FieldSpec,
    cloud_to_points,
    encode_cloud,
    points_to_cloud,
)
from dynshape_perception.nodes.messages import cloud_msg, header, time_msg

pytestmark = pytest.mark.ros

STAMP_NS = 1_700_000_000_123_456_789


def _ouster_like(n: int, seed: int) -> np.ndarray:
    """A driver layout with an odd field order, a uint8 intensity, padding and a ring."""
    dtype = np.dtype(
        {
            "names": ["t", "intensity", "x", "y", "z", "ring"],
            "formats": ["<u4", "u1", "<f4", "<f4", "<f4", "<u2"],
            "offsets": [0, 4, 16, 20, 24, 40],
            "itemsize": 48,
        }
    )
    rng = np.random.default_rng(seed)
    table = np.zeros(n, dtype=dtype)
    for name in ("x", "y", "z"):
        table[name] = rng.normal(0.0, 10.0, n)
    table["intensity"] = rng.integers(0, 256, n)
    table["ring"] = np.arange(n) % 64
    return table


def _clouds() -> list[CloudData]:
    rng = np.random.default_rng(0)
    plain = points_to_cloud(rng.normal(0.0, 10.0, (1000, 4)).astype(np.float32))
    table = _ouster_like(96, seed=1)
    with_vector = CloudData(
        fields=(
            FieldSpec("x", 0, FLOAT32),
            FieldSpec("y", 4, FLOAT32),
            FieldSpec("z", 8, FLOAT32),
            FieldSpec("normal", 12, FLOAT32, 3),
            FieldSpec("ring", 24, UINT16),
        ),
        point_step=28,
        row_step=28 * 3,
        height=1,
        width=3,
        is_bigendian=False,
        is_dense=False,
        data=rng.integers(0, 256, 28 * 3, dtype=np.uint8).tobytes(),
    )
    return [
        plain,
        encode_cloud(table, height=4, row_padding=12),
        encode_cloud(table, is_bigendian=True),
        with_vector,
    ]


@pytest.mark.parametrize("cloud", _clouds(), ids=["plain", "organised", "big-endian", "vector"])
@pytest.mark.parametrize("frame_id", ["", "l", "lidar", "velodyne_top"])
def test_every_field_reads_as_rclpy_reads_it(cloud: CloudData, frame_id: str) -> None:
    data = serialize_message(cloud_msg(cloud, header(time_msg(STAMP_NS), frame_id)))
    ours = read_point_cloud2(data)
    theirs = deserialize_message(data, PointCloud2)
    assert ours.header == (theirs.header.stamp.sec, theirs.header.stamp.nanosec, frame_id)
    for name in ("height", "width", "is_bigendian", "point_step", "row_step", "is_dense"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert [(f.name, f.offset, f.datatype, f.count) for f in ours.fields] == [
        (f.name, f.offset, f.datatype, f.count) for f in theirs.fields
    ]
    assert bytes(ours.data) == bytes(theirs.data)
    np.testing.assert_array_equal(cloud_to_points(ours).xyzi, cloud_to_points(theirs).xyzi)


def test_the_points_stay_in_the_bytes() -> None:
    data = serialize_message(cloud_msg(_clouds()[0], header(time_msg(STAMP_NS), "lidar")))
    ours = read_point_cloud2(data)
    assert ours.data.obj is data
    assert len(ours.data) == 1000 * 16


def test_an_empty_cloud_reads_as_empty() -> None:
    empty = CloudData((FieldSpec("x", 0, FLOAT32),), 4, 0, 1, 0, False, True, b"")
    ours = read_point_cloud2(serialize_message(cloud_msg(empty, header(time_msg(0), "lidar"))))
    assert (ours.width, len(ours.data), ours.is_dense) == (0, 0, True)


@pytest.mark.parametrize("cut", [0, 3, 10, 40, 100, -1])
def test_cut_short_bytes_are_a_bad_layout(cut: int) -> None:
    data = serialize_message(cloud_msg(_clouds()[0], header(time_msg(STAMP_NS), "lidar")))
    with pytest.raises(CloudError, match="unreadable PointCloud2 CDR") as err:
        read_point_cloud2(data[:cut])
    assert err.value.reason == BAD_LAYOUT


def test_a_count_past_the_end_is_a_bad_layout() -> None:
    data = bytearray(serialize_message(cloud_msg(_clouds()[0], header(time_msg(0), "lidar"))))
    # The field count follows the header (4 + 8 + 4 + 6 = 22, aligned to 24) and two sizes.
    data[32:36] = (1 << 30).to_bytes(4, "little")
    with pytest.raises(CloudError, match="does not fit") as err:
        read_point_cloud2(bytes(data))
    assert err.value.reason == BAD_LAYOUT


def test_not_plain_little_endian_cdr_is_a_bad_layout() -> None:
    data = serialize_message(cloud_msg(_clouds()[0], header(time_msg(0), "lidar")))
    with pytest.raises(CloudError, match="not little-endian plain CDR"):
        read_point_cloud2(b"\x00\x00\x00\x00" + data[4:])
