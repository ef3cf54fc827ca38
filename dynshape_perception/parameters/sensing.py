"""Parameter groups of the inputs: points, frames, mount, crop, odometry, stamps."""

from __future__ import annotations

from dynshape_perception.parameters.limits import (
    AXES,
    EGO_BOX_M,
    MAX_INTENSITY_SCALE,
    MAX_SECTORS,
    MIN_INTENSITY_SCALE,
)
from dynshape_perception.paramspec import (
    MAX_COUNT,
    MAX_RANGE_M,
    OFF,
    ParamSpec,
    declared,
)
from dynshape_perception.perception.localization import FRAMES_PREFIX, FrameParams, Mount
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
        *declared(FrameParams, FRAMES_PREFIX, fields=("max_extrapolation_s",)),
    )


def stamps_group() -> tuple[ParamSpec, ...]:
    return declared(StampPolicy, "stamps")


def base_frame_group() -> tuple[ParamSpec, ...]:
    return declared(FrameParams, FRAMES_PREFIX, fields=("base_frame",))


def mount_group() -> tuple[ParamSpec, ...]:
    return declared(Mount, FRAMES_PREFIX)


def fixed_frame_group() -> tuple[ParamSpec, ...]:
    return declared(FrameParams, FRAMES_PREFIX, fields=("fixed_frame",))


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
