"""PointCloud2 <-> NumPy without ROS: vectorised point extraction and table clouds."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dynshape_perception.errors import MessageError

# sensor_msgs/PointField datatype codes and their NumPy kinds.
INT8, UINT8, INT16, UINT16, INT32, UINT32, FLOAT32, FLOAT64 = range(1, 9)
DATATYPES: dict[int, str] = {
    INT8: "i1",
    UINT8: "u1",
    INT16: "i2",
    UINT16: "u2",
    INT32: "i4",
    UINT32: "u4",
    FLOAT32: "f4",
    FLOAT64: "f8",
}
_KIND_TO_DATATYPE = {kind: code for code, kind in DATATYPES.items()}

XYZ = ("x", "y", "z")
INTENSITY = "intensity"
POINT_COLUMNS = 4

# Why a cloud was refused; the nodes count drops under these names.
BAD_LENGTH = "bad_length"
BAD_LAYOUT = "bad_layout"
MISSING_FIELDS = "missing_fields"
UNSUPPORTED_DATATYPE = "unsupported_datatype"
NON_FINITE = "non_finite"
EMPTY = "empty"
TABLE_LAYOUT = "table_layout"
DUPLICATE_FIELDS = "duplicate_fields"
OVERLAPPING_FIELDS = "overlapping_fields"
BAD_BOX_SIZE = "bad_box_size"
REASONS = (
    BAD_LENGTH,
    BAD_LAYOUT,
    MISSING_FIELDS,
    UNSUPPORTED_DATATYPE,
    NON_FINITE,
    EMPTY,
    TABLE_LAYOUT,
    DUPLICATE_FIELDS,
    OVERLAPPING_FIELDS,
    BAD_BOX_SIZE,
)


class CloudError(MessageError):
    """A PointCloud2 that cannot be converted; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class CloudLike(Protocol):
    """The parts of sensor_msgs/PointCloud2 read here (duck-typed, so no ROS is needed),
    read only."""

    @property
    def fields(self) -> Sequence[Any]: ...
    @property
    def point_step(self) -> int: ...
    @property
    def row_step(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def is_bigendian(self) -> bool: ...
    @property
    def is_dense(self) -> bool: ...
    @property
    def data(self) -> Any: ...


@dataclass(frozen=True)
class FieldSpec:
    name: str
    offset: int
    datatype: int
    count: int = 1


@dataclass(frozen=True)
class CloudData:
    """A PointCloud2's body, ready to copy into a message."""

    fields: tuple[FieldSpec, ...]
    point_step: int
    row_step: int
    height: int
    width: int
    is_bigendian: bool
    is_dense: bool
    data: bytes


@dataclass(frozen=True)
class Points:
    """Points ``[P, 4]`` float32 (x, y, z, intensity; intensity 0 when the cloud has none)."""

    xyzi: np.ndarray
    removed_non_finite: int
    has_intensity: bool


def _as_bytes(data: Any) -> memoryview:
    view = memoryview(data)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _check_shape(msg: CloudLike) -> tuple[memoryview, int]:
    """Validate sizes and return the data buffer and the point count."""
    height, width = int(msg.height), int(msg.width)
    point_step, row_step = int(msg.point_step), int(msg.row_step)
    data = _as_bytes(msg.data)
    if min(height, width, point_step, row_step) < 0:
        raise CloudError(BAD_LAYOUT, "height, width, point_step and row_step must be >= 0")
    if len(data) != row_step * height:
        raise CloudError(
            BAD_LENGTH,
            f"data holds {len(data)} bytes, but row_step x height = {row_step} x {height} "
            f"= {row_step * height}",
        )
    if height * width == 0:
        raise CloudError(EMPTY, "the cloud holds no points")
    if point_step == 0 or row_step < width * point_step:
        raise CloudError(
            BAD_LAYOUT,
            f"row_step {row_step} is below width x point_step = {width} x {point_step}",
        )
    return data, height * width


def _field_dtype(field: Any, point_step: int, endian: str) -> np.dtype:
    kind = DATATYPES.get(int(field.datatype))
    if kind is None:
        raise CloudError(
            UNSUPPORTED_DATATYPE,
            f"field {field.name!r} has datatype {field.datatype}, not a PointField code 1-8",
        )
    count = int(field.count)
    if count < 1:
        raise CloudError(BAD_LAYOUT, f"field {field.name!r} has count {count}")
    size = np.dtype(kind).itemsize
    if int(field.offset) < 0 or int(field.offset) + size * count > point_step:
        raise CloudError(
            BAD_LAYOUT,
            f"field {field.name!r} at offset {field.offset} does not fit in point_step "
            f"{point_step}",
        )
    return np.dtype(endian + kind)


def _check_fields(msg: CloudLike, endian: str, float32: Sequence[str]) -> dict[str, Any]:
    """Every field, read or not: a known datatype, inside ``point_step``, its name and its
    bytes its own; those named in ``float32`` FLOAT32. A layout that breaks one of these is a
    broken driver or a corrupt message, whose named fields cannot be trusted either."""
    spans: list[tuple[int, int, str]] = []
    for field in msg.fields:
        size = _field_dtype(field, int(msg.point_step), endian).itemsize * int(field.count)
        spans.append((int(field.offset), int(field.offset) + size, str(field.name)))
    for field in msg.fields:
        if str(field.name) in float32 and int(field.datatype) != FLOAT32:
            kind = DATATYPES[int(field.datatype)]
            raise CloudError(
                UNSUPPORTED_DATATYPE, f"field {field.name!r} must be FLOAT32, got {kind}"
            )
    by_name: dict[str, Any] = {}
    for field in msg.fields:
        name = str(field.name)
        if name in by_name:
            raise CloudError(DUPLICATE_FIELDS, f"the cloud has two fields named {name!r}")
        by_name[name] = field
    spans.sort()
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            raise CloudError(
                OVERLAPPING_FIELDS,
                f"fields {first!r} and {second!r} overlap (bytes {start}-{end - 1} of a point)",
            )
    return by_name


def field_columns(
    msg: CloudLike, names: Sequence[str], float32: Sequence[str] = ()
) -> dict[str, np.ndarray]:
    """Zero-copy strided views ``[height, width]`` of the named fields; those in ``float32``
    must be FLOAT32."""
    data, _ = _check_shape(msg)
    endian = ">" if msg.is_bigendian else "<"
    by_name = _check_fields(msg, endian, float32)
    formats = {}
    for name in names:
        field = by_name.get(name)
        if field is not None:
            formats[name] = (_field_dtype(field, int(msg.point_step), endian), int(field.offset))
    if not formats:
        return {}
    record = np.dtype(
        {
            "names": list(formats),
            "formats": [f for f, _ in formats.values()],
            "offsets": [o for _, o in formats.values()],
            "itemsize": int(msg.point_step),
        }
    )
    grid = np.ndarray(
        shape=(int(msg.height), int(msg.width)),
        dtype=record,
        buffer=data,
        strides=(int(msg.row_step), int(msg.point_step)),
    )
    return {name: grid[name] for name in formats}


def cloud_to_points(msg: CloudLike) -> Points:
    """Read x, y, z (float32) and optional intensity (any numeric type) from any layout.

    Organised clouds are flattened row by row. A dense cloud (``is_dense``) holding
    NaN or Inf is refused; a non-dense one loses its non-finite points.
    """
    columns = field_columns(msg, (*XYZ, INTENSITY), float32=XYZ)
    missing = [name for name in XYZ if name not in columns]
    if missing:
        names = [str(f.name) for f in msg.fields]
        raise CloudError(MISSING_FIELDS, f"the cloud lacks field(s) {missing}; it has {names}")
    for name in XYZ:
        if columns[name].dtype.kind != "f" or columns[name].dtype.itemsize != 4:
            raise CloudError(
                UNSUPPORTED_DATATYPE, f"field {name!r} must be FLOAT32, got {columns[name].dtype}"
            )
    count = int(msg.height) * int(msg.width)
    out = np.empty((count, POINT_COLUMNS), dtype=np.float32)
    for i, name in enumerate(XYZ):
        out[:, i] = columns[name].reshape(-1)
    has_intensity = INTENSITY in columns
    if has_intensity:
        out[:, 3] = columns[INTENSITY].reshape(-1)
    else:
        out[:, 3] = 0.0
    removed = 0
    if not np.isfinite(out).all():
        finite = np.isfinite(out).all(axis=1)
        removed = count - int(np.count_nonzero(finite))
        if msg.is_dense:
            raise CloudError(
                NON_FINITE, f"a cloud marked dense holds {removed} point(s) with NaN or Inf"
            )
        out = out[finite]
        if out.shape[0] == 0:
            raise CloudError(EMPTY, f"all {count} points are NaN or Inf")
    return Points(xyzi=out, removed_non_finite=removed, has_intensity=has_intensity)


def fields_of(dtype: np.dtype) -> tuple[FieldSpec, ...]:
    """PointFields describing a structured dtype (scalar numeric fields only)."""
    if dtype.names is None:
        raise MessageError(f"a table needs a structured dtype, got {dtype}")
    specs = []
    for name in dtype.names:
        sub, offset = dtype.fields[name][:2]  # type: ignore[index]
        code = _KIND_TO_DATATYPE.get(f"{sub.kind}{sub.itemsize}")
        if code is None or sub.shape:
            raise MessageError(f"field {name!r} of type {sub} has no PointField datatype")
        specs.append(FieldSpec(name, int(offset), code, 1))
    return tuple(specs)


def encode_cloud(
    table: np.ndarray,
    *,
    height: int = 1,
    is_bigendian: bool = False,
    is_dense: bool = True,
    row_padding: int = 0,
) -> CloudData:
    """Pack a 1-D structured array into a cloud body; ``height > 1`` makes it organised."""
    if table.ndim != 1 or table.dtype.names is None:
        raise MessageError(f"a table must be a 1-D structured array, got {table.dtype}")
    if height < 1 or table.shape[0] % height:
        raise MessageError(f"{table.shape[0]} rows do not split into {height} equal rows")
    width = table.shape[0] // height
    wire = np.zeros(table.shape[0], dtype=table.dtype.newbyteorder(">" if is_bigendian else "<"))
    for name in table.dtype.names:
        wire[name] = table[name]
    point_step = table.dtype.itemsize
    row_step = width * point_step + row_padding
    rows = np.zeros((height, row_step), dtype=np.uint8)
    if table.size:
        rows[:, : width * point_step] = wire.view(np.uint8).reshape(height, -1)
    return CloudData(
        fields=fields_of(table.dtype),
        point_step=point_step,
        row_step=row_step,
        height=height,
        width=width,
        is_bigendian=is_bigendian,
        is_dense=is_dense,
        data=rows.tobytes(),
    )


POINTS_DTYPE = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), (INTENSITY, "<f4")])


