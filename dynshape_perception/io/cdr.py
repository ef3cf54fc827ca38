"""CDR without ROS: autoware_perception_msgs object messages written from NumPy arrays and read
back, PointCloud2 read with its points left in the bytes."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape_perception.errors import MessageError
from dynshape_perception.io.pointcloud2 import BAD_LAYOUT, CloudError, FieldSpec

DETECTED_OBJECTS = "autoware_perception_msgs/msg/DetectedObjects"
TRACKED_OBJECTS = "autoware_perception_msgs/msg/TrackedObjects"
PREDICTED_OBJECTS = "autoware_perception_msgs/msg/PredictedObjects"
# Plain CDR, little endian, no options: what rmw and rosbag2 write.
ENCAPSULATION = b"\x00\x01\x00\x00"
COVARIANCE_SIZE = 36
POSE_SIZE = 7
TWIST_SIZE = 6
UUID_SIZE = 16
# Shape.BOUNDING_BOX; *Kinematics.SIGN_UNKNOWN: a box's heading is known modulo pi only.
BOUNDING_BOX = 0
SIGN_UNKNOWN = 1
# One ObjectClassification per object, certain.
CLASS_PROBABILITY = 1.0
NS_PER_S = 1_000_000_000

_U32 = struct.Struct("<I")
_F32 = struct.Struct("<f")
# The first ObjectClassification: count, label (then 3 pad bytes), probability.
_ONE_CLASS = struct.Struct("<IB3xf")
_ONE_CLASS_PAD = (5, 3)
_TIME = struct.Struct("<iI")
_F64 = np.dtype("<f8")


@dataclass(frozen=True)
class ObjectArrays:
    """The numbers of one object message, N objects: ``header`` (sec, nanosec, frame_id),
    ``existence [N]`` float32, ``labels [N]`` ObjectClassification labels, ``poses [N, 7]``
    (x, y, z, qx, qy, qz, qw), ``pose_covariances [N, 36]``, ``twists [N, 6]`` (in the
    object's frame), ``twist_covariances [N, 36]``, ``dimensions [N, 3]``; tracked and
    predicted objects add ``uuids [N, 16]`` and ``stationary [N]``; predicted objects their
    paths: objects ``path_rows [P]`` hold ``path_poses [P, K, H, 7]`` with
    ``path_confidences [P, K]``, one ``time_step`` (sec, nanosec)."""

    header: tuple[int, int, str]
    existence: np.ndarray
    labels: np.ndarray
    poses: np.ndarray
    pose_covariances: np.ndarray
    twists: np.ndarray
    twist_covariances: np.ndarray
    dimensions: np.ndarray
    uuids: np.ndarray = field(default_factory=lambda: np.zeros((0, UUID_SIZE), np.uint8))
    stationary: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    path_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp))
    path_poses: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0, POSE_SIZE)))
    path_confidences: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    time_step: tuple[int, int] = (0, 0)

    @property
    def size(self) -> int:
        return int(self.existence.shape[0])


class CdrWriter:
    """Appends CDR fields, each aligned to its size from the start of the payload."""

    def __init__(self) -> None:
        self.buf = bytearray(ENCAPSULATION)
        # Where padding went: Fast CDR leaves those bytes unset, so only the rest is compared.
        self.pads: list[tuple[int, int]] = []

    def align(self, n: int) -> None:
        pad = -(len(self.buf) - len(ENCAPSULATION)) % n
        if pad:
            self.pads.append((len(self.buf), pad))
            self.buf += bytes(pad)

    def packed(self, fmt: struct.Struct, *values: float | int) -> None:
        """Fields of at most 4-byte alignment, starting 4-aligned."""
        self.align(4)
        self.buf += fmt.pack(*values)

    def u32(self, value: int) -> None:
        self.align(4)
        self.buf += _U32.pack(value)

    def one_class(self, label: int) -> None:
        """A classification of one ObjectClassification."""
        self.align(4)
        self.pads.append((len(self.buf) + _ONE_CLASS_PAD[0], _ONE_CLASS_PAD[1]))
        self.buf += _ONE_CLASS.pack(1, label, CLASS_PROBABILITY)

    def doubles(self, values: bytes) -> None:
        self.align(8)
        self.buf += values

    def string(self, text: str) -> None:
        raw = text.encode()
        self.u32(len(raw) + 1)
        self.buf += raw + b"\x00"

    def splice(self, part: CdrWriter) -> None:
        """The payload of ``part``, written on its own: the same bytes here only where it
        starts 4-aligned and holds no 8-byte field, as one field of strings and counts does."""
        self.align(4)
        shift = len(self.buf) - len(ENCAPSULATION)
        self.pads += [(start + shift, n) for start, n in part.pads]
        self.buf += part.buf[len(ENCAPSULATION) :]

    def padding_mask(self) -> np.ndarray:
        """``[len(buf)]`` bool: True on the alignment padding bytes."""
        mask = np.zeros(len(self.buf), bool)
        for start, n in self.pads:
            mask[start : start + n] = True
        return mask


def _rows_f64(*blocks: np.ndarray) -> list[bytes]:
    """Per object, the bytes of its float64 blocks side by side."""
    joined = np.ascontiguousarray(np.concatenate(blocks, axis=1), dtype=_F64)
    return [row.tobytes() for row in joined]


def _check(arrays: ObjectArrays, msgtype: str) -> None:
    n = arrays.size
    shapes = {
        "labels": (arrays.labels.shape, (n,)),
        "poses": (arrays.poses.shape, (n, POSE_SIZE)),
        "pose_covariances": (arrays.pose_covariances.shape, (n, COVARIANCE_SIZE)),
        "twists": (arrays.twists.shape, (n, TWIST_SIZE)),
        "twist_covariances": (arrays.twist_covariances.shape, (n, COVARIANCE_SIZE)),
        "dimensions": (arrays.dimensions.shape, (n, 3)),
    }
    if msgtype != DETECTED_OBJECTS:
        shapes["uuids"] = (arrays.uuids.shape, (n, UUID_SIZE))
        shapes["stationary"] = (arrays.stationary.shape, (n,))
    for name, (got, want) in shapes.items():
        if got != want:
            raise MessageError(f"{msgtype}: {name} must be {want}, got {got}")
    p_n = arrays.path_rows.shape[0]
    if arrays.path_poses.shape[0] != p_n or arrays.path_confidences.shape != (
        p_n,
        arrays.path_poses.shape[1],
    ):
        raise MessageError(
            f"{msgtype}: {p_n} objects with paths, poses {arrays.path_poses.shape}, "
            f"confidences {arrays.path_confidences.shape}"
        )


def encode(msgtype: str, arrays: ObjectArrays) -> bytes:
    """The CDR bytes of a DetectedObjects, TrackedObjects or PredictedObjects: what
    ``rclpy.serialization.serialize_message`` gives for the same message (zeros where it
    leaves alignment padding unset)."""
    return bytes(_encode(msgtype, arrays).buf)


def padding_mask(msgtype: str, arrays: ObjectArrays) -> np.ndarray:
    """``[len(encode(...))]`` bool: True on the alignment padding bytes."""
    return _encode(msgtype, arrays).padding_mask()


def _encode(msgtype: str, arrays: ObjectArrays) -> CdrWriter:
    if msgtype not in (DETECTED_OBJECTS, TRACKED_OBJECTS, PREDICTED_OBJECTS):
        raise MessageError(f"no CDR writer for {msgtype}")
    _check(arrays, msgtype)
    out = CdrWriter()
    sec, nanosec, frame_id = arrays.header
    out.packed(_TIME, sec, nanosec)
    out.string(frame_id)
    out.u32(arrays.size)
    n = arrays.size
    existence = arrays.existence.astype(np.float32).tolist()
    labels = arrays.labels.astype(np.uint8).tolist()
    dims = [row.tobytes() for row in np.ascontiguousarray(arrays.dimensions, dtype=_F64)]
    if msgtype == DETECTED_OBJECTS:
        poses = _rows_f64(arrays.poses, arrays.pose_covariances)
        twists = _rows_f64(arrays.twists, arrays.twist_covariances)
        for i in range(n):
            out.packed(_F32, existence[i])
            out.one_class(labels[i])
            out.doubles(poses[i])
            # has_position_covariance, orientation_availability
            out.buf += bytes((0, SIGN_UNKNOWN))
            out.doubles(twists[i])
            # has_twist, has_twist_covariance
            out.buf += bytes((0, 0))
            _shape(out, dims[i])
        return out
    no_accel = np.zeros((n, TWIST_SIZE + COVARIANCE_SIZE))
    kinematics = _rows_f64(
        arrays.poses, arrays.pose_covariances, arrays.twists, arrays.twist_covariances, no_accel
    )
    uuids = [row.tobytes() for row in np.ascontiguousarray(arrays.uuids, dtype=np.uint8)]
    stationary = arrays.stationary.tolist()
    paths = _paths(arrays) if msgtype == PREDICTED_OBJECTS else {}
    for i in range(n):
        out.buf += uuids[i]
        out.packed(_F32, existence[i])
        out.one_class(labels[i])
        out.doubles(kinematics[i])
        if msgtype == TRACKED_OBJECTS:
            # orientation_availability, is_stationary
            out.buf += bytes((SIGN_UNKNOWN, int(stationary[i])))
        else:
            _predicted_paths(out, paths.get(i))
        _shape(out, dims[i])
    return out


def _shape(out: CdrWriter, dimensions: bytes) -> None:
    out.buf.append(BOUNDING_BOX)
    out.u32(0)  # an empty footprint
    out.doubles(dimensions)


_Paths = tuple[np.ndarray, np.ndarray, tuple[int, int]]


def _paths(arrays: ObjectArrays) -> dict[int, _Paths]:
    """Per object row with paths: its paths' poses ``[K, H, 7]``, confidences ``[K]`` and
    the time step."""
    poses = np.ascontiguousarray(arrays.path_poses, dtype=_F64)
    confidences = np.asarray(arrays.path_confidences, dtype=np.float32)
    return {
        int(row): (poses[p], confidences[p], arrays.time_step)
        for p, row in enumerate(arrays.path_rows.tolist())
    }


def _path_dtype(steps: int) -> np.dtype:
    """One PredictedPath as CDR lays it out when its count starts 4 bytes past an 8-byte
    boundary: the poses then fall on one, and nothing in it is padded."""
    return np.dtype(
        [
            ("steps", "<u4"),
            ("poses", _F64, (steps, POSE_SIZE)),
            ("sec", "<i4"),
            ("nanosec", "<u4"),
            ("confidence", "<f4"),
        ]
    )


def _predicted_paths(out: CdrWriter, paths: _Paths | None) -> None:
    if paths is None:
        out.u32(0)
        return
    poses, confidences, (sec, nanosec) = paths
    out.u32(poses.shape[0])
    if poses.shape[0] == 0:
        return
    out.u32(poses.shape[1])
    out.doubles(poses[0].tobytes())
    out.packed(_TIME, sec, nanosec)
    out.buf += _F32.pack(float(confidences[0]))
    # A path is 16 + 56 H bytes: each one ends, and the next begins, 4 bytes past an
    # 8-byte boundary, so the others go in as one unpadded block.
    rest = np.zeros(poses.shape[0] - 1, _path_dtype(poses.shape[1]))
    rest["steps"] = poses.shape[1]
    rest["poses"] = poses[1:]
    rest["sec"], rest["nanosec"] = sec, nanosec
    rest["confidence"] = confidences[1:]
    out.buf += rest.tobytes()


# -- reading --------------------------------------------------------------------------------
_I32U32 = struct.Struct("<iI")
_U32U32 = struct.Struct("<II")
_U8F32 = struct.Struct("<B3xf")
# The fewest bytes one object takes: what bounds a count before anything is allocated.
_MIN_OBJECT_BYTES = 100


@dataclass(frozen=True)
class ReadPath:
    """One predicted path read back: ``poses [H, 7]``, its time step and confidence."""

    poses: np.ndarray
    time_step_s: float
    confidence: float


@dataclass(frozen=True)
class Decoded:
    """An object message read from CDR: its numbers (``labels`` the most probable
    classification's, UNKNOWN where none) and, for predicted objects, each object's paths."""

    arrays: ObjectArrays
    paths: list[list[ReadPath]]


class _Reader:
    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data = bytes(data)
        if self.data[: len(ENCAPSULATION)] != ENCAPSULATION:
            raise MessageError(
                f"not little-endian plain CDR: encapsulation {self.data[:4].hex() or 'missing'}"
            )
        self.pos = len(ENCAPSULATION)

    def align(self, n: int) -> None:
        self.pos += -(self.pos - len(ENCAPSULATION)) % n

    def take(self, n: int) -> int:
        start = self.pos
        if start + n > len(self.data):
            raise MessageError(f"CDR message ends at {len(self.data)} bytes, before {start + n}")
        self.pos += n
        return start

    def unpack(self, fmt: struct.Struct) -> tuple[Any, ...]:
        self.align(4)
        return fmt.unpack_from(self.data, self.take(fmt.size))

    def u8(self) -> int:
        return self.data[self.take(1)]

    def count(self, item_bytes: int) -> int:
        (n,) = self.unpack(_U32)
        if n * item_bytes > len(self.data) - self.pos:
            raise MessageError(f"a sequence of {n} does not fit in {len(self.data)} bytes")
        return int(n)

    def doubles(self, n: int) -> np.ndarray:
        self.align(8)
        return np.frombuffer(self.data, _F64, n, self.take(8 * n))

    def string(self) -> str:
        n = self.count(1)
        raw = self.data[self.take(n) : self.pos]
        if not raw or raw[-1] != 0:
            raise MessageError("a CDR string without its terminating NUL")
        return raw[:-1].decode(errors="replace")


def decode(msgtype: str, data: bytes | bytearray | memoryview) -> Decoded:
    """A DetectedObjects, TrackedObjects or PredictedObjects from its CDR bytes; MessageError
    if they are not one."""
    if msgtype not in (DETECTED_OBJECTS, TRACKED_OBJECTS, PREDICTED_OBJECTS):
        raise MessageError(f"no CDR reader for {msgtype}")
    r = _Reader(data)
    sec, nanosec = r.unpack(_I32U32)
    frame_id = r.string()
    n = r.count(_MIN_OBJECT_BYTES)
    uuids = np.zeros((n, UUID_SIZE), np.uint8)
    existence = np.zeros(n, np.float32)
    labels = np.zeros(n, np.uint8)
    kinematics = np.zeros((n, POSE_SIZE + COVARIANCE_SIZE + TWIST_SIZE + COVARIANCE_SIZE))
    dims = np.zeros((n, 3))
    stationary = np.zeros(n, bool)
    paths: list[list[ReadPath]] = []
    pose_end = POSE_SIZE + COVARIANCE_SIZE
    for i in range(n):
        if msgtype != DETECTED_OBJECTS:
            uuids[i] = np.frombuffer(r.data, np.uint8, UUID_SIZE, r.take(UUID_SIZE))
        (existence[i],) = r.unpack(_F32)
        best = -math.inf
        for _ in range(r.count(8)):
            label, probability = r.unpack(_U8F32)
            if probability > best:
                labels[i], best = label, probability
        if msgtype == DETECTED_OBJECTS:
            kinematics[i, :pose_end] = r.doubles(pose_end)
            r.take(2)  # has_position_covariance, orientation_availability
            kinematics[i, pose_end:] = r.doubles(TWIST_SIZE + COVARIANCE_SIZE)
            r.take(2)  # has_twist, has_twist_covariance
        else:
            kinematics[i] = r.doubles(kinematics.shape[1])
            r.doubles(TWIST_SIZE + COVARIANCE_SIZE)  # the acceleration
        if msgtype == TRACKED_OBJECTS:
            r.take(1)  # orientation_availability
            stationary[i] = bool(r.u8())
        elif msgtype == PREDICTED_OBJECTS:
            paths.append(_read_paths(r))
        r.u8()  # shape type
        r.take(12 * r.count(12))  # the footprint's Point32s
        dims[i] = r.doubles(3)
    arrays = ObjectArrays(
        header=(int(sec), int(nanosec), frame_id),
        existence=existence,
        labels=labels,
        poses=kinematics[:, :POSE_SIZE],
        pose_covariances=kinematics[:, POSE_SIZE:pose_end],
        twists=kinematics[:, pose_end : pose_end + TWIST_SIZE],
        twist_covariances=kinematics[:, pose_end + TWIST_SIZE :],
        dimensions=dims,
        uuids=uuids,
        stationary=stationary,
    )
    return Decoded(arrays, paths)


def _read_paths(r: _Reader) -> list[ReadPath]:
    out = []
    for _ in range(r.count(24)):
        h = r.count(POSE_SIZE * _F64.itemsize)
        poses = r.doubles(POSE_SIZE * h).reshape(h, POSE_SIZE)
        sec, nanosec = r.unpack(_I32U32)
        (confidence,) = r.unpack(_F32)
        out.append(ReadPath(poses, sec + nanosec / NS_PER_S, confidence))
    return out


def header_of(data: bytes | bytearray | memoryview) -> tuple[int, int, str]:
    """The header (sec, nanosec, frame_id) that starts any stamped message's CDR bytes."""
    return _header(_Reader(data))


def _header(r: _Reader) -> tuple[int, int, str]:
    sec, nanosec = r.unpack(_I32U32)
    return int(sec), int(nanosec), r.string()


def first_element_header(data: bytes | bytearray | memoryview) -> tuple[int, int, str] | None:
    """The header of the first element of a message that is one sequence of stamped
    messages (a MarkerArray's first marker); None when the sequence is empty."""
    r = _Reader(data)
    (count,) = r.unpack(_U32)
    return _header(r) if count else None


def stamp_s_of(data: bytes | bytearray | memoryview) -> float | None:
    """The header stamp of a stamped message's CDR bytes in seconds; None if unreadable."""
    try:
        sec, nanosec, _ = header_of(data)
    except MessageError:
        return None
    return sec + nanosec / NS_PER_S


# The fewest bytes one PointField takes: a one-character name, offset, datatype, count.
_MIN_FIELD_BYTES = 13


@dataclass(frozen=True)
class SerializedCloud:
    """A sensor_msgs/PointCloud2 read from its CDR bytes: the header (sec, nanosec,
    frame_id) and, as ``pointcloud2.CloudLike``, its layout, ``data`` a view of the bytes."""

    header: tuple[int, int, str]
    height: int
    width: int
    fields: tuple[FieldSpec, ...]
    is_bigendian: bool
    point_step: int
    row_step: int
    data: memoryview
    is_dense: bool


def read_point_cloud2(data: bytes | bytearray | memoryview) -> SerializedCloud:
    """The cloud in ``data`` without copying its points: a lidar's cloud is megabytes, which
    a message object would copy once more. Unreadable bytes are a ``bad_layout`` CloudError."""
    try:
        r = _Reader(data)
        header = _header(r)
        height, width = r.unpack(_U32U32)
        fields = []
        for _ in range(r.count(_MIN_FIELD_BYTES)):
            name = r.string()
            (offset,) = r.unpack(_U32)
            datatype = r.u8()
            (count,) = r.unpack(_U32)
            fields.append(FieldSpec(name, int(offset), int(datatype), int(count)))
        is_bigendian = bool(r.u8())
        point_step, row_step = r.unpack(_U32U32)
        size = r.count(1)
        start = r.take(size)
        is_dense = bool(r.u8())
    except MessageError as err:
        raise CloudError(BAD_LAYOUT, f"unreadable PointCloud2 CDR: {err}") from err
    return SerializedCloud(
        header,
        int(height),
        int(width),
        tuple(fields),
        is_bigendian,
        int(point_step),
        int(row_step),
        memoryview(r.data)[start : start + size],
        is_dense,
    )
