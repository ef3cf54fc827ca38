"""The perception pipeline without ROS: segment, cluster, track, predict, with stage timings."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dynshape_perception.config import (
    Bounds,
    check_seed,
    default_bounds,
    default_config,
    predictor_history_steps,
)
from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.paramspec import check_fields, derived, param
from dynshape_perception.perception.clustering import ClusterParams, cluster_obstacles
from dynshape_perception.perception.ground import (
    DEFAULT_SENSOR_HEIGHT_M,
    GroundPlane,
    fit_ground_plane,
)
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.perception.prediction.history import resample_history
from dynshape_perception.perception.prediction.paths import PredictedPaths, PredictionStage
from dynshape_perception.perception.scan import ScanParams, prepare_scan
from dynshape_perception.perception.tracking import Tracker, TrackerParams
from dynshape_perception.perception.transforms import Matrix, planar, yaw_of

ModelFn = Callable[..., list[np.ndarray]]
STAGES = ("segment", "cluster", "track", "predict")


@dataclass(frozen=True)
class Pose2D:
    """A planar pose in the fixed (odometry) frame."""

    x: float = 0.0
    y: float = 0.0
    yaw: float = 0.0

    def apply(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        return self.x + c * x - s * y, self.y + s * x + c * y

    def matrix(self) -> Matrix:
        return planar(self.x, self.y, self.yaw)

    @classmethod
    def of(cls, m: Matrix) -> Pose2D:
        """The planar part of a transform: its origin's x, y and its heading."""
        return cls(float(m[0, 3]), float(m[1, 3]), yaw_of(m))


@dataclass(frozen=True)
class PipelineParams:
    cluster: ClusterParams = derived("segmentation.*", default_factory=ClusterParams)
    tracker: TrackerParams = derived("tracking.*", default_factory=TrackerParams)
    # The crop of each scan; its ROI is also the clustering's (``cluster.roi``).
    scan: ScanParams | None = derived("scan.*", None)
    objects: ObjectParams = derived("objects.*", default_factory=ObjectParams)
    subsample_over_bound: bool = param(
        False, "subsample a cloud above bounds.max_points (seeded) instead of dropping it"
    )
    subsample_seed: int = derived("the caller (no node parameter sets it)", 0)
    ground_seed: int = derived("the caller (no node parameter sets it)", 0)
    min_history_steps: int = derived("prediction.min_history_steps (PredictionSettings)", 2)

    def __post_init__(self) -> None:
        check_fields(self)
        check_seed("subsample_seed", self.subsample_seed)
        check_seed("ground_seed", self.ground_seed)
        if isinstance(self.min_history_steps, bool) or not isinstance(self.min_history_steps, int):
            raise ConfigError(
                f"min_history_steps must be an integer, got {self.min_history_steps!r}"
            )
        if self.min_history_steps < 1:
            raise ConfigError(f"min_history_steps must be >= 1, got {self.min_history_steps}")


@dataclass
class FrameResult:
    stamp_s: float
    scores: np.ndarray
    ground: GroundPlane
    obstacles: np.ndarray
    tracks: np.ndarray
    predictions: np.ndarray
    latency_ms: dict[str, float]
    counts: dict[str, int]
    paths: PredictedPaths | None = None


def _check_points(points: np.ndarray) -> np.ndarray:
    if not isinstance(points, np.ndarray) or points.ndim != 2 or points.shape[1] != 4:
        shape = getattr(points, "shape", None)
        raise ShapeError(f"points must be [P, 4] float32 (x, y, z, intensity), got {shape}")
    if points.dtype != np.float32:
        raise ShapeError(f"points must be float32, got {points.dtype}")
    if points.size and not np.isfinite(points).all():
        raise InputValueError("points hold NaN or Inf values")
    return points


