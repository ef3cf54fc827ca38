"""Object messages built field by field as message objects: the reference the CDR writer matches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dynshape_perception.io.cdr import (
    BOUNDING_BOX,
    CLASS_PROBABILITY,
    DETECTED_OBJECTS,
    SIGN_UNKNOWN,
    TRACKED_OBJECTS,
    ObjectArrays,
)

MessageFactory = Callable[..., Any]
_APM = "autoware_perception_msgs/msg/"
_GM = "geometry_msgs/msg/"


class _Build:
    def __init__(self, make: MessageFactory) -> None:
        self.make = make

    def pose(self, v: list[float]) -> Any:
        make = self.make
        return make(
            _GM + "Pose",
            position=make(_GM + "Point", x=v[0], y=v[1], z=v[2]),
            orientation=make(_GM + "Quaternion", x=v[3], y=v[4], z=v[5], w=v[6]),
        )

    def vector(self, v: list[float]) -> Any:
        return self.make(_GM + "Vector3", x=v[0], y=v[1], z=v[2])

    def twist(self, v: list[float], covariance: np.ndarray) -> Any:
        twist = self.make(_GM + "Twist", linear=self.vector(v[:3]), angular=self.vector(v[3:]))
        return self.make(_GM + "TwistWithCovariance", twist=twist, covariance=covariance)

    def accel(self) -> Any:
        zero = self.vector([0.0, 0.0, 0.0])
        accel = self.make(_GM + "Accel", linear=zero, angular=zero)
        return self.make(_GM + "AccelWithCovariance", accel=accel, covariance=np.zeros(36))

    def shape(self, dims: list[float]) -> Any:
        return self.make(
            _APM + "Shape",
            type=BOUNDING_BOX,
            footprint=self.make(_GM + "Polygon", points=[]),
            dimensions=self.vector(dims),
        )


def reference_message(make: MessageFactory, msgtype: str, arrays: ObjectArrays) -> Any:
    """The message of ``arrays`` built through ``make`` (rclpy classes or the rosbags
    typestore), one message object per field."""
    b = _Build(make)
    sec, nanosec, frame_id = arrays.header
    header = make(
        "std_msgs/msg/Header",
        stamp=make("builtin_interfaces/msg/Time", sec=sec, nanosec=nanosec),
        frame_id=frame_id,
    )
    kind = msgtype.rsplit("/", 1)[-1].removesuffix("Objects")
    paths = {int(r): p for p, r in enumerate(arrays.path_rows.tolist())}
    objects = []
    for i in range(arrays.size):
        pose = make(
            _GM + "PoseWithCovariance",
            pose=b.pose(arrays.poses[i].tolist()),
            covariance=arrays.pose_covariances[i],
        )
        twist = b.twist(arrays.twists[i].tolist(), arrays.twist_covariances[i])
        fields: dict[str, Any] = {
            "existence_probability": float(arrays.existence[i]),
            "classification": [
                make(
                    _APM + "ObjectClassification",
                    label=int(arrays.labels[i]),
                    probability=CLASS_PROBABILITY,
                )
            ],
            "shape": b.shape(arrays.dimensions[i].tolist()),
        }
        if msgtype == DETECTED_OBJECTS:
            fields["kinematics"] = make(
                _APM + "DetectedObjectKinematics",
                pose_with_covariance=pose,
                has_position_covariance=False,
                orientation_availability=SIGN_UNKNOWN,
                twist_with_covariance=twist,
                has_twist=False,
                has_twist_covariance=False,
            )
        else:
            fields["object_id"] = make(
                "unique_identifier_msgs/msg/UUID", uuid=arrays.uuids[i].copy()
            )
        if msgtype == TRACKED_OBJECTS:
            fields["kinematics"] = make(
                _APM + "TrackedObjectKinematics",
                pose_with_covariance=pose,
                twist_with_covariance=twist,
                acceleration_with_covariance=b.accel(),
                orientation_availability=SIGN_UNKNOWN,
                is_stationary=bool(arrays.stationary[i]),
            )
        elif msgtype != DETECTED_OBJECTS:
            predicted = []
            if i in paths:
                p = paths[i]
                for k, confidence in enumerate(arrays.path_confidences[p].tolist()):
                    predicted.append(
                        make(
                            _APM + "PredictedPath",
                            path=[b.pose(v) for v in arrays.path_poses[p, k].tolist()],
                            time_step=make(
                                "builtin_interfaces/msg/Duration",
                                sec=arrays.time_step[0],
                                nanosec=arrays.time_step[1],
                            ),
                            confidence=confidence,
                        )
                    )
            fields["kinematics"] = make(
                _APM + "PredictedObjectKinematics",
                initial_pose_with_covariance=pose,
                initial_twist_with_covariance=twist,
                initial_acceleration_with_covariance=b.accel(),
                predicted_paths=predicted,
            )
        objects.append(make(f"{_APM}{kind}Object", **fields))
    return make(msgtype, header=header, objects=objects)
