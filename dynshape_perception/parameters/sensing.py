"""Parameter groups of the inputs: points, frames, mount, crop, odometry, stamps."""

from __future__ import annotations

import math

from dynshape_perception.parameters.limits import (
    AXES,
    EGO_BOX_M,
    FRAMES,
    MAX_INTENSITY_SCALE,
    MAX_MOUNT_M,
    MAX_SECTORS,
    MIN_INTENSITY_SCALE,
)
from dynshape_perception.paramspec import (
    MAX_COUNT,
    MAX_RANGE_M,
    MAX_STAMP_TOLERANCE_S,
    OFF,
    ParamSpec,
    declared,
)
from dynshape_perception.perception.pipeline import PipelineParams
from dynshape_perception.perception.scan import SURROUND_ROI
from dynshape_perception.perception.stamps import StampPolicy


def points_group() -> tuple[ParamSpec, ...]:
    return (
        *declared(PipelineParams, "points"),
        ParamSpec(
            "points.intensity_scale",
            1.0,
            "factor applied to the cloud's intensity field: the segmenter expects [0, 1] "
            "(1/255 for 8-bit drivers such as Velodyne, 1/65535 for 16-bit ones such as "
            "Ouster); clouds outside [0, 1] after it are clipped and counted",
            low=MIN_INTENSITY_SCALE,
            high=MAX_INTENSITY_SCALE,
        ),
        ParamSpec(
            "points.sectors_per_revolution",
            1,
            "clouds per sensor revolution: 1 whole scans; N > 1 sector clouds (tier 1 runs "
            "per sector, the full cloud once per revolution); 0 detect from azimuth coverage",
            read_only=True,
            low=OFF,
            high=MAX_SECTORS,
        ),
    )


def odometry_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "odometry.buffer_size",
            200,
            "odometry messages kept for interpolating the pose at a cloud's stamp",
            read_only=True,
            low=2,
            high=MAX_COUNT,
        ),
        ParamSpec(
            "odometry.max_extrapolation_s",
            0.5,
            "a frame stamped further than this outside the buffered odometry (odometry "
            "stopped or lagging) is dropped as odom_stale instead of using the end pose; "
            "likewise past the newest /tf of the fixed frame (tf_unavailable)",
            low=0.0,
            high=MAX_STAMP_TOLERANCE_S,
        ),
    )


def stamps_group() -> tuple[ParamSpec, ...]:
    return declared(StampPolicy, "stamps")


def base_frame_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "frames.base_frame",
            FRAMES.base_frame,
            "vehicle frame: clouds are transformed into it (mount from /tf_static) before "
            "segmentation; region of interest, ego crop and collision corridor lie in it",
            read_only=True,
        ),
    )


def mount_group() -> tuple[ParamSpec, ...]:
    fallback = "where TF has no transform from the cloud's frame to frames.base_frame"
    return (
        *(
            ParamSpec(
                f"frames.mount_{axis}_m",
                0.0,
                f"sensor position along {axis} in frames.base_frame, {fallback}",
                read_only=True,
                low=-MAX_MOUNT_M,
                high=MAX_MOUNT_M,
            )
            for axis in AXES
        ),
        ParamSpec(
            "frames.mount_yaw_rad",
            0.0,
            f"sensor yaw in frames.base_frame, {fallback}",
            read_only=True,
            low=-math.pi,
            high=math.pi,
        ),
    )


def fixed_frame_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "frames.fixed_frame",
            FRAMES.fixed_frame,
            "frame tracks and predictions are kept in: from TF (fixed_frame -> base_frame) at "
            "each input's stamp, else from odometry on 'odom'; without either the vehicle "
            "stands still in the input's frame",
            read_only=True,
        ),
    )


def scan_group() -> tuple[ParamSpec, ...]:
    roi = tuple(
        ParamSpec(
            f"scan.roi_{axis}_{end}_m",
            getattr(SURROUND_ROI, f"{axis}_m")[i],
            f"region of interest in frames.base_frame: {end}imum {axis}; points outside are "
            "left out before segmentation (live)",
            low=-MAX_RANGE_M,
            high=MAX_RANGE_M,
        )
        for axis in AXES
        for i, end in enumerate(("min", "max"))
    )
    ego = tuple(
        ParamSpec(
            f"scan.ego_{axis}_{end}_m",
            EGO_BOX_M[axis][i],
            f"ego crop box in frames.base_frame: {end}imum {axis} (live)",
            low=-MAX_RANGE_M,
            high=MAX_RANGE_M,
        )
        for axis in AXES
        for i, end in enumerate(("min", "max"))
    )
    return (
        *roi,
        ParamSpec(
            "scan.crop_ego",
            False,
            "leave out the points inside the ego crop box (the vehicle's own body)",
        ),
        *ego,
        ParamSpec(
            "scan.min_range_m",
            0.5,
            "points nearer the sensor than this are left out (housing, rain, dust); points "
            "at exactly (0, 0, 0) are no-returns and always left out",
            low=0.0,
            high=MAX_RANGE_M,
        ),
    )