class Pipeline:
    """One instance per vehicle: holds the tracker state across frames."""

    def __init__(
        self,
        segmenter: ModelFn,
        associator: ModelFn,
        predictor: ModelFn,
        params: PipelineParams | None = None,
        bounds: Bounds | None = None,
    ) -> None:
        self.params = params or PipelineParams()
        self.bounds = bounds or default_bounds()
        self._segmenter = segmenter
        self._associator = associator
        self._predictor = predictor
        pred = default_config().section("predictor")
        self.step_s = float(pred.get("step_s", 0.4))
        self.history_steps = predictor_history_steps(self.bounds)
        self.tracker = Tracker(self._affinity, self.params.tracker, self.bounds)
        self.prediction = PredictionStage(predictor, self.step_s)
        self.batcher = self.prediction.batcher
        self.dropped_detections = 0
        self.dropped_agents = 0
        self.subsampled_frames = 0
        # Height of the scan frame's origin above the road where no plane fits: the sensor's
        # nominal height, less how far the mount raised the points.
        self.origin_height_m = DEFAULT_SENSOR_HEIGHT_M

    def _affinity(self, det: np.ndarray, trk: np.ndarray) -> np.ndarray:
        return self._associator("forward", det, trk)[0]

    def prepare(
        self, points: np.ndarray, mount: Matrix | None = None
    ) -> tuple[np.ndarray, dict[str, int]]:
        """Sensor-frame points into the cropped vehicle-frame scan (``scan`` params; without
        them the points pass as they are), then the P bound."""
        removed: dict[str, int] = {}
        if self.params.scan is not None:
            mount = np.eye(4) if mount is None else mount
            scan = prepare_scan(points, mount, self.params.scan)
            points, removed = scan.points, scan.removed
            self.origin_height_m = DEFAULT_SENSOR_HEIGHT_M - float(mount[2, 3])
        return self.bound_points(points), removed

    def bound_points(self, points: np.ndarray) -> np.ndarray:
        """Enforce the P bound: subsample (seeded) if configured, else raise BoundError."""
        if points.shape[0] <= self.bounds.P:
            return points
        if not self.params.subsample_over_bound:
            self.bounds.check("P", points.shape[0], "points")
        rng = np.random.default_rng(self.params.subsample_seed)
        keep = np.sort(rng.choice(points.shape[0], self.bounds.P, replace=False))
        self.subsampled_frames += 1
        return points[keep]

    def segment(self, points: np.ndarray) -> tuple[np.ndarray, GroundPlane]:
        ground = self.fit_ground(points)
        (scores,) = self._segmenter("forward", points, ground.as_array())
        return scores, ground

    def fit_ground(self, points: np.ndarray) -> GroundPlane:
        return fit_ground_plane(
            points[:, :3], seed=self.params.ground_seed, default_height_m=self.origin_height_m
        )

    def default_ground(self) -> GroundPlane:
        return GroundPlane.default(self.origin_height_m)

    def detect(self, points: np.ndarray, scores: np.ndarray, ground: GroundPlane) -> np.ndarray:
        obstacles = cluster_obstacles(points, scores, self.params.cluster, ground)
        if obstacles.shape[0] > self.bounds.N:
            # Clusters come nearest first, so the far ones give way.
            self.dropped_detections += obstacles.shape[0] - self.bounds.N
            obstacles = obstacles[: self.bounds.N]
        return obstacles

    def to_fixed_frame(self, obstacles: np.ndarray, pose: Pose2D | Matrix) -> np.ndarray:
        """Boxes moved by ``pose`` (the transform from their frame to the fixed one): centres
        in 3-D, headings by the transform's yaw."""
        m = pose.matrix() if isinstance(pose, Pose2D) else np.asarray(pose, dtype=np.float64)
        out = obstacles.copy()
        centres = np.stack([obstacles[k].astype(np.float64) for k in ("x", "y", "z")], axis=1)
        moved = centres @ m[:3, :3].T + m[:3, 3]
        out["x"], out["y"], out["z"] = moved[:, 0], moved[:, 1], moved[:, 2]
        out["yaw"] = np.angle(np.exp(1j * (obstacles["yaw"] + yaw_of(m))))
        return out

    def track(self, obstacles_fixed: np.ndarray, stamp_s: float) -> np.ndarray:
        return self.tracker.update(obstacles_fixed, stamp_s)

    def agent_histories(
        self, tracks: np.ndarray, ego: Pose2D
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Histories of confirmed tracks at the predictor's step; nearest agents first."""
        ids, histories = [], []
        order = np.argsort(np.hypot(tracks["x"] - ego.x, tracks["y"] - ego.y), kind="stable")
        for row in tracks[order]:
            stamps, xy = self.tracker.history(int(row["id"]))
            if len(stamps) == 0:
                continue
            hist, length = resample_history(
                stamps, xy, num_steps=self.history_steps, step_s=self.step_s
            )
            if length < self.params.min_history_steps:
                continue
            ids.append(int(row["id"]))
            histories.append(hist)
        if len(ids) > self.bounds.A:
            self.dropped_agents += len(ids) - self.bounds.A
            ids, histories = ids[: self.bounds.A], histories[: self.bounds.A]
        return np.asarray(ids, dtype=np.uint32), histories

    def predict_paths(self, tracks: np.ndarray, ego: Pose2D) -> PredictedPaths:
        ids, histories = self.agent_histories(tracks, ego)
        return self.prediction.predict(ids, histories)

    def predict(self, tracks: np.ndarray, ego: Pose2D) -> np.ndarray:
        return self.predict_paths(tracks, ego).table()

    def process(
        self,
        points: np.ndarray,
        stamp_s: float,
        pose: Pose2D | Matrix | None = None,
        mount: Matrix | None = None,
    ) -> FrameResult:
        """One scan: ``mount`` takes its points into the vehicle frame, ``pose`` the vehicle
        into the fixed frame at ``stamp_s``."""
        fixed = Pose2D().matrix() if pose is None else pose
        ego = fixed if isinstance(fixed, Pose2D) else Pose2D.of(fixed)
        points, removed = self.prepare(_check_points(points), mount)
        latency: dict[str, float] = {}
        t0 = time.perf_counter()
        scores, ground = self.segment(points)
        t1 = time.perf_counter()
        obstacles = self.detect(points, scores, ground)
        t2 = time.perf_counter()
        tracks = self.track(self.to_fixed_frame(obstacles, fixed), stamp_s)
        t3 = time.perf_counter()
        paths = self.predict_paths(tracks, ego)
        predictions = paths.table()
        t4 = time.perf_counter()
        for name, (a, b) in zip(STAGES, ((t0, t1), (t1, t2), (t2, t3), (t3, t4)), strict=True):
            latency[name] = (b - a) * 1000.0
        latency["total"] = (t4 - t0) * 1000.0
        return FrameResult(
            stamp_s=stamp_s,
            scores=scores,
            ground=ground,
            obstacles=obstacles,
            tracks=tracks,
            predictions=predictions,
            latency_ms=latency,
            paths=paths,
            counts={
                **removed,
                "points": int(points.shape[0]),
                "obstacles": int(obstacles.shape[0]),
                "tracks": int(tracks.shape[0]),
                "agents": int(np.unique(predictions["id"]).size),
                "predictions": int(predictions.shape[0]),
            },
        )
