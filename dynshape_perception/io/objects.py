"""Standard object messages <-> the tables, without ROS: autoware_perception_msgs out,
vision_msgs and autoware_perception_msgs in. A factory (rclpy classes in the nodes, the
rosbags typestore in bags) makes the messages; reading is duck-typed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dynshape_perception.errors import MessageError, TransformError
from dynshape_perception.io.classes import (
    classification_of,
    label_of_class_id,
    label_of_classification,
)
from dynshape_perception.io.tables import OBSTACLE_DTYPE, TRACK_DTYPE, check_box_sizes
from dynshape_perception.perception.objects import (
    UUID_BYTES,
    ObjectParams,
    pose_covariance,
    twist_covariance,
)
from dynshape_perception.perception.prediction import PredictedPaths
from dynshape_perception.perception.transforms import normalised_quaternion

DETECTED_OBJECTS = "autoware_perception_msgs/msg/DetectedObjects"
TRACKED_OBJECTS = "autoware_perception_msgs/msg/TrackedObjects"
PREDICTED_OBJECTS = "autoware_perception_msgs/msg/PredictedObjects"
DETECTION3D_ARRAY = "vision_msgs/msg/Detection3DArray"
OBJECT_TYPES = (DETECTED_OBJECTS, TRACKED_OBJECTS, PREDICTED_OBJECTS)
_APM = "autoware_perception_msgs/msg/"
_GM = "geometry_msgs/msg/"
# Shape.BOUNDING_BOX; *Kinematics.SIGN_UNKNOWN: a box's heading is known modulo pi only.
BOUNDING_BOX = 0
SIGN_UNKNOWN = 1
NS_PER_S = 1_000_000_000


class MessageFactory(Protocol):
    """Makes a message of type ``pkg/msg/Name`` from all of its fields."""

    def __call__(self, msgtype: str, /, **fields: Any) -> Any: ...


def yaw_of_quaternion(q: Any) -> float:
    """The heading of a message quaternion, normalised first; MessageError if degenerate."""
    try:
        x, y, z, w = normalised_quaternion(q.x, q.y, q.z, q.w)
    except TransformError as err:
        raise MessageError(str(err)) from err
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


class _Build:
    """The submessages every object message shares, from one factory."""

    def __init__(self, make: MessageFactory) -> None:
        self.make = make
        zeros = np.zeros(36)
        vector = make(_GM + "Vector3", x=0.0, y=0.0, z=0.0)
        self.no_accel = make(
            _GM + "AccelWithCovariance",
            accel=make(_GM + "Accel", linear=vector, angular=vector),
            covariance=zeros,
        )
        self.no_twist = make(
            _GM + "TwistWithCovariance",
            twist=make(_GM + "Twist", linear=vector, angular=vector),
            covariance=zeros,
        )
        self.no_footprint = make(_GM + "Polygon", points=[])

    def time(self, ns: int) -> Any:
        sec, nanosec = divmod(int(ns), NS_PER_S)
        return self.make("builtin_interfaces/msg/Time", sec=sec, nanosec=nanosec)

    def duration(self, seconds: float) -> Any:
        sec, nanosec = divmod(round(seconds * NS_PER_S), NS_PER_S)
        return self.make("builtin_interfaces/msg/Duration", sec=sec, nanosec=nanosec)

    def header(self, stamp_ns: int, frame_id: str) -> Any:
        return self.make("std_msgs/msg/Header", stamp=self.time(stamp_ns), frame_id=frame_id)

    def pose(self, x: float, y: float, z: float, yaw: float) -> Any:
        return self.make(
            _GM + "Pose",
            position=self.make(_GM + "Point", x=x, y=y, z=z),
            orientation=self.make(
                _GM + "Quaternion", x=0.0, y=0.0, z=math.sin(yaw / 2.0), w=math.cos(yaw / 2.0)
            ),
        )

    def pose_cov(self, pose: Any, covariance: np.ndarray) -> Any:
        return self.make(_GM + "PoseWithCovariance", pose=pose, covariance=covariance)

    def twist_cov(self, vx: float, vy: float, covariance: np.ndarray) -> Any:
        linear = self.make(_GM + "Vector3", x=vx, y=vy, z=0.0)
        angular = self.make(_GM + "Vector3", x=0.0, y=0.0, z=0.0)
        twist = self.make(_GM + "Twist", linear=linear, angular=angular)
        return self.make(_GM + "TwistWithCovariance", twist=twist, covariance=covariance)

    def classification(self, label: int) -> list[Any]:
        return [self.make(_APM + "ObjectClassification", label=label, probability=1.0)]

    def shape(self, length: float, width: float, height: float) -> Any:
        return self.make(
            _APM + "Shape",
            type=BOUNDING_BOX,
            footprint=self.no_footprint,
            dimensions=self.make(_GM + "Vector3", x=length, y=width, z=height),
        )


def _rows(table: np.ndarray) -> list[dict[str, Any]]:
    names = table.dtype.names or ()
    columns = {n: table[n].tolist() for n in names}
    return [{n: columns[n][i] for n in names} for i in range(table.shape[0])]


def detected_objects(
    make: MessageFactory, stamp_ns: int, frame_id: str, obstacles: np.ndarray
) -> Any:
    """A DetectedObjects of obstacle rows: boxes with their class, existence = the score."""
    build = _Build(make)
    classes = classification_of(obstacles["label"]).tolist()
    no_cov = np.zeros(36)
    objects = []
    for row, label in zip(_rows(obstacles), classes, strict=True):
        kinematics = make(
            _APM + "DetectedObjectKinematics",
            pose_with_covariance=build.pose_cov(
                build.pose(row["x"], row["y"], row["z"], row["yaw"]), no_cov
            ),
            has_position_covariance=False,
            orientation_availability=SIGN_UNKNOWN,
            twist_with_covariance=build.no_twist,
            has_twist=False,
            has_twist_covariance=False,
        )
        objects.append(
            make(
                _APM + "DetectedObject",
                existence_probability=float(np.clip(row["score"], 0.0, 1.0)),
                classification=build.classification(label),
                kinematics=kinematics,
                shape=build.shape(row["length"], row["width"], row["height"]),
            )
        )
    return make(DETECTED_OBJECTS, header=build.header(stamp_ns, frame_id), objects=objects)


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


def _object_frame_velocity(vx: float, vy: float, yaw: float) -> tuple[float, float]:
    """A fixed-frame velocity in the object's frame (x along its heading), as autoware's
    object kinematics carry the twist."""
    c, s = math.cos(yaw), math.sin(yaw)
    return c * vx + s * vy, -s * vx + c * vy


def _tracked_parts(
    build: _Build, states: TrackStates, params: ObjectParams
) -> list[tuple[Any, Any, Any, Any, Any, bool]]:
    """(uuid, classification, pose with covariance, twist with covariance, shape, stationary)."""
    tracks = states.tracks
    pose_cov = pose_covariance(states.missed, params)
    twist_cov = twist_covariance(states.missed, params)
    classes = classification_of(tracks["label"]).tolist()
    out = []
    for i, row in enumerate(_rows(tracks)):
        vx, vy = _object_frame_velocity(row["vx"], row["vy"], row["yaw"])
        out.append(
            (
                build.make("unique_identifier_msgs/msg/UUID", uuid=states.uuids[i].copy()),
                build.classification(classes[i]),
                build.pose_cov(build.pose(row["x"], row["y"], row["z"], row["yaw"]), pose_cov[i]),
                build.twist_cov(vx, vy, twist_cov[i]),
                build.shape(row["length"], row["width"], row["height"]),
                math.hypot(row["vx"], row["vy"]) < params.stationary_speed_mps,
            )
        )
    return out


def tracked_objects(
    make: MessageFactory,
    stamp_ns: int,
    frame_id: str,
    states: TrackStates,
    params: ObjectParams,
) -> Any:
    """A TrackedObjects: each track with its UUID, velocity, covariances and existence."""
    build = _Build(make)
    objects = []
    parts = _tracked_parts(build, states, params)
    for (uuid, classes, pose, twist, shape, stationary), existence in zip(
        parts, states.existence.tolist(), strict=True
    ):
        kinematics = make(
            _APM + "TrackedObjectKinematics",
            pose_with_covariance=pose,
            twist_with_covariance=twist,
            acceleration_with_covariance=build.no_accel,
            orientation_availability=SIGN_UNKNOWN,
            is_stationary=stationary,
        )
        objects.append(
            make(
                _APM + "TrackedObject",
                object_id=uuid,
                existence_probability=existence,
                classification=classes,
                kinematics=kinematics,
                shape=shape,
            )
        )
    return make(TRACKED_OBJECTS, header=build.header(stamp_ns, frame_id), objects=objects)


def _path_poses(
    build: _Build, xy: np.ndarray, start: tuple[float, float, float], z: float
) -> list[Any]:
    """Poses along ``xy [H, 2]`` at height ``z``, each heading along its step."""
    x0, y0, yaw = start
    poses = []
    for x, y in xy.tolist():
        if math.hypot(x - x0, y - y0) > 1e-6:
            yaw = math.atan2(y - y0, x - x0)
        poses.append(build.pose(x, y, z, yaw))
        x0, y0 = x, y
    return poses


def predicted_objects(
    make: MessageFactory,
    stamp_ns: int,
    frame_id: str,
    states: TrackStates,
    paths: PredictedPaths,
    params: ObjectParams,
) -> Any:
    """A PredictedObjects: every track, with the K hypotheses of the predicted ones as
    ``predicted_paths`` (confidence each, ``time_step`` the predictor's step, poses in the
    fixed frame at the track's height); tracks too new to predict have no path yet."""
    build = _Build(make)
    time_step = build.duration(paths.step_s)
    by_id = {int(a): i for i, a in enumerate(paths.ids.tolist())}
    objects = []
    parts = _tracked_parts(build, states, params)
    rows = _rows(states.tracks)
    for part, row, existence in zip(parts, rows, states.existence.tolist(), strict=True):
        uuid, classes, pose, twist, shape, _ = part
        agent = by_id.get(int(row["id"]))
        predicted = []
        if agent is not None:
            start = (row["x"], row["y"], row["yaw"])
            for k, confidence in enumerate(paths.confidences[agent].tolist()):
                predicted.append(
                    make(
                        _APM + "PredictedPath",
                        path=_path_poses(build, paths.paths[agent, k], start, row["z"]),
                        time_step=time_step,
                        confidence=confidence,
                    )
                )
        kinematics = make(
            _APM + "PredictedObjectKinematics",
            initial_pose_with_covariance=pose,
            initial_twist_with_covariance=twist,
            initial_acceleration_with_covariance=build.no_accel,
            predicted_paths=predicted,
        )
        objects.append(
            make(
                _APM + "PredictedObject",
                object_id=uuid,
                existence_probability=existence,
                classification=classes,
                kinematics=kinematics,
                shape=shape,
            )
        )
    return make(PREDICTED_OBJECTS, header=build.header(stamp_ns, frame_id), objects=objects)


# -- reading --------------------------------------------------------------------------------
def _check_boxes(table: np.ndarray, what: str) -> np.ndarray:
    """NaN or Inf: a MessageError; a box of no size: a CloudError (``bad_box_size``)."""
    floats = [n for n in table.dtype.names or () if table.dtype[n].kind == "f"]
    if table.size and not all(np.isfinite(table[n]).all() for n in floats):
        raise MessageError(f"a {what} holds NaN or Inf")
    return check_box_sizes(table, what)


def _best_label(classification: Sequence[Any]) -> int:
    if not classification:
        return 0
    best = max(classification, key=lambda c: c.probability)
    return label_of_classification(best.label)


def detections_to_obstacles(msg: Any) -> np.ndarray:
    """A vision_msgs/Detection3DArray as obstacle rows; score and class from the best
    hypothesis (class ids through the one class map of ``perception.classes``)."""
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
            out[i]["label"] = label_of_class_id(str(best.hypothesis.class_id))
    return _check_boxes(out, "detection")


def _box_rows(objects: Sequence[Any], dtype: np.dtype, pose_of: str) -> np.ndarray:
    out = np.zeros(len(objects), dtype=dtype)
    for i, obj in enumerate(objects):
        pose = getattr(obj.kinematics, pose_of).pose
        dims = obj.shape.dimensions
        out[i]["x"], out[i]["y"], out[i]["z"] = pose.position.x, pose.position.y, pose.position.z
        out[i]["yaw"] = yaw_of_quaternion(pose.orientation)
        out[i]["length"], out[i]["width"], out[i]["height"] = dims.x, dims.y, dims.z
        out[i]["score"] = obj.existence_probability
        out[i]["label"] = _best_label(obj.classification)
    return out


def obstacles_from_detected_objects(msg: Any) -> np.ndarray:
    """A DetectedObjects as obstacle rows (existence probability as the score)."""
    return _check_boxes(
        _box_rows(msg.objects, OBSTACLE_DTYPE, "pose_with_covariance"), "detected object"
    )


def _uuids(objects: Sequence[Any]) -> np.ndarray:
    out = np.zeros((len(objects), UUID_BYTES), dtype=np.uint8)
    for i, obj in enumerate(objects):
        raw = np.asarray(obj.object_id.uuid, dtype=np.uint8).reshape(-1)
        if raw.size != UUID_BYTES:
            raise MessageError(f"object {i}: a UUID has {UUID_BYTES} bytes, got {raw.size}")
        out[i] = raw
    return out


def tracks_from_tracked_objects(msg: Any) -> TrackStates:
    """A TrackedObjects as track rows (ids left 0: the UUIDs identify them), velocities back
    in the fixed frame, existence and UUIDs alongside."""
    objects = list(msg.objects)
    table = _box_rows(objects, TRACK_DTYPE, "pose_with_covariance")
    for i, obj in enumerate(objects):
        linear = obj.kinematics.twist_with_covariance.twist.linear
        yaw = float(table[i]["yaw"])
        c, s = math.cos(yaw), math.sin(yaw)
        table[i]["vx"], table[i]["vy"] = c * linear.x - s * linear.y, s * linear.x + c * linear.y
    _check_boxes(table, "tracked object")
    existence = table["score"].astype(np.float32)
    return TrackStates(table, _uuids(objects), existence, np.zeros(len(objects), np.uint32))


@dataclass(frozen=True)
class ReceivedPrediction:
    """One PredictedObject read back: its UUID, and per path the confidence and poses."""

    uuid: bytes
    confidences: np.ndarray
    paths: list[np.ndarray]
    time_steps_s: list[float]


def predictions_from_predicted_objects(msg: Any) -> list[ReceivedPrediction]:
    out = []
    for obj in msg.objects:
        paths = obj.kinematics.predicted_paths
        out.append(
            ReceivedPrediction(
                bytes(np.asarray(obj.object_id.uuid, dtype=np.uint8)),
                np.asarray([p.confidence for p in paths], dtype=np.float64),
                [
                    np.asarray(
                        [(q.position.x, q.position.y, q.position.z) for q in p.path],
                        dtype=np.float64,
                    ).reshape(-1, 3)
                    for p in paths
                ],
                [p.time_step.sec + p.time_step.nanosec / NS_PER_S for p in paths],
            )
        )
    return out
