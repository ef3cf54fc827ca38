"""A scan in vehicle coordinates: no-return and too-near points out, the mount applied, the
ego vehicle cropped, the region of interest kept."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape_perception.config import Roi
from dynshape_perception.errors import ConfigError
from dynshape_perception.paramspec import MAX_RANGE_M, check_fields, param
from dynshape_perception.perception.transforms import Matrix, transform_points

# Whole scans: 60 m all around the vehicle.
SCAN_PREFIX = "scan"
AXES = ("x", "y", "z")
# A passenger car around base_link (rear axle on the ground), for the ego crop.
EGO_BOX_M = {"x": (-1.0, 4.0), "y": (-1.0, 1.0), "z": (-0.5, 2.0)}
SURROUND_ROI = Roi(x_m=(-60.0, 60.0), y_m=(-60.0, 60.0), z_m=(-3.0, 3.0))
# Relative slack of a float32 squared range (a few ulps of 1.2e-7) beyond which its side of a
# range bound is certain.
_RANGE_SLACK = 1.0e-5
COUNTERS = (
    "points_no_return_removed",
    "points_too_near_removed",
    "points_ego_removed",
    "points_outside_roi",
)


@dataclass(frozen=True)
class Box:
    """An axis-aligned box in the vehicle frame; ``lo < hi`` on every axis."""

    x_m: tuple[float, float]
    y_m: tuple[float, float]
    z_m: tuple[float, float]

    def __post_init__(self) -> None:
        for name in ("x_m", "y_m", "z_m"):
            lo, hi = getattr(self, name)
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ConfigError(f"box {name} must be finite with min < max, got {(lo, hi)}")

    def contains(self, xyz: np.ndarray) -> np.ndarray:
        return self.contains_columns(_columns(xyz))

    def contains_columns(self, columns: Columns) -> np.ndarray:
        """``contains`` of the points whose x, y and z are ``columns``."""
        inside = np.ones(columns[0].shape[0], dtype=bool)
        scratch = np.empty(columns[0].shape[0], dtype=bool)
        for column, (lo, hi) in zip(columns, (self.x_m, self.y_m, self.z_m), strict=True):
            inside &= np.greater_equal(column, lo, out=scratch)
            inside &= np.less_equal(column, hi, out=scratch)
        return inside


Columns = tuple[np.ndarray, np.ndarray, np.ndarray]


def _columns(xyz: np.ndarray) -> Columns:
    """x, y and z each as a contiguous array: comparisons and sums over a strided column of
    a ``[P, 4]`` cloud run several times slower."""
    return (
        np.ascontiguousarray(xyz[:, 0]),
        np.ascontiguousarray(xyz[:, 1]),
        np.ascontiguousarray(xyz[:, 2]),
    )


@dataclass(frozen=True)
class ScanParams:
    """The crop of a scan: ``roi`` and ``ego`` (None: no crop) in the vehicle frame, and the
    smallest range from the sensor that is a return rather than the sensor's own housing."""

    roi: Roi = field(default_factory=lambda: SURROUND_ROI)
    ego: Box | None = None
    min_range_m: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.min_range_m) and self.min_range_m >= 0.0):
            raise ConfigError(f"min_range_m must be finite and >= 0, got {self.min_range_m!r}")


def _roi_end(axis: str, end: int) -> Any:
    word = ("min", "max")[end]
    return param(
        getattr(SURROUND_ROI, f"{axis}_m")[end],
        f"region of interest in frames.base_frame: {word}imum {axis}; points outside are "
        "left out before segmentation (live)",
        low=-MAX_RANGE_M,
        high=MAX_RANGE_M,
    )


def _ego_end(axis: str, end: int) -> Any:
    word = ("min", "max")[end]
    return param(
        EGO_BOX_M[axis][end],
        f"ego crop box in frames.base_frame: {word}imum {axis} (live)",
        low=-MAX_RANGE_M,
        high=MAX_RANGE_M,
    )


