"""PointCloud2 <-> NumPy conversion on every layout a driver can send, and on broken ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.errors import MessageError
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.io.pointcloud2 import (
    BAD_BOX_SIZE,
    BAD_LAYOUT,
    BAD_LENGTH,
    DUPLICATE_FIELDS,
    EMPTY,
    FLOAT32,
    FLOAT64,
    MISSING_FIELDS,
    NON_FINITE,
    OVERLAPPING_FIELDS,
    TABLE_LAYOUT,
    UINT8,
    UNSUPPORTED_DATATYPE,
    CloudData,
    CloudError,
    FieldSpec,
    cloud_to_points,
    cloud_to_table,
    encode_cloud,
    fields_of,
    points_to_cloud,
)
from dynshape_perception.io.tables import check_box_sizes
from dynshape_perception.io.tables_reader import read_table
from dynshape_perception.perception.records import OBSTACLE_DTYPE, PREDICTION_DTYPE, TRACK_DTYPE


def _points(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 10.0, size=(n, 4)).astype(np.float32)


def _ouster_like(points: np.ndarray) -> np.ndarray:
    """A driver layout: t, intensity (uint8), padding, x, y, z after it, 48-byte points."""
    dtype = np.dtype(
        {
            "names": ["t", "intensity", "x", "y", "z", "ring"],
            "formats": ["<u4", "u1", "<f4", "<f4", "<f4", "<u2"],
            "offsets": [0, 4, 16, 20, 24, 40],
            "itemsize": 48,
        }
    )
    table = np.zeros(points.shape[0], dtype=dtype)
    table["x"], table["y"], table["z"] = points[:, 0], points[:, 1], points[:, 2]
    table["intensity"] = np.arange(points.shape[0]) % 256
    return table


def test_round_trip_plain() -> None:
    points = _points(1000)
    out = cloud_to_points(points_to_cloud(points))
    np.testing.assert_array_equal(out.xyzi, points)
    assert out.removed_non_finite == 0 and out.has_intensity


def test_kitti_scan_round_trip(kitti_bin: Path) -> None:
    points = read_kitti_bin(kitti_bin)
    cloud = points_to_cloud(points)
    assert cloud.point_step == 16 and cloud.row_step == 16 * points.shape[0]
    np.testing.assert_array_equal(cloud_to_points(cloud).xyzi, points)


@pytest.mark.parametrize("bigendian", [False, True])
@pytest.mark.parametrize("height", [1, 4])
@pytest.mark.parametrize("row_padding", [0, 12])
def test_any_layout(bigendian: bool, height: int, row_padding: int) -> None:
    points = _points(64, seed=3)
    table = _ouster_like(points)
    cloud = encode_cloud(table, height=height, is_bigendian=bigendian, row_padding=row_padding)
    assert cloud.height == height and cloud.width == 64 // height
    out = cloud_to_points(cloud)
    np.testing.assert_array_equal(out.xyzi[:, :3], points[:, :3])
    np.testing.assert_array_equal(out.xyzi[:, 3], (np.arange(64) % 256).astype(np.float32))


def test_big_endian_bytes_are_big_endian() -> None:
    cloud = points_to_cloud(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), is_bigendian=True)
    assert cloud.data[:4] == np.array([1.0], ">f4").tobytes()
    assert cloud_to_points(cloud).xyzi.tolist() == [[1.0, 2.0, 3.0, 4.0]]


def test_without_intensity_reads_zero() -> None:
    xyz = np.zeros(5, dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4")])
    xyz["x"] = np.arange(5)
    out = cloud_to_points(encode_cloud(xyz))
    assert not out.has_intensity
    assert out.xyzi[:, 3].tolist() == [0.0] * 5 and out.xyzi[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_intensity_of_any_numeric_type() -> None:
    table = np.zeros(3, dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("intensity", "<f8")])
    table["intensity"] = [0.5, 100.0, 255.0]
    assert cloud_to_points(encode_cloud(table)).xyzi[:, 3].tolist() == [0.5, 100.0, 255.0]


def test_non_dense_cloud_loses_nan_points() -> None:
    points = _points(100)
    points[[3, 50], 0] = np.nan
    points[7, 2] = np.inf
    out = cloud_to_points(points_to_cloud(points, is_dense=False))
    assert out.removed_non_finite == 3 and out.xyzi.shape == (97, 4)
    assert np.isfinite(out.xyzi).all()


def test_dense_cloud_with_nan_is_refused() -> None:
    points = _points(10)
    points[4, 1] = np.nan
    with pytest.raises(CloudError, match="dense") as info:
        cloud_to_points(points_to_cloud(points, is_dense=True))
    assert info.value.reason == NON_FINITE


def test_all_nan_is_empty() -> None:
    points = np.full((4, 4), np.nan, np.float32)
    with pytest.raises(CloudError) as info:
        cloud_to_points(points_to_cloud(points, is_dense=False))
    assert info.value.reason == EMPTY


def _broken(cloud: CloudData, **changes: object) -> CloudData:
    return replace(cloud, **changes)  # type: ignore[arg-type]


XYZI = (
    FieldSpec("x", 0, FLOAT32),
    FieldSpec("y", 4, FLOAT32),
    FieldSpec("z", 8, FLOAT32),
    FieldSpec("intensity", 12, FLOAT32),
)


@pytest.mark.parametrize(
    ("changes", "reason", "match"),
    [
        ({"data": b"\0" * 100}, BAD_LENGTH, "row_step x height"),
        ({"row_step": 8, "data": b"\0" * 8}, BAD_LAYOUT, "row_step"),
        ({"width": 0, "row_step": 0, "data": b""}, EMPTY, "no points"),
        (
            {"fields": XYZI[:2]},
            MISSING_FIELDS,
            "'z'",
        ),
        (
            {"fields": (FieldSpec("x", 12, FLOAT64), *XYZI[1:3])},
            BAD_LAYOUT,
            "does not fit",
        ),
        (
            {"fields": (FieldSpec("x", 0, UINT8), *XYZI[1:3])},
            UNSUPPORTED_DATATYPE,
            "FLOAT32",
        ),
        (
            {"fields": (FieldSpec("x", 0, 42), *XYZI[1:3])},
            UNSUPPORTED_DATATYPE,
            "datatype 42",
        ),
    ],
)
def test_bad_clouds(changes: dict[str, object], reason: str, match: str) -> None:
    cloud = points_to_cloud(_points(4))
    with pytest.raises(CloudError, match=match) as info:
        cloud_to_points(_broken(cloud, **changes))
    assert info.value.reason == reason
    assert isinstance(info.value, MessageError)


@pytest.mark.parametrize(
    ("fields", "reason", "match"),
    [
        # A field the conversion never reads is checked all the same.
        ((*XYZI[:3], FieldSpec("ring", 12, 42)), UNSUPPORTED_DATATYPE, "'ring' has datatype 42"),
        ((*XYZI[:3], FieldSpec("ring", 12, 0)), UNSUPPORTED_DATATYPE, "datatype 0"),
        ((XYZI[0], FieldSpec("y", 2, FLOAT32), *XYZI[2:]), OVERLAPPING_FIELDS, "'x' and 'y'"),
        ((*XYZI[:3], FieldSpec("ring", 10, UINT8)), OVERLAPPING_FIELDS, "'z' and 'ring'"),
        ((*XYZI[:3], FieldSpec("x", 12, FLOAT32)), DUPLICATE_FIELDS, "two fields named 'x'"),
        ((*XYZI[:3], FieldSpec("pad", 14, FLOAT32)), BAD_LAYOUT, "'pad' at offset 14"),
    ],
    ids=["unknown-datatype", "datatype-zero", "y-overlaps-x", "overlap", "duplicate", "past-step"],
)
def test_every_field_is_checked(fields: tuple[FieldSpec, ...], reason: str, match: str) -> None:
    cloud = _broken(points_to_cloud(_points(4)), fields=fields)
    with pytest.raises(CloudError, match=match) as info:
        cloud_to_points(cloud)
    assert info.value.reason == reason


def test_fields_that_touch_but_do_not_overlap_are_fine() -> None:
    fields = (*XYZI[:3], FieldSpec("ring", 12, UINT8), FieldSpec("t", 13, UINT8, count=3))
    out = cloud_to_points(_broken(points_to_cloud(_points(4)), fields=fields))
    assert out.xyzi.shape == (4, 4) and not out.has_intensity


@pytest.mark.parametrize("name", ["length", "width", "height"])
@pytest.mark.parametrize("size", [-1.0, 0.0, float("nan"), float("inf")])
def test_an_obstacle_box_of_no_size_is_refused(name: str, size: float) -> None:
    table = np.zeros(3, dtype=OBSTACLE_DTYPE)
    for field in ("length", "width", "height"):
        table[field] = 1.0
    assert check_box_sizes(table) is table
    table[name][1] = size
    with pytest.raises(CloudError, match=f"obstacle 1 has {name}") as info:
        check_box_sizes(cloud_to_table(encode_cloud(table), OBSTACLE_DTYPE))
    assert info.value.reason == BAD_BOX_SIZE


def test_float64_xyz_is_unsupported() -> None:
    table = np.zeros(2, dtype=[("x", "<f8"), ("y", "<f8"), ("z", "<f8")])
    with pytest.raises(CloudError, match="FLOAT32") as info:
        cloud_to_points(encode_cloud(table))
    assert info.value.reason == UNSUPPORTED_DATATYPE


def test_conversion_reads_a_memoryview_without_copying_per_point() -> None:
    cloud = points_to_cloud(_points(150_000))
    # CloudData holds bytes; a view on purpose, as the nodes' zero-copy reads pass one.
    view = replace(cloud, data=memoryview(bytearray(cloud.data)))  # type: ignore[arg-type]
    out = cloud_to_points(view)
    assert out.xyzi.shape == (150_000, 4)


@pytest.mark.parametrize("dtype", [OBSTACLE_DTYPE, TRACK_DTYPE, PREDICTION_DTYPE])
def test_table_round_trip_and_reader(dtype: np.dtype) -> None:
    rng = np.random.default_rng(1)
    table = np.zeros(7, dtype=dtype)
    for name in dtype.names or ():
        table[name] = rng.integers(0, 1000, size=7).astype(dtype[name])
    cloud = encode_cloud(table)
    assert cloud.point_step == dtype.itemsize and cloud.height == 1 and not cloud.is_bigendian
    np.testing.assert_array_equal(cloud_to_table(cloud, dtype), table)
    read = read_table(cloud)
    assert read.dtype.names == dtype.names
    for name in dtype.names or ():
        np.testing.assert_array_equal(read[name], table[name])


def test_documented_table_layouts() -> None:
    obstacle = [(f.name, f.offset, f.datatype) for f in fields_of(OBSTACLE_DTYPE)]
    floats = ["x", "y", "z", "length", "width", "height", "yaw", "score"]
    assert obstacle == [(n, 4 * i, FLOAT32) for i, n in enumerate(floats)] + [
        ("label", 32, 6),
        ("num_points", 36, 6),
    ]
    track = [(f.name, f.datatype) for f in fields_of(TRACK_DTYPE)]
    assert track[10:] == [("id", 6), ("vx", FLOAT32), ("vy", FLOAT32), ("age", 6)]
    prediction = [(f.name, f.datatype) for f in fields_of(PREDICTION_DTYPE)]
    assert prediction == [
        ("id", 6),
        ("k", 6),
        ("step", 6),
        ("x", FLOAT32),
        ("y", FLOAT32),
        ("prob", FLOAT32),
    ]


def test_empty_table_round_trip() -> None:
    cloud = encode_cloud(np.zeros(0, dtype=TRACK_DTYPE))
    assert cloud.width == 0 and cloud.data == b""
    assert cloud_to_table(cloud, TRACK_DTYPE).shape == (0,)
    assert read_table(cloud).shape == (0,)


def test_table_with_other_fields_is_refused() -> None:
    cloud = encode_cloud(np.zeros(3, dtype=OBSTACLE_DTYPE))
    with pytest.raises(CloudError, match="do not match") as info:
        cloud_to_table(cloud, TRACK_DTYPE)
    assert info.value.reason == TABLE_LAYOUT
    with pytest.raises(CloudError) as info:
        cloud_to_table(points_to_cloud(_points(3)), OBSTACLE_DTYPE)
    assert info.value.reason == TABLE_LAYOUT


def test_encode_refuses_non_tables() -> None:
    with pytest.raises(MessageError, match="structured"):
        encode_cloud(np.zeros(3, np.float32))
    with pytest.raises(MessageError, match="equal rows"):
        encode_cloud(np.zeros(5, OBSTACLE_DTYPE), height=2)


@pytest.mark.parametrize("dtype", [OBSTACLE_DTYPE, TRACK_DTYPE])
def test_read_table_skips_row_padding_of_organised_tables(dtype: np.dtype) -> None:
    rng = np.random.default_rng(3)
    table = np.zeros(6, dtype=dtype)
    for name in dtype.names or ():
        table[name] = rng.integers(1, 99, table.size)
    for layout in ({"height": 3, "row_padding": 4}, {"height": 2, "row_padding": 7}, {}):
        read = read_table(encode_cloud(table, **layout))  # type: ignore[arg-type]
        for name in dtype.names or ():
            np.testing.assert_array_equal(read[name], table[name])


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"fields": (FieldSpec("x", 0, 9),)}, "datatype 9"),
        ({"fields": (FieldSpec("x", 40, FLOAT32),)}, "do not fit"),
        ({"data": b"\0" * 10}, "fewer than row_step"),
        ({"row_step": 4}, "row_step must be"),
        ({"height": -1}, "bad layout"),
    ],
)
def test_read_table_refuses_bad_layouts(changes: dict[str, object], match: str) -> None:
    cloud = encode_cloud(np.zeros(3, dtype=OBSTACLE_DTYPE))
    with pytest.raises(MessageError, match=match):
        read_table(_broken(cloud, **changes))
