"""Ground plane estimation: vectorised RANSAC on a subsample, then a least-squares refit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from dynshape_perception.errors import ConfigError, ShapeError

DEFAULT_SENSOR_HEIGHT_M = 1.73
MIN_PLANE_POINTS = 3
# Below this, the cross product of a sampled triple is too short to give a normal direction.
_DEGENERATE_NORMAL = 1.0e-9


@dataclass(frozen=True)
class GroundPlane:
    """The plane ``a*x + b*y + c*z + d = 0`` with a unit normal pointing up (``c > 0``)."""

    a: float
    b: float
    c: float
    d: float
    num_inliers: int = 0
    is_default: bool = False

    @classmethod
    def default(cls, sensor_height_m: float = DEFAULT_SENSOR_HEIGHT_M) -> GroundPlane:
        """Flat ground ``z = -sensor_height_m`` below the sensor, flagged as a fallback."""
        return cls(0.0, 0.0, 1.0, float(sensor_height_m), num_inliers=0, is_default=True)

    def as_array(self) -> np.ndarray:
        """``[a, b, c, d]`` as float32, so that height = a*x + b*y + c*z + d."""
        return np.array([self.a, self.b, self.c, self.d], dtype=np.float32)

    def height(self, points: np.ndarray) -> np.ndarray:
        """Signed height (metres, float64 ``[P]``) of ``[P, >=3]`` points above the plane."""
        xyz = _xyz(points)
        normal = np.array([self.a, self.b, self.c])
        height: np.ndarray = xyz @ normal + self.d
        return height

    def z_at(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The plane's z at the given x, y (metres)."""
        return (
            -(self.a * np.asarray(x, np.float64) + self.b * np.asarray(y, np.float64) + self.d)
            / self.c
        )


def _xyz(points: np.ndarray) -> np.ndarray:
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[1] < 3:
        raise ShapeError(f"points must be [P, >=3], got shape {points.shape}")
    # Column by column: casting the strided [P, 3] view at once is several times slower.
    xyz = np.empty((points.shape[0], 3))
    for axis in range(3):
        xyz[:, axis] = points[:, axis]
    return xyz


def _column_means(xyz: np.ndarray) -> np.ndarray:
    """``xyz.mean(axis=0)`` of a C-contiguous ``[n, 3]`` float64 array, to the bit.

    NumPy sums the rows one after the other, as OpenCV's row reduction does, but runs a loop
    of three per row: several times slower.
    """
    sums = np.asarray(cv2.reduce(xyz, 0, cv2.REDUCE_SUM, dtype=cv2.CV_64F)).reshape(3)
    means: np.ndarray = sums / xyz.shape[0]
    return means


def _refit(xyz: np.ndarray) -> tuple[np.ndarray, float]:
    """Total least squares plane through ``xyz`` (centred in place): unit normal with c >= 0,
    and d.

    The normal is the scatter matrix's least eigenvector: the SVD of the centred points
    gives the same direction but builds an ``[n, 3]`` factor it does not need.
    """
    centroid = _column_means(xyz)
    # A scalar per channel: NumPy's broadcast over rows of three runs a loop per row.
    rows = xyz.reshape(-1, 1, 3)
    # OpenCV takes a 4-tuple as a scalar per channel (its stubs know no such argument).
    per_channel: Any = (*centroid.tolist(), 0.0)
    centred = np.asarray(cv2.subtract(rows, per_channel, dst=rows)).reshape(-1, 3)
    _, vectors = np.linalg.eigh(centred.T @ centred)
    normal = vectors[:, 0]
    if normal[2] < 0.0:
        normal = -normal
    return normal, float(-normal @ centroid)


def _msac_costs(
    sample: np.ndarray, normals: np.ndarray, offsets: np.ndarray, cap: float
) -> np.ndarray:
    """Per plane, the sum over ``sample`` of squared residuals truncated at ``cap``.

    In four NumPy calls over the whole ``[points, planes]`` matrix, in place: each call
    lets go of the GIL, and in a node another lane then takes it until it lets go in turn,
    so a loop over row blocks (as fast alone) took twice as long beside the near field.
    """
    residuals = sample @ np.ascontiguousarray(normals.T)
    residuals += offsets
    np.square(residuals, out=residuals)
    np.minimum(residuals, cap, out=residuals)
    costs: np.ndarray = residuals.sum(axis=0)
    return costs