@dataclass(frozen=True)
class ScanCrop:
    """The ``scan.*`` parameters, each an end of the region of interest or the ego box, or
    the nearest range: ``params()`` makes them the ScanParams the pipeline takes."""

    roi_x_min_m: float = _roi_end("x", 0)
    roi_x_max_m: float = _roi_end("x", 1)
    roi_y_min_m: float = _roi_end("y", 0)
    roi_y_max_m: float = _roi_end("y", 1)
    roi_z_min_m: float = _roi_end("z", 0)
    roi_z_max_m: float = _roi_end("z", 1)
    crop_ego: bool = param(
        False, "leave out the points inside the ego crop box (the vehicle's own body)"
    )
    ego_x_min_m: float = _ego_end("x", 0)
    ego_x_max_m: float = _ego_end("x", 1)
    ego_y_min_m: float = _ego_end("y", 0)
    ego_y_max_m: float = _ego_end("y", 1)
    ego_z_min_m: float = _ego_end("z", 0)
    ego_z_max_m: float = _ego_end("z", 1)
    min_range_m: float = param(
        0.5,
        "points nearer the sensor than this are left out (housing, rain, dust); points "
        "at exactly (0, 0, 0) are no-returns and always left out",
        low=0.0,
        high=MAX_RANGE_M,
    )

    def __post_init__(self) -> None:
        check_fields(self)

    def _interval(self, box: str, axis: str) -> tuple[float, float]:
        return getattr(self, f"{box}_{axis}_min_m"), getattr(self, f"{box}_{axis}_max_m")

    def params(self) -> ScanParams:
        """The crop; ConfigError where an end passes the other."""
        roi = Roi(*(self._interval("roi", axis) for axis in AXES))
        ego = Box(*(self._interval("ego", axis) for axis in AXES))
        return ScanParams(roi, ego if self.crop_ego else None, self.min_range_m)


@dataclass(frozen=True)
class Scan:
    """Points ``[P, 4]`` float32 in the vehicle frame, and how many each step removed."""

    points: np.ndarray
    removed: dict[str, int]


def _nearer_than(xyz: np.ndarray, range_m: float, columns: Columns | None = None) -> np.ndarray:
    """Points within ``range_m`` of the origin, decided as in float64 at float32's cost.

    Squared ranges in float32 can fall on the wrong side of the bound only within a few
    ulps of it; those few are measured again in float64.
    """
    bound = range_m**2
    x, y, z = columns if columns is not None else _columns(xyz)
    approx = x * x
    approx += y * y
    approx += z * z
    near: np.ndarray = approx < bound
    approx -= bound
    np.abs(approx, out=approx)
    close = np.flatnonzero(approx <= _RANGE_SLACK * bound)
    if close.size:
        exact = np.einsum("ij,ij->i", xyz[close], xyz[close], dtype=np.float64)
        near[close] = exact < bound
    return near


def _rows(points: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``points[mask]``: np.take gathers the rows of a ``[P, 4]`` cloud several times faster."""
    return np.take(points, np.flatnonzero(mask), axis=0)


def prepare_scan(points: np.ndarray, mount: Matrix, params: ScanParams) -> Scan:
    """From the sensor frame (``mount``: sensor to vehicle) to the cropped vehicle-frame scan.

    A no-return is a point at exactly (0, 0, 0), where organised clouds (Ouster, Hesai) keep
    the place of a beam that saw nothing; the minimum range is measured from the sensor.
    """
    xyz = points[:, :3]
    columns = _columns(xyz)
    x, y, z = columns
    no_return = x == 0.0
    no_return &= y == 0.0
    no_return &= z == 0.0
    keep = ~no_return
    too_near = np.zeros_like(keep)
    if params.min_range_m > 0.0:
        too_near = keep & _nearer_than(xyz, params.min_range_m, columns)
        keep &= ~too_near
    every = bool(keep.all())
    moved = transform_points(mount, points if every else _rows(points, keep))
    if moved.shape[0] and np.array_equal(mount, np.eye(4)):
        # Unmoved: the columns already taken, less the points left out.
        moved_columns = columns if every else (x[keep], y[keep], z[keep])
    else:
        moved_columns = _columns(moved)
    ego = np.zeros(moved.shape[0], dtype=bool)
    if params.ego is not None:
        ego = params.ego.contains_columns(moved_columns)
    roi = params.roi
    inside = Box(roi.x_m, roi.y_m, roi.z_m).contains_columns(moved_columns)
    if params.ego is not None:
        inside &= ~ego
    kept = moved if inside.all() else _rows(moved, inside)
    egos = int(np.count_nonzero(ego))
    return Scan(
        np.ascontiguousarray(kept, dtype=np.float32),
        {
            "points_no_return_removed": int(np.count_nonzero(no_return)),
            "points_too_near_removed": int(np.count_nonzero(too_near)),
            "points_ego_removed": egos,
            "points_outside_roi": inside.size - int(np.count_nonzero(inside)) - egos,
        },
    )
