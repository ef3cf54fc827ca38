"""Streaming lidar: segment sectors as they arrive, merge per revolution; near and far fields."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dynshape_perception.config import Roi, check_seed, default_bounds
from dynshape_perception.errors import ConfigError, ShapeError
from dynshape_perception.paramspec import MAX_RANGE_M, check_fields, param
from dynshape_perception.perception.clustering import ClusterParams, cluster_obstacles
from dynshape_perception.perception.ground import GroundPlane, fit_ground_plane

ModelFn = Callable[..., list[np.ndarray]]
GroundSource = Literal["previous", "first_sectors"]


MIN_CORRIDOR_M = 0.1
MAX_GROUND_BAND_M = 10.0


@dataclass(frozen=True)
class NearField:
    """The collision corridor ahead of the sensor, capped at ``max_points`` nearest points.

    The cap bounds the cost of tier-1 segmentation whatever the scene: when the corridor
    holds more points, the farthest ones are left to the full-cloud pass.
    """

    ahead_m: float = param(
        20.0,
        "tier-1 collision corridor (frames.base_frame): its length ahead (+x)",
        low=MIN_CORRIDOR_M,
        high=MAX_RANGE_M,
    )
    half_width_m: float = param(
        3.0,
        "tier-1 collision corridor: its half width (|y|)",
        low=MIN_CORRIDOR_M,
        high=MAX_RANGE_M,
    )
    behind_m: float = param(
        0.0,
        "tier-1 collision corridor (frames.base_frame): its length behind (-x)",
        low=0.0,
        high=MAX_RANGE_M,
    )
    min_z_m: float = param(
        -3.0,
        "tier-1 collision corridor: lowest point height in frames.base_frame",
        low=-MAX_RANGE_M,
        high=MAX_RANGE_M,
    )
    max_z_m: float = param(
        3.0,
        "tier-1 collision corridor: highest point height in frames.base_frame",
        low=-MAX_RANGE_M,
        high=MAX_RANGE_M,
    )
    max_points: int = param(
        4096,
        "nearest corridor points segmented at tier 1 (bounds its cost); the rest are "
        "left to the full cloud",
        low=1,
        high=default_bounds().P,
    )
    # Points within this height of the ground plane are road, not obstacles: leaving them
    # out lets the cap cover a longer corridor. 0 keeps them.
    ground_band_m: float = param(
        0.15,
        "corridor points this close to the last ground plane are road and left out; 0 keeps them",
        low=0.0,
        high=MAX_GROUND_BAND_M,
    )

    # Tier 1 clusters after the full cloud's plane fit where that costs at most this long:
    # both are GIL-bound, and side by side each takes about twice as long.
    handover_wait_ms: float = param(
        3.0,
        "how long the near field may wait, before clustering, for the full cloud's plane fit "
        "to end (both hold the GIL), never past half its deadline; 0 never waits",
        low=0.0,
        high=10.0,
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.min_z_m < self.max_z_m:
            raise ConfigError("near field needs min_z_m < max_z_m")

    def mask(self, points: np.ndarray) -> np.ndarray:
        # Contiguous copies: comparisons over a strided column of a [P, 4] cloud are slower.
        x, y = np.ascontiguousarray(points[:, 0]), np.ascontiguousarray(points[:, 1])
        inside: np.ndarray = x >= -self.behind_m
        inside &= x < self.ahead_m
        inside &= np.abs(y) < self.half_width_m
        return inside

    def select(self, points: np.ndarray, ground: GroundPlane | None = None) -> np.ndarray:
        """Indices of the corridor's points, at most ``max_points`` nearest, in scan order.

        With a ground plane, points inside its ``ground_band_m`` are left out first.
        """
        index = np.flatnonzero(self.mask(points))
        if ground is not None and self.ground_band_m > 0.0 and index.size:
            # A height is its own row's dot product: only the corridor's are needed.
            heights = ground.height(np.take(points, index, axis=0))
            index = index[np.abs(heights) > self.ground_band_m]
        if index.size > self.max_points:
            dist = np.hypot(np.take(points[:, 0], index), np.take(points[:, 1], index))
            nearest = np.zeros(index.size, dtype=bool)
            nearest[np.argpartition(dist, self.max_points - 1)[: self.max_points]] = True
            # In scan order: the index rises, so its masked rows are the sorted selection.
            index = index[nearest]
        return index

    def roi(self) -> Roi:
        return Roi(
            x_m=(-self.behind_m, self.ahead_m),
            y_m=(-self.half_width_m, self.half_width_m),
            z_m=(self.min_z_m, self.max_z_m),
        )


def subsample_far_field(
    points: np.ndarray, near: NearField, keep_fraction: float, seed: int = 0
) -> np.ndarray:
    """Keep the corridor whole and a seeded ``keep_fraction`` of every other point."""
    if not 0.0 < keep_fraction <= 1.0:
        raise ConfigError(f"keep_fraction must lie in (0, 1], got {keep_fraction!r}")
    if keep_fraction >= 1.0:
        return points
    near_mask = near.mask(points)
    far = np.flatnonzero(~near_mask)
    rng = np.random.default_rng(seed)
    kept = rng.choice(far, size=round(keep_fraction * far.size), replace=False)
    # The corridor and the kept far points are disjoint: marked in one mask, they come out
    # in scan order without a sort.
    near_mask[kept] = True
    subsampled: np.ndarray = np.take(points, np.flatnonzero(near_mask), axis=0)
    return subsampled


@dataclass
class RevolutionResult:
    points: np.ndarray
    scores: np.ndarray
    ground: GroundPlane
    obstacles: np.ndarray
    sectors: int
    segment_calls: int


def _check_points(points: np.ndarray) -> np.ndarray:
    if not isinstance(points, np.ndarray) or points.ndim != 2 or points.shape[1] != 4:
        raise ShapeError(f"a sector must be [P, 4] float32, got {getattr(points, 'shape', None)}")
    return np.ascontiguousarray(points, dtype=np.float32)


def detect(
    points: np.ndarray,
    scores: np.ndarray,
    ground: GroundPlane,
    cluster: ClusterParams,
    max_obstacles: int,
) -> np.ndarray:
    """Cluster as ``Pipeline.detect`` does: nearest first, the far ones give way at the bound."""
    return cluster_obstacles(points, scores, cluster, ground)[:max_obstacles]


def process_whole_scan(
    segmenter: ModelFn,
    points: np.ndarray,
    ground: GroundPlane,
    cluster: ClusterParams | None = None,
    max_obstacles: int | None = None,
) -> RevolutionResult:
    """The reference path: one segmenter call on the whole scan, then clustering."""
    points = _check_points(points)
    cluster = cluster or ClusterParams()
    bound = int(max_obstacles or default_bounds().N)
    (scores,) = segmenter("forward", points, ground.as_array())
    return RevolutionResult(
        points, scores, ground, detect(points, scores, ground, cluster, bound), 1, 1
    )


class StreamingSegmenter:
    """Segments each sector on arrival and clusters once per revolution.

    Scores are per point, so segmenting sector by sector gives the whole scan's scores. The
    ground plane is fitted once per revolution, before its first sector is segmented: from the
    previous revolution (``"previous"``; the first revolution falls back to its first
    sectors) or from this revolution's first sectors (``"first_sectors"``), as soon as
    ``min_ground_points`` points have arrived. The whole-scan path given the same plane
    gives the same result.
    """

    def __init__(
        self,
        segmenter: ModelFn,
        cluster: ClusterParams | None = None,
        ground_from: GroundSource = "previous",
        min_ground_points: int = 4000,
        ground_seed: int = 0,
        max_obstacles: int | None = None,
    ) -> None:
        if ground_from not in ("previous", "first_sectors"):
            raise ConfigError(
                f"ground_from must be 'previous' or 'first_sectors', got {ground_from!r}"
            )
        if min_ground_points < 3:
            raise ConfigError("min_ground_points must be >= 3")
        check_seed("ground_seed", ground_seed)
        self._segmenter = segmenter
        self.cluster = cluster or ClusterParams()
        self.ground_from = ground_from
        self.min_ground_points = int(min_ground_points)
        self.ground_seed = ground_seed
        self.max_obstacles = int(max_obstacles or default_bounds().N)
        self.ground: GroundPlane | None = None
        self._previous: np.ndarray | None = None
        self._reset()

    def _reset(self) -> None:
        self._pending: list[np.ndarray] = []
        self._points: list[np.ndarray] = []
        self._scores: list[np.ndarray] = []
        self._sectors = 0
        self._calls = 0

    def prepare(self) -> None:
        """Fit this revolution's plane from the previous one (idle-time work; else lazily)."""
        if self.ground is None and self.ground_from == "previous" and self._previous is not None:
            self.ground = fit_ground_plane(self._previous[:, :3], seed=self.ground_seed)
            self._previous = None

    def add_sector(self, sector: np.ndarray) -> int:
        """Take one sector; returns the points segmented now (0 while the plane waits)."""
        sector = _check_points(sector)
        self._sectors += 1
        self.prepare()
        if self.ground is None:
            self._pending.append(sector)
            if sum(p.shape[0] for p in self._pending) < self.min_ground_points:
                return 0
            self._fit_from_pending()
            return self._flush_pending()
        return self._segment(sector)

    def _fit_from_pending(self) -> None:
        buffered = np.concatenate(self._pending) if self._pending else np.zeros((0, 4), np.float32)
        self.ground = fit_ground_plane(buffered[:, :3], seed=self.ground_seed)

    def _flush_pending(self) -> int:
        done = sum(self._segment(p) for p in self._pending)
        self._pending = []
        return done

    def _segment(self, sector: np.ndarray) -> int:
        if sector.shape[0] == 0:
            return 0
        assert self.ground is not None
        (scores,) = self._segmenter("forward", sector, self.ground.as_array())
        self._calls += 1
        self._points.append(sector)
        self._scores.append(scores)
        return int(sector.shape[0])

    def end_revolution(self) -> RevolutionResult:
        """Merge the revolution's sectors and cluster them; the next revolution starts."""
        if self.ground is None:
            self._fit_from_pending()
        self._flush_pending()
        assert self.ground is not None
        points = np.concatenate(self._points) if self._points else np.zeros((0, 4), np.float32)
        scores = np.concatenate(self._scores) if self._scores else np.zeros(0, np.float32)
        result = RevolutionResult(
            points,
            scores,
            self.ground,
            detect(points, scores, self.ground, self.cluster, self.max_obstacles),
            self._sectors,
            self._calls,
        )
        self._previous = points if self.ground_from == "previous" else None
        self.ground = None
        self._reset()
        return result
