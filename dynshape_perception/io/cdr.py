"""CDR without ROS: autoware_perception_msgs object messages written from NumPy arrays and read
back, PointCloud2 read with its points left in the bytes, the pose of a nav_msgs/Odometry."""

from __future__ import annotations

import functools
import math
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape_perception.errors import MessageError
from dynshape_perception.io.cdr_fast import read_objects
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
    p_n, poses = arrays.path_rows.shape[0], arrays.path_poses.shape
    if (
        len(poses) != 4
        or poses[0] != p_n
        or poses[3] != POSE_SIZE
        or arrays.path_confidences.shape != (p_n, poses[1])
    ):
        raise MessageError(
            f"{msgtype}: {p_n} objects with paths, poses {arrays.path_poses.shape}, "
            f"confidences {arrays.path_confidences.shape}"
        )


def encode(msgtype: str, arrays: ObjectArrays) -> bytes:
    """The CDR bytes of a DetectedObjects, TrackedObjects or PredictedObjects: what
    ``rclpy.serialization.serialize_message`` gives for the same message (zeros where it
    leaves alignment padding unset)."""
    laid = _lay_out(msgtype, arrays)
    rows = [raw for raw, _ in laid.groups]
    head = np.frombuffer(laid.head.buf, np.uint8)
    return b"".join([p.data for p in laid.pieces(head, rows, _SHIFT_BYTES)])


