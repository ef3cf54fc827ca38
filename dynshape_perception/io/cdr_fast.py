"""DetectedObjects and TrackedObjects CDR read at once where every object is laid out alike."""

from __future__ import annotations

import functools
import struct
from typing import Any

import numpy as np

# The CDR payload starts after the 4-byte encapsulation; alignment counts from there.
_BASE = 4
_U32 = struct.Struct("<I")
_F64 = np.dtype("<f8")
_CLASS = np.dtype({"names": ["label", "probability"], "formats": ["u1", "<f4"], "offsets": [0, 4]})
_POSE_SIZE = 7
_TWIST_SIZE = 6
_UUID_SIZE = 16
_POSE = _POSE_SIZE + 36
_TWIST = _TWIST_SIZE + 36
# Sequences longer than this take the generic reader: no layout is built for them.
MAX_SEQUENCE = 64


class _Walk:
    """The offsets of one object's fields, aligned as the generic reader aligns them."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.pos = start
        self.names: list[str] = []
        self.formats: list[np.dtype] = []
        self.offsets: list[int] = []

    def add(self, name: str, fmt: np.dtype, align: int) -> None:
        self.pos += -(self.pos - _BASE) % align
        self.names.append(name)
        self.formats.append(fmt)
        self.offsets.append(self.pos - self.start)
        self.pos += fmt.itemsize

    def dtype(self) -> np.dtype:
        return np.dtype(
            {
                "names": self.names,
                "formats": self.formats,
                "offsets": self.offsets,
                "itemsize": self.pos - self.start,
            }
        )


def _array(item: np.dtype | str, n: int) -> np.dtype:
    return np.dtype((item, (n,))) if n else np.dtype((np.uint8, (0,)))


@functools.lru_cache(maxsize=64)
def _object_dtype(tracked: bool, start: int, classes: int, points: int) -> np.dtype:
    """One object starting ``start`` bytes past an 8-byte boundary of the data (4 or 0 past
    one of the payload) with ``classes`` classifications and ``points`` footprint points."""
    w = _Walk(start)
    u8 = np.dtype(np.uint8)
    if tracked:
        w.add("uuid", _array(u8, 16), 1)
    w.add("existence", np.dtype("<f4"), 4)
    w.add("classes", np.dtype("<u4"), 4)
    if classes:
        w.add("class", _array(_CLASS, classes), 4)
    if tracked:
        w.add("kinematics", _array(_F64, _POSE + _TWIST), 8)
        w.add("acceleration", _array(_F64, _TWIST), 8)
        w.add("flags", _array(u8, 2), 1)
    else:
        w.add("pose", _array(_F64, _POSE), 8)
        w.add("pose_flags", _array(u8, 2), 1)
        w.add("twist", _array(_F64, _TWIST), 8)
        w.add("twist_flags", _array(u8, 2), 1)
    w.add("shape_type", u8, 1)
    w.add("points", np.dtype("<u4"), 4)
    if points:
        w.add("footprint", _array(np.dtype("<f4"), 3 * points), 4)
    w.add("dimensions", _array(_F64, 3), 8)
    return w.dtype()


def _count_at(data: bytes, at: int) -> int | None:
    if at + 4 > len(data):
        return None
    count: int = _U32.unpack_from(data, at)[0]
    return count if count <= MAX_SEQUENCE else None


def _offset(dtype: np.dtype, name: str) -> int:
    fields = dtype.fields
    assert fields is not None
    offset: int = fields[name][1]
    return offset


def _first_layout(tracked: bool, data: bytes, pos: int) -> tuple[np.dtype, int, int] | None:
    """The first object's layout at ``pos`` and its sequence lengths (classifications,
    footprint points), read from the data."""
    classes = _count_at(data, pos + _offset(_object_dtype(tracked, pos % 8, 0, 0), "classes"))
    if classes is None:
        return None
    with_classes = _object_dtype(tracked, pos % 8, classes, 0)
    points = _count_at(data, pos + _offset(with_classes, "points"))
    if points is None:
        return None
    return _object_dtype(tracked, pos % 8, classes, points), classes, points


@functools.lru_cache(maxsize=64)
def _early_fields(first: np.dtype, rest: np.dtype) -> tuple[int, tuple[str, ...]] | None:
    """How many bytes (0 or 4) of padding the first object has before its first float64
    that the others lack, and the fields before it; None if the two differ otherwise."""
    shift = first.itemsize - rest.itemsize
    early = []
    for name in rest.names or ():
        moved = _offset(first, name) - _offset(rest, name)
        if moved not in (0, shift):
            return None
        if moved == 0 and shift:
            early.append(name)
    if early != list((rest.names or ())[: len(early)]):
        return None
    return shift, tuple(early)


def read_objects(tracked: bool, data: bytes, pos: int, n: int) -> dict[str, Any] | None:
    """The ObjectArrays fields but the header of the ``n`` DetectedObjects (TrackedObjects
    if ``tracked``) from ``pos`` of ``data``; None where they are not all laid out alike
    and inside the data (the generic reader then reads them, or tells what is wrong)."""
    if n == 0 or (pos - _BASE) % 4:
        return None
    layout = _first_layout(tracked, data, pos)
    if layout is None:
        return None
    first, classes, points = layout
    rest = _object_dtype(tracked, (pos + first.itemsize) % 8, classes, points)
    shifted = _early_fields(first, rest)
    if shifted is None or pos + first.itemsize + (n - 1) * rest.itemsize > len(data):
        return None
    shift, early = shifted
    # One row per object, each where its float64s lie: the first object's fields before
    # them sit ``shift`` bytes earlier, so its row takes those from a row at ``pos``.
    rows = np.frombuffer(data, rest, n, pos + shift)
    columns = {name: rows[name] for name in rest.names or ()}
    if early:
        head = np.frombuffer(data, rest, 1, pos)
        for name in early:
            columns[name] = np.concatenate([head[name], rows[name][1:]])
    if (columns["classes"] != classes).any() or (columns["points"] != points).any():
        return None
    return _gather(tracked, columns, n, classes)


def _as_python_floats(values: np.ndarray) -> np.ndarray:
    """float32s through float64, as the generic reader's Python floats go: a signalling NaN
    comes back quiet, as it does there."""
    with np.errstate(invalid="ignore"):
        return values.astype(np.float64).astype(np.float32)


def _gather(tracked: bool, columns: dict[str, np.ndarray], n: int, classes: int) -> dict[str, Any]:
    """The ObjectArrays fields but the header, as the generic reader lays them out."""
    # As the generic reader: the first most probable class, UNKNOWN (0) where none beats -inf.
    labels = np.zeros(n, np.uint8)
    if classes:
        found = columns["class"]
        best = np.full(n, -np.inf)
        for c in range(classes):
            probability = found["probability"][:, c].astype(np.float64)
            better = probability > best
            best = np.where(better, probability, best)
            labels = np.where(better, found["label"][:, c], labels)
    if tracked:
        kinematics = columns["kinematics"].copy()
    else:
        kinematics = np.concatenate([columns["pose"], columns["twist"]], axis=1)
    pose_end = _POSE
    fields: dict[str, Any] = {
        "existence": _as_python_floats(columns["existence"]),
        "labels": labels.astype(np.uint8),
        "poses": kinematics[:, :_POSE_SIZE],
        "pose_covariances": kinematics[:, _POSE_SIZE:pose_end],
        "twists": kinematics[:, pose_end : pose_end + _TWIST_SIZE],
        "twist_covariances": kinematics[:, pose_end + _TWIST_SIZE :],
        "dimensions": columns["dimensions"].copy(),
    }
    if tracked:
        fields["uuids"] = columns["uuid"].copy()
        fields["stationary"] = columns["flags"][:, 1] != 0
    else:
        fields["uuids"] = np.zeros((n, _UUID_SIZE), np.uint8)
        fields["stationary"] = np.zeros(n, bool)
    return fields
