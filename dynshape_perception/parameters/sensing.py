"""Parameter groups of the inputs: points, frames, mount, crop, odometry, stamps."""

from __future__ import annotations

from dynshape_perception.parameters.limits import (
    MAX_INTENSITY_SCALE,
    MAX_SECTORS,
    MIN_INTENSITY_SCALE,
)
from dynshape_perception.paramspec import (
    MAX_COUNT,
    OFF,
    ParamSpec,
    declared,
)
from dynshape_perception.perception.localization import FRAMES_PREFIX, FrameParams, Mount
from dynshape_perception.perception.pipeline import PipelineParams
from dynshape_perception.perception.scan import SCAN_PREFIX, ScanCrop
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
    return declared(ScanCrop, SCAN_PREFIX)
