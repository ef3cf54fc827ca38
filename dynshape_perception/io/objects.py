"""Standard object messages <-> the tables, without ROS: autoware_perception_msgs out (as CDR
bytes), vision_msgs and autoware_perception_msgs in (duck-typed)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dynshape_perception.errors import MessageError, TransformError
from dynshape_perception.io.cdr import (
    DETECTED_OBJECTS as DETECTED_OBJECTS,
)
from dynshape_perception.io.cdr import (
    PREDICTED_OBJECTS as PREDICTED_OBJECTS,
)
from dynshape_perception.io.cdr import (
    TRACKED_OBJECTS as TRACKED_OBJECTS,
)
from dynshape_perception.io.cdr import (
    ObjectArrays,
    ReadPath,
    decode,
    encode,
)
from dynshape_perception.io.classes import (
    classification_of,
    label_of_class_id,
    label_of_classification,
)
from dynshape_perception.io.tables import BOX_SIZES, check_box_sizes
from dynshape_perception.perception.objects import (
    UUID_BYTES,
    ObjectParams,
    TrackUuids,
    existence_probability,
    pose_covariance,
    twist_covariance,
)
from dynshape_perception.perception.prediction.paths import PredictedPaths
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.perception.transforms import MIN_QUATERNION_NORM as MIN_NORM
from dynshape_perception.perception.transforms import normalised_quaternion

if TYPE_CHECKING:
    from dynshape_perception.perception.tracking import Tracker

DETECTION3D_ARRAY = "vision_msgs/msg/Detection3DArray"
OBJECT_TYPES = (DETECTED_OBJECTS, TRACKED_OBJECTS, PREDICTED_OBJECTS)
# A path step shorter than this gives no heading: the pose keeps the one before.
MIN_HEADING_STEP_M = 1e-6
NS_PER_S = 1_000_000_000


def yaw_of_quaternion(q: Any) -> float:
    """The heading of a message quaternion, normalised first; MessageError if degenerate."""
    return _yaw(q.x, q.y, q.z, q.w)


def _yaw(qx: float, qy: float, qz: float, qw: float) -> float:
    try:
        x, y, z, w = normalised_quaternion(qx, qy, qz, qw)
    except TransformError as err:
        raise MessageError(str(err)) from err
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


@dataclass(frozen=True)
class TrackStates:
    """Tracks as the standard messages carry them: the table rows, one UUID, existence
    probability and missed-frame count each."""

    tracks: np.ndarray
    uuids: np.ndarray
    existence: np.ndarray
    missed: np.ndarray

    def __post_init__(self) -> None:
        n = self.tracks.shape[0]
        if self.uuids.shape != (n, UUID_BYTES) or self.existence.shape != (n,):
            raise MessageError(
                f"track states disagree: {n} tracks, uuids {self.uuids.shape}, "
                f"existence {self.existence.shape}"
            )
        if self.missed.shape != (n,):
            raise MessageError(f"track states disagree: {n} tracks, missed {self.missed.shape}")

    @classmethod
    def of_tracker(cls, tracks: np.ndarray, tracker: Tracker, uuids: TrackUuids) -> TrackStates:
        """``tracks``, just returned by ``tracker``, with its hit and miss counts (read them
        under the tracker's lock)."""
        return cls(
            tracks,
            uuids.of(tracks["id"]),
            existence_probability(tracker.hits, tracker.missed, tracker.params.max_missed_frames),
            tracker.missed,
        )


def _poses(x: np.ndarray, y: np.ndarray, z: np.ndarray, yaw: np.ndarray) -> np.ndarray:
    """``[..., 7]`` float64 poses (position, then a quaternion about z)."""
    half = np.asarray(yaw, np.float64) / 2.0
    out = np.zeros((*half.shape, 7))
    out[..., 0], out[..., 1], out[..., 2] = x, y, z
    out[..., 5], out[..., 6] = np.sin(half), np.cos(half)
    return out


def _header(stamp_ns: int, frame_id: str) -> tuple[int, int, str]:
    sec, nanosec = divmod(int(stamp_ns), NS_PER_S)
    return sec, nanosec, frame_id


def detected_arrays(stamp_ns: int, frame_id: str, obstacles: np.ndarray) -> ObjectArrays:
    """A DetectedObjects' numbers of obstacle rows: boxes with their class, existence = the
    score."""
    n = obstacles.shape[0]
    return ObjectArrays(
        header=_header(stamp_ns, frame_id),
        existence=np.clip(obstacles["score"], 0.0, 1.0).astype(np.float32),
        labels=classification_of(obstacles["label"]).astype(np.uint8),
        poses=_poses(obstacles["x"], obstacles["y"], obstacles["z"], obstacles["yaw"]),
        pose_covariances=np.zeros((n, 36)),
        twists=np.zeros((n, 6)),
        twist_covariances=np.zeros((n, 36)),
        dimensions=_dimensions(obstacles),
    )


def _dimensions(table: np.ndarray) -> np.ndarray:
    return np.stack([table["length"], table["width"], table["height"]], axis=-1).astype(np.float64)


def _tracked(
    stamp_ns: int, frame_id: str, states: TrackStates, params: ObjectParams
) -> dict[str, Any]:
    """The ObjectArrays fields of each track: its UUID, velocity in the object's frame (x
    along its heading, as autoware's object kinematics carry the twist), covariances and
    existence."""
    tracks = states.tracks
    yaw = tracks["yaw"].astype(np.float64)
    vx, vy = tracks["vx"].astype(np.float64), tracks["vy"].astype(np.float64)
    c, s = np.cos(yaw), np.sin(yaw)
    twists = np.zeros((tracks.shape[0], 6))
    twists[:, 0], twists[:, 1] = c * vx + s * vy, -s * vx + c * vy
    return {
        "header": _header(stamp_ns, frame_id),
        "existence": np.asarray(states.existence, np.float32),
        "labels": classification_of(tracks["label"]).astype(np.uint8),
        "poses": _poses(tracks["x"], tracks["y"], tracks["z"], yaw),
        "pose_covariances": pose_covariance(states.missed, params),
        "twists": twists,
        "twist_covariances": twist_covariance(states.missed, params),
        "dimensions": _dimensions(tracks),
        "uuids": np.asarray(states.uuids, np.uint8),
        "stationary": np.hypot(vx, vy) < params.stationary_speed_mps,
    }


def tracked_arrays(
    stamp_ns: int, frame_id: str, states: TrackStates, params: ObjectParams
) -> ObjectArrays:
    """A TrackedObjects' numbers: each track with its UUID, velocity, covariances and
    existence."""
    return ObjectArrays(**_tracked(stamp_ns, frame_id, states, params))


def path_poses(xy: np.ndarray, start: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``[A, K, H, 7]`` poses along ``xy [A, K, H, 2]`` at heights ``z [A]``, each heading
    along its step; a step too short to give one keeps the previous heading (at first the
    agent's, ``start [A, 3]`` = x, y, yaw)."""
    xy = np.asarray(xy, np.float64)
    start = np.asarray(start, np.float64)
    h_n = xy.shape[2]
    # The steps as [2, A, K, H]: each component contiguous for the ufuncs below.
    along = np.moveaxis(xy, -1, 0)
    step = np.empty(along.shape)
    np.subtract(along[..., 0], start.T[:2, :, None], out=step[..., 0])
    np.subtract(along[..., 1:], along[..., :-1], out=step[..., 1:])
    moved = np.hypot(step[0], step[1]) > MIN_HEADING_STEP_M
    yaw = np.arctan2(step[1], step[0])
    if not moved.all():
        # The index of the last step that gave a heading, -1 for none yet.
        last = np.maximum.accumulate(np.where(moved, np.arange(h_n), -1), axis=2)
        yaw = np.where(
            last >= 0,
            np.take_along_axis(yaw, np.maximum(last, 0), axis=2),
            start[:, None, None, 2],
        )
    heights = np.asarray(z, np.float64)[:, None, None]
    return _poses(along[0], along[1], heights, yaw)


def predicted_arrays(
    stamp_ns: int,
    frame_id: str,
    states: TrackStates,
    paths: PredictedPaths,
    params: ObjectParams,
) -> ObjectArrays:
    """A PredictedObjects' numbers: every track, with the K hypotheses of the predicted ones
    as predicted paths (confidence each, ``time_step`` the predictor's step, poses in the
    fixed frame at the track's height); tracks too new to predict have no path yet."""
    tracks = states.tracks
    rows, which = _agents_of(tracks["id"], paths.ids)
    start = np.stack([tracks["x"][rows], tracks["y"][rows], tracks["yaw"][rows]], axis=-1)
    poses = path_poses(paths.paths[which], start, tracks["z"][rows])
    sec, nanosec = divmod(round(paths.step_s * NS_PER_S), NS_PER_S)
    return ObjectArrays(
        **_tracked(stamp_ns, frame_id, states, params),
        path_rows=rows,
        path_poses=poses,
        path_confidences=np.asarray(paths.confidences[which], np.float32),
        time_step=(sec, nanosec),
    )


def _agents_of(track_ids: np.ndarray, agent_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the tracks that have an agent, and its index (the last of an id given
    twice)."""
    order = np.argsort(agent_ids, kind="stable")
    ordered = agent_ids[order]
    at = np.searchsorted(ordered, track_ids, side="right") - 1
    found = at >= 0
    found[found] = ordered[at[found]] == track_ids[found]
    rows = np.flatnonzero(found)
    return rows, order[at[rows]]


def detected_objects(stamp_ns: int, frame_id: str, obstacles: np.ndarray) -> bytes:
    """A DetectedObjects, serialised (CDR), of obstacle rows."""
    return encode(DETECTED_OBJECTS, detected_arrays(stamp_ns, frame_id, obstacles))


def tracked_objects(
    stamp_ns: int, frame_id: str, states: TrackStates, params: ObjectParams
) -> bytes:
    """A TrackedObjects, serialised (CDR), of track states."""
    return encode(TRACKED_OBJECTS, tracked_arrays(stamp_ns, frame_id, states, params))


def predicted_objects(
    stamp_ns: int,
    frame_id: str,
    states: TrackStates,
    paths: PredictedPaths,
    params: ObjectParams,
) -> bytes:
    """A PredictedObjects, serialised (CDR), of track states and their predicted paths."""
    return encode(PREDICTED_OBJECTS, predicted_arrays(stamp_ns, frame_id, states, paths, params))


# -- reading --------------------------------------------------------------------------------
def _check_boxes(table: np.ndarray, what: str) -> np.ndarray:
    """NaN or Inf: a MessageError; a box of no size: a CloudError (``bad_box_size``)."""
    if _all_usable(table):
        return table
    floats = [n for n in table.dtype.names or () if table.dtype[n].kind == "f"]
    if table.size and not all(np.isfinite(table[n]).all() for n in floats):
        raise MessageError(f"a {what} holds NaN or Inf")
    return check_box_sizes(table, what)


# An object of a message that is none (NaN, no size, an unknown class number): dropped
# alone, the others of its message kept.
BAD_OBJECT = "bad_object"


@functools.lru_cache(maxsize=8)
def _float_layout(dtype: np.dtype) -> slice | None:
    """The box sizes' columns where the records are 4-byte scalars back to back, the sizes
    side by side (rows of a float32 matrix), or None."""
    names, fields = dtype.names, dtype.fields
    if not names or fields is None or dtype.itemsize != 4 * len(names):
        return None
    for i, name in enumerate(names):
        if dtype[name].itemsize != 4 or dtype[name].shape or fields[name][1] != 4 * i:
            return None
    columns = [names.index(n) for n in BOX_SIZES if n in names]
    if not columns or columns != list(range(columns[0], columns[0] + len(columns))):
        return None
    if any(dtype[names[c]].kind != "f" for c in columns):
        return None
    return slice(columns[0], columns[0] + len(columns))


def _all_usable(table: np.ndarray) -> bool:
    """True only if no row has a problem: every float finite, every box size positive.
    One pass over the table as a float32 matrix, as few calls as may be: a message's rows
    are checked at every input, with the code cold. Integer fields are tested as floats
    too; one whose bits read as NaN or Inf only sends the table the long way."""
    sizes = _float_layout(table.dtype)
    if sizes is None or table.ndim != 1 or not table.flags.c_contiguous:
        return False
    matrix = table.view(np.float32).reshape(-1, table.dtype.itemsize // 4)
    return bool(np.isfinite(matrix).all() and (matrix[:, sizes] > 0.0).all())


def row_problems(table: np.ndarray, what: str) -> dict[int, str]:
    """What makes each unusable row so: a NaN or Inf, or a box of no size (``_check_boxes``
    refuses the whole table for the first of them)."""
    if _all_usable(table):
        return {}
    return _problems_by_column(table, what)


def _problems_by_column(table: np.ndarray, what: str) -> dict[int, str]:
    problems: dict[int, str] = {}
    for name in table.dtype.names or ():
        column = table[name]
        bad = ~np.isfinite(column) if column.dtype.kind == "f" else np.zeros(column.shape, bool)
        if name in BOX_SIZES:
            bad |= ~(column > 0.0)
        for row in np.flatnonzero(bad).tolist():
            problems.setdefault(row, f"{what} {row} has {name} {float(column[row])!r}")
    return problems


def detections_to_obstacles(msg: Any, problems: dict[int, str] | None = None) -> np.ndarray:
    """A vision_msgs/Detection3DArray as obstacle rows; score and class from the best
    hypothesis (class ids through the one class map of ``perception.classes``). With
    ``problems``, a detection that is no obstacle is recorded there by row, not refused
    with the message, and the rows are not checked."""
    out = np.zeros(len(msg.detections), dtype=OBSTACLE_DTYPE)
    for i, det in enumerate(msg.detections):
        centre, size = det.bbox.center, det.bbox.size
        out[i]["x"], out[i]["y"], out[i]["z"] = (
            centre.position.x,
            centre.position.y,
            centre.position.z,
        )
        out[i]["length"], out[i]["width"], out[i]["height"] = size.x, size.y, size.z
        out[i]["yaw"] = yaw_of_quaternion(centre.orientation)
        if det.results:
            best = max(det.results, key=lambda r: r.hypothesis.score)
            out[i]["score"] = best.hypothesis.score
            try:
                out[i]["label"] = label_of_class_id(str(best.hypothesis.class_id))
            except MessageError as err:
                if problems is None:
                    raise
                problems[i] = f"detection {i}: {err}"
    return out if problems is not None else _check_boxes(out, "detection")


Message = Any
"""A message object (rclpy or rosbags), or its CDR bytes."""


def _message_arrays(msgtype: str, msg: Any) -> ObjectArrays:
    """The numbers the tables need of an object message object (duck-typed)."""
    objects = list(msg.objects)
    n = len(objects)
    poses, twists, dims = np.zeros((n, 7)), np.zeros((n, 6)), np.zeros((n, 3))
    existence, labels = np.zeros(n, np.float32), np.zeros(n, np.uint8)
    pose_of = "pose_with_covariance"
    twist_of = "twist_with_covariance"
    if msgtype == PREDICTED_OBJECTS:
        pose_of, twist_of = "initial_" + pose_of, "initial_" + twist_of
    for i, obj in enumerate(objects):
        pose = getattr(obj.kinematics, pose_of).pose
        p, q, d = pose.position, pose.orientation, obj.shape.dimensions
        poses[i] = (p.x, p.y, p.z, q.x, q.y, q.z, q.w)
        linear = getattr(obj.kinematics, twist_of).twist.linear
        twists[i, :3] = linear.x, linear.y, linear.z
        dims[i] = d.x, d.y, d.z
        existence[i] = obj.existence_probability
        if obj.classification:
            labels[i] = max(obj.classification, key=lambda c: c.probability).label
    return ObjectArrays(
        header=(int(msg.header.stamp.sec), int(msg.header.stamp.nanosec), msg.header.frame_id),
        existence=existence,
        labels=labels,
        poses=poses,
        pose_covariances=np.zeros((n, 36)),
        twists=twists,
        twist_covariances=np.zeros((n, 36)),
        dimensions=dims,
        uuids=_uuids(objects)
        if msgtype != DETECTED_OBJECTS
        else np.zeros((n, UUID_BYTES), np.uint8),
    )


def _read(msgtype: str, msg: Message) -> tuple[ObjectArrays, list[list[ReadPath]] | None]:
    """The numbers of a message, and its paths when read from bytes (None: read them from
    the message object)."""
    if isinstance(msg, bytes | bytearray | memoryview):
        decoded = decode(msgtype, msg)
        return decoded.arrays, decoded.paths
    return _message_arrays(msgtype, msg), None


_LABEL_OF_CLASSIFICATION = np.array([label_of_classification(c) for c in range(256)])


def _yaws(quaternions: np.ndarray) -> list[float]:
    """``_yaw`` of each ``[N, 4]`` quaternion: the same float operations in the same order,
    each but atan2 on all at once (NumPy's arctan2 may round otherwise than ``math``'s)."""
    q = np.asarray(quaternions, np.float64)
    with np.errstate(all="ignore"):
        sq = q * q
        norm = np.sqrt(sq[:, 0] + sq[:, 1] + sq[:, 2] + sq[:, 3])
        if not (np.isfinite(q).all() and np.isfinite(norm).all() and (norm >= MIN_NORM).all()):
            # The first degenerate one raises its own error.
            return [_yaw(*v) for v in q.tolist()]
        x, y, z, w = (q[:, i] / norm for i in range(4))
        sin = 2.0 * (w * z + x * y)
        cos = 1.0 - 2.0 * (y * y + z * z)
    return [math.atan2(a, b) for a, b in zip(sin.tolist(), cos.tolist(), strict=True)]


def _box_rows(arrays: ObjectArrays, dtype: np.dtype) -> np.ndarray:
    out = np.zeros(arrays.size, dtype=dtype)
    poses = arrays.poses
    out["x"], out["y"], out["z"] = poses[:, 0], poses[:, 1], poses[:, 2]
    out["yaw"] = _yaws(poses[:, 3:7])
    dims = arrays.dimensions
    out["length"], out["width"], out["height"] = dims[:, 0], dims[:, 1], dims[:, 2]
    out["score"] = arrays.existence
    if arrays.labels.dtype == np.uint8:
        out["label"] = _LABEL_OF_CLASSIFICATION[arrays.labels]
    else:
        out["label"] = [label_of_classification(c) for c in arrays.labels.tolist()]
    return out


def obstacles_from_detected_objects(msg: Message, check: bool = True) -> np.ndarray:
    """A DetectedObjects (object or CDR bytes) as obstacle rows (existence probability as
    the score); unchecked rows without ``check`` (``row_problems`` tells the bad ones)."""
    arrays, _ = _read(DETECTED_OBJECTS, msg)
    rows = _box_rows(arrays, OBSTACLE_DTYPE)
    return _check_boxes(rows, "detected object") if check else rows


def _uuids(objects: Sequence[Any]) -> np.ndarray:
    out = np.zeros((len(objects), UUID_BYTES), dtype=np.uint8)
    for i, obj in enumerate(objects):
        raw = np.asarray(obj.object_id.uuid, dtype=np.uint8).reshape(-1)
        if raw.size != UUID_BYTES:
            raise MessageError(f"object {i}: a UUID has {UUID_BYTES} bytes, got {raw.size}")
        out[i] = raw
    return out


def tracks_from_tracked_objects(msg: Message, check: bool = True) -> TrackStates:
    """A TrackedObjects (object or CDR bytes) as track rows (ids left 0: the UUIDs identify
    them), velocities back in the fixed frame, existence and UUIDs alongside."""
    arrays, _ = _read(TRACKED_OBJECTS, msg)
    table = _box_rows(arrays, TRACK_DTYPE)
    yaw = table["yaw"].astype(np.float64)
    c, s = np.cos(yaw), np.sin(yaw)
    vx, vy = arrays.twists[:, 0], arrays.twists[:, 1]
    table["vx"], table["vy"] = c * vx - s * vy, s * vx + c * vy
    if check:
        _check_boxes(table, "tracked object")
    existence = table["score"].astype(np.float32)
    return TrackStates(table, arrays.uuids.copy(), existence, np.zeros(arrays.size, np.uint32))


@dataclass(frozen=True)
class ReceivedPrediction:
    """One PredictedObject read back: its UUID, and per path the confidence and poses."""

    uuid: bytes
    confidences: np.ndarray
    paths: list[np.ndarray]
    time_steps_s: list[float]


def _paths_of(msg: Any) -> list[list[ReadPath]]:
    out = []
    for obj in msg.objects:
        paths = []
        for p in obj.kinematics.predicted_paths:
            poses = np.zeros((len(p.path), 7))
            for h, q in enumerate(p.path):
                poses[h, :3] = q.position.x, q.position.y, q.position.z
            step = p.time_step.sec + p.time_step.nanosec / NS_PER_S
            paths.append(ReadPath(poses, step, p.confidence))
        out.append(paths)
    return out


def predictions_from_predicted_objects(msg: Message) -> list[ReceivedPrediction]:
    """A PredictedObjects (object or CDR bytes): each object's UUID and paths."""
    arrays, paths = _read(PREDICTED_OBJECTS, msg)
    if paths is None:
        paths = _paths_of(msg)
    return [
        ReceivedPrediction(
            arrays.uuids[i].tobytes(),
            np.asarray([p.confidence for p in read], dtype=np.float64),
            [p.poses[:, :3].copy() for p in read],
            [p.time_step_s for p in read],
        )
        for i, read in enumerate(paths)
    ]