def fit_ground_plane(
    points_xyz: np.ndarray,
    seed: int = 0,
    iterations: int = 200,
    threshold_m: float = 0.2,
    max_sample_points: int = 4000,
    max_tilt_deg: float = 20.0,
    refit_rounds: int = 2,
    default_height_m: float = DEFAULT_SENSOR_HEIGHT_M,
) -> GroundPlane:
    """Fit the dominant near-horizontal plane of ``[P, >=3]`` points; deterministic for a seed.

    RANSAC draws ``iterations`` point triples from a subsample of at most
    ``max_sample_points``, rejects planes tilted more than ``max_tilt_deg`` from horizontal
    (walls, car sides), and keeps the one with the least MSAC cost (squared residuals,
    truncated at ``threshold_m``). The
    plane is then refit by least squares on its inliers among all points. Fewer than three
    finite points, or no usable triple, give ``GroundPlane.default`` (``is_default``).
    """
    counts = (seed, iterations, max_sample_points, refit_rounds)
    if any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) for c in counts):
        raise ConfigError(f"seed and the RANSAC counts must be integers, got {counts}")
    if seed < 0 or iterations < 1 or max_sample_points < MIN_PLANE_POINTS or refit_rounds < 0:
        raise ConfigError(
            f"need seed >= 0, iterations >= 1, max_sample_points >= {MIN_PLANE_POINTS}, "
            f"refit_rounds >= 0; got {seed}, {iterations}, {max_sample_points}, {refit_rounds}"
        )
    if not (threshold_m > 0.0 and 0.0 < max_tilt_deg < 90.0):
        raise ConfigError(
            f"need threshold_m > 0 and 0 < max_tilt_deg < 90, got {threshold_m}, {max_tilt_deg}"
        )
    xyz = _xyz(points_xyz)
    if not np.isfinite(xyz).all():
        xyz = xyz[np.isfinite(xyz).all(axis=1)]
    if xyz.shape[0] < MIN_PLANE_POINTS:
        return GroundPlane.default(default_height_m)

    rng = np.random.default_rng(seed)
    if xyz.shape[0] > max_sample_points:
        chosen = rng.choice(xyz.shape[0], size=max_sample_points, replace=False)
        sample = np.take(xyz, chosen, axis=0)
    else:
        sample = xyz
    triples = sample[rng.integers(0, sample.shape[0], size=(iterations, MIN_PLANE_POINTS))]
    normals = np.cross(triples[:, 1] - triples[:, 0], triples[:, 2] - triples[:, 0])
    norms = np.linalg.norm(normals, axis=1)
    usable = norms > _DEGENERATE_NORMAL
    normals = normals[usable] / norms[usable, None]
    normals *= np.where(normals[:, 2] < 0.0, -1.0, 1.0)[:, None]
    offsets = -np.einsum("ik,ik->i", normals, triples[usable, 0])
    min_up = np.cos(np.deg2rad(max_tilt_deg))
    level = normals[:, 2] >= min_up
    normals, offsets = normals[level], offsets[level]
    if normals.shape[0] == 0:
        return GroundPlane.default(default_height_m)

    # MSAC: inliers cost their squared residual, not a flat 1, so a plane that lies on the
    # road beats a tilted one that grazes more curb and car-body points within the band.
    best = int(np.argmin(_msac_costs(sample, normals, offsets, threshold_m**2)))
    normal, offset = normals[best], float(offsets[best])
    inliers = _inliers(xyz, normal, offset, threshold_m)
    for _ in range(refit_rounds):
        if inliers.size < MIN_PLANE_POINTS:
            break
        # np.take gathers rows several times faster than a boolean mask.
        refit_normal, refit_offset = _refit(np.take(xyz, inliers, axis=0))
        if refit_normal[2] < min_up:
            break
        normal, offset = refit_normal, refit_offset
        inliers = _inliers(xyz, normal, offset, threshold_m)
    return GroundPlane(
        float(normal[0]),
        float(normal[1]),
        float(normal[2]),
        offset,
        num_inliers=int(inliers.size),
        is_default=False,
    )


def _inliers(xyz: np.ndarray, normal: np.ndarray, offset: float, threshold_m: float) -> np.ndarray:
    """The rows of ``xyz`` within ``threshold_m`` of the plane."""
    distance = xyz @ normal
    distance += offset
    np.abs(distance, out=distance)
    return np.flatnonzero(distance <= threshold_m)
