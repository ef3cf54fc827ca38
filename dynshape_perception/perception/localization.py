"""Where an input lies: its sensor's mount on the vehicle, and the vehicle in the fixed frame.

TF first (static transforms for mounts, dynamic ones for the fixed frame), odometry when no
TF carries the fixed frame, and a standing vehicle when neither exists. The nodes look TF up
in tf2's buffer, in-process replay in ``transforms.TransformTree``: the decisions are these.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dynshape_perception.errors import ConfigError, TransformError
from dynshape_perception.paramspec import MAX_STAMP_TOLERANCE_S, check_fields, derived, param
from dynshape_perception.perception.transforms import Matrix, planar

TF = "tf"
ODOMETRY = "odometry"
STATIC = "static"
MAX_MOUNT_M = 100.0
FRAMES_PREFIX = "frames"


class TransformLookup(Protocol):
    def lookup(self, target: str, source: str, stamp_s: float) -> Matrix:
        """Points of ``source`` into ``target`` at ``stamp_s``; TransformError if unknown."""
        ...

    def connected(self, target: str, source: str) -> bool:
        """Whether any transform links the two frames (at any stamp)."""
        ...

    def latest(self, target: str, source: str) -> tuple[Matrix, float]:
        """The newest transform linking the two frames and its stamp; TransformError if none."""
        ...


# The odometry pose of the vehicle at a stamp and the odometry's frame; None: no pose for
# this stamp (the source counted why); the source is inactive until its first message.
OdometryPose = Callable[[float], tuple[Matrix, str] | None]


# Where the mount parameters apply.
_FALLBACK = "where TF has no transform from the cloud's frame to frames.base_frame"


def _mount_offset(axis: str) -> Any:
    return param(
        0.0,
        f"sensor position along {axis} in frames.base_frame, {_FALLBACK}",
        read_only=True,
        low=-MAX_MOUNT_M,
        high=MAX_MOUNT_M,
        key=f"mount_{axis}_m",
    )


@dataclass(frozen=True)
class Mount:
    """The sensor's pose on the vehicle where TF has none (``frames.mount_*``)."""

    x_m: float = _mount_offset("x")
    y_m: float = _mount_offset("y")
    z_m: float = _mount_offset("z")
    yaw_rad: float = param(
        0.0,
        f"sensor yaw in frames.base_frame, {_FALLBACK}",
        read_only=True,
        low=-math.pi,
        high=math.pi,
        key="mount_yaw_rad",
    )

    def __post_init__(self) -> None:
        check_fields(self)

    def matrix(self) -> Matrix:
        return planar(self.x_m, self.y_m, self.yaw_rad, self.z_m)


@dataclass(frozen=True)
class FrameParams:
    """The vehicle frame, the fixed frame, and the sensor mount to use where TF has none."""

    base_frame: str = param(
        "base_link",
        "vehicle frame: clouds are transformed into it (mount from /tf_static) before "
        "segmentation; region of interest, ego crop and collision corridor lie in it",
        read_only=True,
    )
    fixed_frame: str = param(
        "odom",
        "frame tracks and predictions are kept in: from TF (fixed_frame -> base_frame) at "
        "each input's stamp, else from odometry on 'odom'; without either the vehicle "
        "stands still in the input's frame",
        read_only=True,
    )
    fallback_mount: Mount = derived("frames.mount_* (Mount)", default_factory=Mount)
    # An input stamped after the newest fixed-frame transform (which often follows the
    # scan it belongs to) takes that newest one within this much.
    max_extrapolation_s: float = param(
        0.5,
        "a frame stamped further than this outside the buffered odometry (odometry "
        "stopped or lagging) is dropped as odom_stale instead of using the end pose; "
        "likewise past the newest /tf of the fixed frame (tf_unavailable)",
        low=0.0,
        high=MAX_STAMP_TOLERANCE_S,
        prefix="odometry",
    )

    def __post_init__(self) -> None:
        for name in ("base_frame", "fixed_frame"):
            value = getattr(self, name)
            if not value or value.startswith("/") or value != value.strip():
                raise ConfigError(f"{name} must be a frame name (no leading '/'), got {value!r}")
        if not (math.isfinite(self.max_extrapolation_s) and self.max_extrapolation_s >= 0.0):
            raise ConfigError(
                f"max_extrapolation_s must be finite and >= 0, got {self.max_extrapolation_s!r}"
            )
        if self.base_frame == self.fixed_frame:
            raise ConfigError(f"base_frame and fixed_frame must differ, got {self.base_frame!r}")
        check_fields(self)


