"""The odometry pose at any stamp: a bounded buffer, interpolated, with the lidar mount applied."""

from __future__ import annotations

import bisect
import math
from collections import deque
from operator import itemgetter

from dynshape_perception.perception.pipeline import Pose2D

_stamp = itemgetter(0)


def wrap_angle(rad: float) -> float:
    return math.atan2(math.sin(rad), math.cos(rad))


class PoseBuffer:
    """Poses of the odometry child frame in the odometry frame, oldest first, stamps increasing."""

    def __init__(self, capacity: int, mount: Pose2D | None = None) -> None:
        self._poses: deque[tuple[float, float, float, float]] = deque(maxlen=max(2, capacity))
        self.mount = mount or Pose2D()

    def __len__(self) -> int:
        return len(self._poses)

    @property
    def newest_stamp_s(self) -> float | None:
        return self._poses[-1][0] if self._poses else None

    def clear(self) -> None:
        self._poses.clear()

    def gap_s(self, stamp_s: float) -> float:
        """How far ``stamp_s`` lies outside the buffered span (0 inside; inf when empty)."""
        if not self._poses:
            return math.inf
        return max(self._poses[0][0] - stamp_s, stamp_s - self._poses[-1][0], 0.0)

    def add(self, stamp_s: float, x: float, y: float, yaw: float) -> bool:
        """Append a pose; False (and nothing kept) unless its stamp is after the newest one."""
        newest = self.newest_stamp_s
        if newest is not None and not stamp_s > newest:
            return False
        self._poses.append((stamp_s, x, y, yaw))
        return True

    def base_pose_at(self, stamp_s: float) -> Pose2D | None:
        """Linear interpolation between the neighbouring poses; the end pose outside the span."""
        poses = self._poses
        if not poses:
            return None
        # Stamps increase: a binary search over the deque, not an array of all of it per call.
        i = bisect.bisect_left(poses, stamp_s, key=_stamp)
        if i == 0 or i == len(poses):
            _, x, y, yaw = poses[0 if i == 0 else -1]
            return Pose2D(float(x), float(y), float(yaw))
        (t0, x0, y0, a0), (t1, x1, y1, a1) = poses[i - 1], poses[i]
        w = (stamp_s - t0) / (t1 - t0)
        return Pose2D(
            float(x0 + w * (x1 - x0)),
            float(y0 + w * (y1 - y0)),
            wrap_angle(float(a0 + w * wrap_angle(float(a1 - a0)))),
        )

    def pose_at(self, stamp_s: float) -> Pose2D | None:
        """The lidar's pose in the odometry frame at ``stamp_s``; None before any odometry."""
        base = self.base_pose_at(stamp_s)
        if base is None:
            return None
        c, s = math.cos(base.yaw), math.sin(base.yaw)
        x = base.x + c * self.mount.x - s * self.mount.y
        y = base.y + s * self.mount.x + c * self.mount.y
        return Pose2D(x, y, wrap_angle(base.yaw + self.mount.yaw))


def yaw_from_quaternion(x: float, y: float, z: float, w: float) -> float:
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))