def points_to_cloud(points: np.ndarray, **layout: Any) -> CloudData:
    """A cloud of float32 x, y, z, intensity from ``[P, 4]`` points (``encode_cloud`` options)."""
    points = np.ascontiguousarray(points, dtype=np.float32)
    if points.ndim != 2 or points.shape[1] != POINT_COLUMNS:
        raise MessageError(f"points must be [P, 4], got shape {points.shape}")
    return encode_cloud(points.view(POINTS_DTYPE).reshape(-1), **layout)


def cloud_to_table(msg: CloudLike, dtype: np.dtype) -> np.ndarray:
    """Read a table cloud whose fields are exactly those of ``dtype`` (names, types, order)."""
    names = dtype.names or ()
    got = [(str(f.name), int(f.offset), int(f.datatype), int(f.count)) for f in msg.fields]
    want = [(s.name, s.offset, s.datatype, 1) for s in fields_of(dtype)]
    if got != want:
        raise CloudError(
            TABLE_LAYOUT, f"table fields {[g[0] for g in got]} do not match {list(names)}"
        )
    rows = int(msg.height) * int(msg.width)
    if rows == 0:
        if len(_as_bytes(msg.data)) != 0:
            raise CloudError(BAD_LENGTH, "an empty table must carry no data")
        return np.zeros(0, dtype=dtype)
    columns = field_columns(msg, names)
    out = np.empty(rows, dtype=dtype)
    for name in names:
        out[name] = columns[name].reshape(-1)
    return out
