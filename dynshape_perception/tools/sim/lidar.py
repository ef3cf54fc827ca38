"""The simulated lidar: a spinning 64-beam sensor ray-cast into boxes over a ground plane."""

from __future__ import annotations

import math

import numpy as np

from dynshape_perception.perception.ground import DEFAULT_SENSOR_HEIGHT_M
from dynshape_perception.perception.records import LABEL_CAR, LABEL_PEDESTRIAN, LABEL_POLE

# Mounted as the ground fit's default assumes (KITTI's sensor height).
SENSOR_HEIGHT_M = DEFAULT_SENSOR_HEIGHT_M
# HDL-64E beam layout: an upper block of 32 beams from +2 to -8.33 deg, a lower block of 32
# from -8.83 to -24.33 deg.
UPPER_BLOCK_DEG = (2.0, -8.33)
LOWER_BLOCK_DEG = (-8.83, -24.33)
BEAMS_PER_BLOCK = 32

# Reflectance ranges of the surfaces, in [0, 1].
ASPHALT_INTENSITY = (0.05, 0.3)
MARKING_INTENSITY = (0.6, 0.9)
CAR_INTENSITY = (0.05, 0.5)
POLE_INTENSITY = (0.3, 0.7)
PEDESTRIAN_INTENSITY = (0.1, 0.4)
INTENSITY_NOISE = 0.03
LANE_MARKING_WIDTH_M = 0.15
# Returns duplicated to reach a point count move this much, so that no two coincide.
UPSAMPLE_JITTER_M = 0.01
# Index -1 (ground) picks this appended entry, which matches no object label.
LABEL_UNKNOWN_SURFACE = np.iinfo(np.uint32).max


def beam_elevations_rad() -> np.ndarray:
    """The 64 beam elevations of an HDL-64E-like sensor, radians, top beam first."""
    return np.deg2rad(
        np.r_[
            np.linspace(*UPPER_BLOCK_DEG, BEAMS_PER_BLOCK),
            np.linspace(*LOWER_BLOCK_DEG, BEAMS_PER_BLOCK),
        ]
    )


def ray_directions(fov_deg: float, azimuth_step_deg: float) -> tuple[np.ndarray, np.ndarray]:
    """Unit directions ``[R, 3]`` and azimuths ``[R]``, column by column as the sensor fires:
    clockwise from the left edge of the field of view, as a Velodyne spins."""
    half = math.radians(fov_deg) / 2.0
    step = math.radians(azimuth_step_deg)
    azimuth = half - step * np.arange(math.floor(2.0 * half / step))
    elevation = beam_elevations_rad()
    az, el = np.meshgrid(azimuth, elevation, indexing="ij")
    az, el = az.ravel(), el.ravel()
    dirs = np.c_[np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)]
    return dirs, az


def ray_box_distance(
    dirs: np.ndarray, centre: np.ndarray, half_size: np.ndarray, yaw: float
) -> np.ndarray:
    """Range along each ray from the origin to an oriented box, inf where it misses."""
    cos, sin = math.cos(yaw), math.sin(yaw)
    to_box_frame = np.array([[cos, sin, 0.0], [-sin, cos, 0.0], [0.0, 0.0, 1.0]])
    origin = to_box_frame @ -centre
    local = dirs @ to_box_frame.T
    with np.errstate(divide="ignore", invalid="ignore"):
        t_lo = (-half_size - origin) / local
        t_hi = (half_size - origin) / local
    t_near = np.nanmax(np.minimum(t_lo, t_hi), axis=1)
    t_far = np.nanmin(np.maximum(t_lo, t_hi), axis=1)
    hit = (t_near <= t_far) & (t_near > 0.0)
    return np.where(hit, t_near, np.inf)


def _columns(box: np.void, fov_deg: float, azimuth_step_deg: float, columns: int) -> slice | None:
    """The scan columns a box in front of the sensor can return in; None for none."""
    half = math.radians(fov_deg) / 2.0
    step = math.radians(azimuth_step_deg)
    cos, sin = math.cos(float(box["yaw"])), math.sin(float(box["yaw"]))
    hl, hw = float(box["length"]) / 2.0, float(box["width"]) / 2.0
    corners_x = (
        float(box["x"]) + np.array([hl, hl, -hl, -hl]) * cos - np.array([hw, -hw, hw, -hw]) * sin
    )
    corners_y = (
        float(box["y"]) + np.array([hl, hl, -hl, -hl]) * sin + np.array([hw, -hw, hw, -hw]) * cos
    )
    if (corners_x <= 0.0).all():
        return None
    az = np.arctan2(corners_y, corners_x)
    if az.max() - az.min() > math.pi:
        return None
    c0 = max(math.floor((half - az.max()) / step), 0)
    c1 = min(math.ceil((half - az.min()) / step) + 1, columns)
    return slice(c0, c1) if c0 < c1 else None