def padding_mask(msgtype: str, arrays: ObjectArrays) -> np.ndarray:
    """``[len(encode(...))]`` bool: True on the alignment padding bytes."""
    laid = _lay_out(msgtype, arrays)
    rows = [np.tile(layout.pads, raw.size // layout.dtype.itemsize) for raw, layout in laid.groups]
    head = laid.head.padding_mask()
    return np.concatenate(laid.pieces(head, rows, np.ones(_SHIFT, bool)))


# Every object ends with its 8-byte dimensions, so all but the first start on an 8-byte
# boundary; the first starts there or 4 bytes past one, as the header leaves it.
_SHIFT = 4
_SHIFT_BYTES = np.zeros(_SHIFT, np.uint8)
_SHIFT_BYTES.flags.writeable = False


@dataclass(frozen=True)
class _Layout:
    """One object's bytes as CDR lays them out when it starts on an 8-byte boundary: the
    ``dtype`` (``pads``: the bytes no field covers), a ``template`` row with the constant
    fields set, and ``shift_at``: the first 8-byte field, before which an object starting 4
    past a boundary takes 4 more bytes of padding (the fields before it are 4-aligned and
    a multiple of 8 bytes long, so all after it fall as they do at a boundary)."""

    dtype: np.dtype
    template: np.ndarray
    pads: np.ndarray
    shift_at: int


class _Fields:
    """Fields one after another, each aligned to its size (at most 8) as CDR aligns them."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.formats: list[np.dtype] = []
        self.offsets: list[int] = []
        self.end = 0

    def add(self, name: str, item: Any, shape: tuple[int, ...] = (), align: int = 0) -> None:
        item = np.dtype(item)
        self.end += -self.end % (align or item.itemsize)
        fmt = np.dtype((item, shape)) if shape else item
        self.names.append(name)
        self.formats.append(fmt)
        self.offsets.append(self.end)
        self.end += fmt.itemsize

    def dtype(self) -> np.dtype:
        return np.dtype(
            {
                "names": self.names,
                "formats": self.formats,
                "offsets": self.offsets,
                "itemsize": self.end,
            }
        )


@functools.lru_cache(maxsize=32)
def _layout(msgtype: str, paths: int, steps: int) -> _Layout:
    """A DetectedObject, TrackedObject or PredictedObject (with ``paths`` PredictedPaths of
    ``steps`` poses), field by field as its message definition orders them."""
    f = _Fields()
    if msgtype != DETECTED_OBJECTS:
        f.add("uuid", np.uint8, (UUID_SIZE,))
    f.add("existence", "<f4")
    f.add("classes", "<u4")  # a sequence of one ObjectClassification
    f.add("label", np.uint8)
    f.add("probability", "<f4")
    f.add("pose", _F64, (POSE_SIZE,))
    f.add("pose_covariance", _F64, (COVARIANCE_SIZE,))
    if msgtype == DETECTED_OBJECTS:
        f.add("has_position_covariance", np.uint8)
        f.add("orientation_availability", np.uint8)
    f.add("twist", _F64, (TWIST_SIZE,))
    f.add("twist_covariance", _F64, (COVARIANCE_SIZE,))
    if msgtype == DETECTED_OBJECTS:
        f.add("has_twist", np.uint8)
        f.add("has_twist_covariance", np.uint8)
    else:
        f.add("acceleration", _F64, (TWIST_SIZE,))
        f.add("acceleration_covariance", _F64, (COVARIANCE_SIZE,))
    if msgtype == TRACKED_OBJECTS:
        f.add("orientation_availability", np.uint8)
        f.add("is_stationary", np.uint8)
    if msgtype == PREDICTED_OBJECTS:
        f.add("paths", "<u4")
        if paths:
            # A path is 16 + 56 H bytes and starts 4 past an 8-byte boundary, as the next
            # one does: the paths are one unpadded block.
            f.add("path", _path_dtype(steps), (paths,), align=4)
    f.add("shape_type", np.uint8)
    f.add("footprint", "<u4")  # an empty sequence of points
    f.add("dimensions", _F64, (3,))
    dtype = f.dtype()
    template = np.zeros(1, dtype)
    template["classes"] = 1
    template["probability"] = CLASS_PROBABILITY
    if msgtype != PREDICTED_OBJECTS:
        template["orientation_availability"] = SIGN_UNKNOWN
    template["shape_type"] = BOUNDING_BOX
    if paths:
        template["paths"] = paths
        template["path"]["steps"] = steps
    covered = np.zeros(dtype.itemsize, bool)
    _cover(covered, dtype, 0)
    raw = template.view(np.uint8)
    raw.flags.writeable = False
    return _Layout(dtype, raw, ~covered, f.offsets[f.names.index("pose")])


def _cover(covered: np.ndarray, dtype: np.dtype, start: int) -> None:
    """Marks the bytes of ``dtype``'s fields, placed at ``start``."""
    for fmt, offset, *_ in (dtype.fields or {}).values():
        item, shape = fmt.subdtype or (fmt, ())
        for i in range(math.prod(shape)):
            at = start + offset + i * item.itemsize
            if item.names:
                _cover(covered, item, at)
            else:
                covered[at : at + item.itemsize] = True


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


_Which = slice | np.ndarray


class _Scratch(threading.local):
    """Per thread, the buffer the rows are filled in and kept between messages: one as
    large as a message, allocated each time, comes back from the system in fresh pages
    whose faults cost more than filling them."""

    def __init__(self) -> None:
        self.buf = np.empty(0, np.uint8)

    def take(self, size: int) -> np.ndarray:
        if self.buf.size < size:
            self.buf = np.empty(size, np.uint8)
        return self.buf[:size]


_SCRATCH = _Scratch()


def _rows(layout: _Layout, arrays: ObjectArrays, which: _Which, raw: np.ndarray) -> np.ndarray:
    """The objects ``which`` of ``arrays`` as rows of ``layout`` in ``raw`` (paths left as
    the template has them)."""
    raw.reshape(-1, layout.dtype.itemsize)[:] = layout.template
    rows = np.frombuffer(raw, layout.dtype)
    rows["existence"] = arrays.existence[which]
    rows["label"] = arrays.labels[which]
    rows["pose"] = arrays.poses[which]
    rows["pose_covariance"] = arrays.pose_covariances[which]
    rows["twist"] = arrays.twists[which]
    rows["twist_covariance"] = arrays.twist_covariances[which]
    rows["dimensions"] = arrays.dimensions[which]
    names = layout.dtype.names or ()
    if "uuid" in names:
        rows["uuid"] = arrays.uuids[which]
    if "is_stationary" in names:
        rows["is_stationary"] = arrays.stationary[which]
    return rows


@dataclass(frozen=True)
class _Laid:
    """An object message laid out: its header, the rows of each group of objects alike (as
    bytes), and the runs of consecutive objects of one group, (group, first row, end row),
    in order."""

    head: CdrWriter
    groups: list[tuple[np.ndarray, _Layout]]
    runs: list[tuple[int, int, int]]

    def pieces(
        self, head: np.ndarray, rows: list[np.ndarray], shift: np.ndarray
    ) -> list[np.ndarray]:
        """The message's parts in order, of ``head``, each group's flat ``rows`` and the
        ``shift`` the first object takes (bytes or padding masks alike)."""
        out = [head]
        for group, first, end in self.runs:
            size = self.groups[group][1].dtype.itemsize
            out.append(rows[group][first * size : end * size])
        if self.runs and (len(self.head.buf) - len(ENCAPSULATION)) % 8:
            at = self.groups[self.runs[0][0]][1].shift_at
            out[1:2] = [out[1][:at], shift, out[1][at:]]
        return out


def _lay_out(msgtype: str, arrays: ObjectArrays) -> _Laid:
    if msgtype not in (DETECTED_OBJECTS, TRACKED_OBJECTS, PREDICTED_OBJECTS):
        raise MessageError(f"no CDR writer for {msgtype}")
    _check(arrays, msgtype)
    head = CdrWriter()
    sec, nanosec, frame_id = arrays.header
    head.packed(_TIME, sec, nanosec)
    head.string(frame_id)
    n = arrays.size
    head.u32(n)
    p_n, k = arrays.path_confidences.shape
    with_paths = msgtype == PREDICTED_OBJECTS and p_n > 0 and k > 0
    order = _path_order(arrays.path_rows, n) if with_paths else slice(None)
    if n == 0:
        return _Laid(head, [], [])
    plain = _layout(msgtype, 0, 0)
    if not with_paths:
        raw = _SCRATCH.take(n * plain.dtype.itemsize)
        _rows(plain, arrays, slice(None), raw)
        return _Laid(head, [(raw, plain)], [(0, 0, n)])
    rows = arrays.path_rows[order]
    paths_layout = _layout(msgtype, k, arrays.path_poses.shape[2])
    split = p_n * paths_layout.dtype.itemsize
    raw = _SCRATCH.take(split + (n - p_n) * plain.dtype.itemsize)
    # With a path each, the objects are the rows 0..n-1 in order.
    paths = _rows(paths_layout, arrays, slice(None) if p_n == n else rows, raw[:split])
    path = paths["path"]
    path["poses"] = arrays.path_poses[order]
    path["confidence"] = arrays.path_confidences[order]
    path["sec"], path["nanosec"] = arrays.time_step
    if p_n == n:
        return _Laid(head, [(raw, paths_layout)], [(0, 0, n)])
    has = np.zeros(n, bool)
    has[rows] = True
    _rows(plain, arrays, np.flatnonzero(~has), raw[split:])
    return _Laid(head, [(raw[split:], plain), (raw[:split], paths_layout)], _runs(has))


def _path_order(rows: np.ndarray, n: int) -> _Which:
    """The order that sorts the object rows of the paths; MessageError unless they are
    distinct objects of ``n``."""
    order: _Which = slice(None)
    if (rows[1:] <= rows[:-1]).any():
        order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    if ordered[0] < 0 or ordered[-1] >= n or (ordered[1:] == ordered[:-1]).any():
        raise MessageError(
            f"{PREDICTED_OBJECTS}: path rows must be distinct objects of {n}, got {rows.tolist()}"
        )
    return order


def _runs(with_paths: np.ndarray) -> list[tuple[int, int, int]]:
    """The runs of consecutive objects without (group 0) and with paths (group 1)."""
    bounds = [0, *(np.flatnonzero(with_paths[1:] != with_paths[:-1]) + 1).tolist()]
    ends = [*bounds[1:], with_paths.size]
    done = [0, 0]
    runs = []
    for start, end, group in zip(bounds, ends, with_paths[bounds].tolist(), strict=True):
        g = int(group)
        runs.append((g, done[g], done[g] + end - start))
        done[g] += end - start
    return runs


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

    def doubles_at(self, n: int) -> int:
        """Skip ``n`` aligned float64s; where they start."""
        self.align(8)
        return self.take(8 * n)

    def gather(self, dtype: Any, starts: list[int], n: int) -> np.ndarray:
        """``[len(starts), n]`` items of ``dtype`` from each start (each already taken:
        inside the data, and aligned as ``dtype`` is relative to the CDR start)."""
        item = np.dtype(dtype).itemsize
        base = len(ENCAPSULATION)
        every = np.frombuffer(self.data, dtype, (len(self.data) - base) // item, base)
        first = (np.array(starts, np.int64) - base) // item
        gathered: np.ndarray = every[first[:, None] + np.arange(n)].reshape(len(starts), n)
        return gathered

    def string(self) -> str:
        n = self.count(1)
        raw = self.data[self.take(n) : self.pos]
        if not raw or raw[-1] != 0:
            raise MessageError("a CDR string without its terminating NUL")
        return raw[:-1].decode(errors="replace")


def decode(msgtype: str, data: bytes | bytearray | memoryview, fast: bool = True) -> Decoded:
    """A DetectedObjects, TrackedObjects or PredictedObjects from its CDR bytes; MessageError
    if they are not one. With ``fast``, objects all laid out alike are read at once."""
    if msgtype not in (DETECTED_OBJECTS, TRACKED_OBJECTS, PREDICTED_OBJECTS):
        raise MessageError(f"no CDR reader for {msgtype}")
    r = _Reader(data)
    sec, nanosec = r.unpack(_I32U32)
    frame_id = r.string()
    n = r.count(_MIN_OBJECT_BYTES)
    if fast and msgtype != PREDICTED_OBJECTS:
        read = read_objects(msgtype == TRACKED_OBJECTS, r.data, r.pos, n)
        if read is not None:
            return Decoded(ObjectArrays(header=(int(sec), int(nanosec), frame_id), **read), [])
    kinematics_size = POSE_SIZE + COVARIANCE_SIZE + TWIST_SIZE + COVARIANCE_SIZE
    pose_end = POSE_SIZE + COVARIANCE_SIZE
    # Where each object's numbers lie: the loop only walks the layout, and each array is
    # gathered at once after it (numbers copied one object at a time cost several times more).
    uuid_at: list[int] = []
    existence_of: list[float] = []
    label_of: list[int] = []
    pose_at: list[int] = []
    twist_at: list[int] = []
    dims_at: list[int] = []
    stationary_of: list[bool] = []
    paths: list[list[ReadPath]] = []
    for _ in range(n):
        if msgtype != DETECTED_OBJECTS:
            uuid_at.append(r.take(UUID_SIZE))
        existence_of.append(r.unpack(_F32)[0])
        best, best_label = -math.inf, 0
        for _ in range(r.count(8)):
            label, probability = r.unpack(_U8F32)
            if probability > best:
                best_label, best = label, probability
        label_of.append(best_label)
        if msgtype == DETECTED_OBJECTS:
            pose_at.append(r.doubles_at(pose_end))
            r.take(2)  # has_position_covariance, orientation_availability
            twist_at.append(r.doubles_at(TWIST_SIZE + COVARIANCE_SIZE))
            r.take(2)  # has_twist, has_twist_covariance
        else:
            pose_at.append(r.doubles_at(kinematics_size))
            r.doubles_at(TWIST_SIZE + COVARIANCE_SIZE)  # the acceleration
        if msgtype == TRACKED_OBJECTS:
            r.take(1)  # orientation_availability
            stationary_of.append(bool(r.u8()))
        elif msgtype == PREDICTED_OBJECTS:
            paths.append(_read_paths(r))
        r.u8()  # shape type
        r.take(12 * r.count(12))  # the footprint's Point32s
        dims_at.append(r.doubles_at(3))
    uuids = (
        r.gather(np.uint8, uuid_at, UUID_SIZE) if uuid_at else np.zeros((n, UUID_SIZE), np.uint8)
    )
    existence = np.array(existence_of, np.float32)
    labels = np.array(label_of, np.uint8)
    if msgtype == DETECTED_OBJECTS:
        kinematics = np.concatenate(
            [
                r.gather(_F64, pose_at, pose_end),
                r.gather(_F64, twist_at, TWIST_SIZE + COVARIANCE_SIZE),
            ],
            axis=1,
        )
    else:
        kinematics = r.gather(_F64, pose_at, kinematics_size)
    dims = r.gather(_F64, dims_at, 3)
    stationary = np.array(stationary_of, bool) if stationary_of else np.zeros(n, bool)
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


# An Odometry's fixed-size tail: its pose (position, orientation), the pose's covariance, its
# twist and the twist's covariance, in float64s.
_ODOMETRY_TAIL = POSE_SIZE + COVARIANCE_SIZE + TWIST_SIZE + COVARIANCE_SIZE
_POSE = struct.Struct("<7d")


@dataclass(frozen=True)
class OdometryPose:
    """The header and the pose of a nav_msgs/Odometry: all of it a node's pose buffer reads."""

    sec: int
    nanosec: int
    frame_id: str
    position: tuple[float, float, float]
    orientation: tuple[float, float, float, float]


def read_odometry(data: bytes | bytearray | memoryview) -> OdometryPose:
    """The header and pose of a nav_msgs/Odometry's CDR bytes; MessageError unless the whole
    message is there. rclpy's own read builds every field as a Python object, several times
    slower once the caches have gone cold between frames (``scripts/odometry_read_cost.py``)."""
    r = _Reader(data)
    sec, nanosec, frame_id = _header(r)
    r.string()  # child_frame_id
    x, y, z, qx, qy, qz, qw = _POSE.unpack_from(r.data, r.doubles_at(_ODOMETRY_TAIL))
    return OdometryPose(sec, nanosec, frame_id, (x, y, z), (qx, qy, qz, qw))


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