@dataclass(frozen=True)
class Located:
    """``to_fixed`` takes the input's frame into ``fixed_frame``; ``vehicle`` is the base
    frame's pose there; ``source`` says where the fixed frame came from."""

    to_fixed: Matrix
    fixed_frame: str
    vehicle: Matrix
    source: str


class Localizer:
    def __init__(
        self,
        tf: TransformLookup,
        params: FrameParams,
        odometry: OdometryPose | None = None,
        odometry_active: Callable[[], bool] = lambda: False,
    ) -> None:
        self.tf = tf
        self.params = params
        self.odometry = odometry
        self.odometry_active = odometry_active
        self.mount_source = ""

    def mount(self, sensor_frame: str, stamp_s: float) -> Matrix:
        """Sensor frame -> base frame: TF, else the fallback mount (``mount_source`` says)."""
        base = self.params.base_frame
        if sensor_frame == base:
            self.mount_source = TF
            return np.eye(4)
        try:
            m = self.tf.lookup(base, sensor_frame, stamp_s)
        except TransformError:
            self.mount_source = "parameters"
            return self.params.fallback_mount.matrix()
        self.mount_source = TF
        return m

    def fixed_source(self) -> str:
        if self.tf.connected(self.params.fixed_frame, self.params.base_frame):
            return TF
        if self.odometry is not None and self.odometry_active():
            return ODOMETRY
        return STATIC

    def locate(self, frame_id: str, stamp_s: float) -> Located | None:
        """Where ``frame_id`` lies in the fixed frame at ``stamp_s``.

        TransformError when TF carries the fixed frame but not at this stamp; None when the
        odometry has no pose for it (it counted why). Without either, the vehicle stands
        still and the input's own frame is the fixed one.
        """
        params = self.params
        source = self.fixed_source()
        if source == TF:
            vehicle = self._vehicle(stamp_s)
            if frame_id == params.base_frame:
                return Located(vehicle, params.fixed_frame, vehicle, TF)
            if frame_id == params.fixed_frame:
                return Located(np.eye(4), params.fixed_frame, vehicle, TF)
            try:
                to_fixed = self.tf.lookup(params.fixed_frame, frame_id, stamp_s)
            except TransformError:
                to_fixed = vehicle @ self.mount(frame_id, stamp_s)
            return Located(to_fixed, params.fixed_frame, vehicle, TF)
        if source == ODOMETRY:
            assert self.odometry is not None
            pose = self.odometry(stamp_s)
            if pose is None:
                return None
            vehicle, fixed = pose
            if frame_id == fixed:
                return Located(np.eye(4), fixed, vehicle, ODOMETRY)
            return Located(vehicle @ self.mount(frame_id, stamp_s), fixed, vehicle, ODOMETRY)
        return Located(np.eye(4), frame_id, np.eye(4), STATIC)

    def _vehicle(self, stamp_s: float) -> Matrix:
        """The base frame in the fixed frame at the stamp, or the newest pose within
        ``max_extrapolation_s`` of it; TransformError otherwise."""
        fixed, base = self.params.fixed_frame, self.params.base_frame
        try:
            return self.tf.lookup(fixed, base, stamp_s)
        except TransformError as err:
            newest, newest_s = self.tf.latest(fixed, base)
            if abs(stamp_s - newest_s) <= self.params.max_extrapolation_s:
                return newest
            raise TransformError(
                f"{err} (the newest, {newest_s:.6f} s, is more than max_extrapolation_s "
                f"{self.params.max_extrapolation_s} s away)"
            ) from err