def cast(
    dirs: np.ndarray,
    boxes: np.ndarray,
    plane: np.ndarray,
    max_range_m: float,
    cull: tuple[float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Range along every ray to the nearest surface, inf past ``max_range_m`` or where none
    is hit, and the row of ``boxes`` (OBSTACLE_DTYPE) it hit, -1 for the ground or nothing.

    The ground is ``plane`` (a, b, c, d: a*x + b*y + c*z + d = 0). ``cull`` (the field of
    view and the azimuth step of ``dirs``, in degrees, at most a half turn) tests each box
    only against the columns its azimuth span covers, which keeps a 150,000-point scan of 80
    objects fast; boxes behind the sensor are left out then.
    """
    a, b, c, d = plane
    with np.errstate(divide="ignore"):
        t_ground = -d / (dirs @ np.array([a, b, c]))
    best = np.where(t_ground > 0.0, t_ground, np.inf)
    hit = np.full(dirs.shape[0], -1, dtype=np.int32)
    beams = beam_elevations_rad().size
    for k, box in enumerate(boxes):
        rays = slice(None)
        if cull is not None:
            columns = _columns(box, *cull, dirs.shape[0] // beams)
            if columns is None:
                continue
            rays = slice(columns.start * beams, columns.stop * beams)
        centre = np.array([box["x"], box["y"], box["z"]], dtype=np.float64)
        half = 0.5 * np.array([box["length"], box["width"], box["height"]], dtype=np.float64)
        t_box = ray_box_distance(dirs[rays], centre, half, float(box["yaw"]))
        closer = t_box < best[rays]
        best[rays] = np.where(closer, t_box, best[rays])
        hit[rays][closer] = k
    best[best > max_range_m] = np.inf
    return best, hit


def resample(rng: np.random.Generator, count: int, wanted: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``[wanted]`` into ``count`` returns in scan order, and which are duplicates."""
    if wanted <= count:
        keep = np.sort(rng.choice(count, size=wanted, replace=False))
        return keep, np.zeros(wanted, dtype=bool)
    extra = rng.choice(count, size=wanted - count, replace=True)
    index = np.r_[np.arange(count), extra]
    duplicate = np.r_[np.zeros(count, dtype=bool), np.ones(extra.size, dtype=bool)]
    order = np.argsort(index, kind="stable")
    return index[order], duplicate[order]


def surface_intensity(
    rng: np.random.Generator,
    lateral_m: np.ndarray,
    hit: np.ndarray,
    labels: np.ndarray,
    markings_m: tuple[float, ...],
) -> np.ndarray:
    """Intensity in [0, 1] of each return by the surface it hit: asphalt, a lane marking
    (ground within half a marking's width of a ``markings_m`` line, by ``lateral_m``), or the
    label of the box."""
    low = np.full(hit.size, ASPHALT_INTENSITY[0])
    high = np.full(hit.size, ASPHALT_INTENSITY[1])
    ground = hit < 0
    marking = ground & (
        np.abs(lateral_m[:, None] - np.asarray(markings_m)[None, :]).min(axis=1)
        < LANE_MARKING_WIDTH_M / 2.0
    )
    low[marking], high[marking] = MARKING_INTENSITY
    point_label = np.r_[labels, LABEL_UNKNOWN_SURFACE][hit]
    for label, (lo, hi) in (
        (LABEL_CAR, CAR_INTENSITY),
        (LABEL_POLE, POLE_INTENSITY),
        (LABEL_PEDESTRIAN, PEDESTRIAN_INTENSITY),
    ):
        surface = ~ground & (point_label == label)
        low[surface], high[surface] = lo, hi
    value = rng.uniform(low, high) + rng.normal(0.0, INTENSITY_NOISE, hit.size)
    return np.clip(value, 0.0, 1.0)
