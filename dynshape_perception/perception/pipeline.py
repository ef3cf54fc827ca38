"""The perception pipeline without ROS: segment, cluster, track, predict, with stage timings."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dynshape_perception.config import (
    Bounds,
    check_seed,
    default_bounds,
    default_config,
    predictor_history_steps,
)
from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.io.tables import PREDICTION_DTYPE
from dynshape_perception.perception.clustering import ClusterParams, cluster_obstacles
from dynshape_perception.perception.ground import GroundPlane, fit_ground_plane
from dynshape_perception.perception.history import resample_history
from dynshape_perception.perception.tracking import Tracker, TrackerParams
from dynshape_perception.runtime.batching import HistoryBatcher

ModelFn = Callable[..., list[np.ndarray]]
STAGES = ("segment", "cluster", "track", "predict")


@dataclass(frozen=True)
class Pose2D:
    """The sensor's pose in the fixed (odometry) frame."""

    x: float = 0.0
    y: float = 0.0
    yaw: float = 0.0

    def apply(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        return self.x + c * x - s * y, self.y + s * x + c * y


@dataclass(frozen=True)
class PipelineParams:
    cluster: ClusterParams = field(default_factory=ClusterParams)
    tracker: TrackerParams = field(default_factory=TrackerParams)
    subsample_over_bound: bool = False
    subsample_seed: int = 0
    ground_seed: int = 0
    min_history_steps: int = 2

    def __post_init__(self) -> None:
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
    pooled: np.ndarray
    pooled_valid: bool
    ground: GroundPlane
    obstacles: np.ndarray
    tracks: np.ndarray
    predictions: np.ndarray
    latency_ms: dict[str, float]
    counts: dict[str, int]


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
        self.batcher = HistoryBatcher(predictor)
        self.dropped_detections = 0
        self.dropped_agents = 0
        self.subsampled_frames = 0

    def _affinity(self, det: np.ndarray, trk: np.ndarray) -> np.ndarray:
        return self._associator("forward", det, trk)[0]

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

    def segment(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray, GroundPlane]:
        ground = fit_ground_plane(points[:, :3], seed=self.params.ground_seed)
        scores, pooled = self._segmenter("forward", points, ground.as_array())
        return scores, pooled, ground

    def detect(self, points: np.ndarray, scores: np.ndarray, ground: GroundPlane) -> np.ndarray:
        obstacles = cluster_obstacles(points, scores, self.params.cluster, ground)
        if obstacles.shape[0] > self.bounds.N:
            # Clusters come nearest first, so the far ones give way.
            self.dropped_detections += obstacles.shape[0] - self.bounds.N
            obstacles = obstacles[: self.bounds.N]
        return obstacles

    def to_fixed_frame(self, obstacles: np.ndarray, pose: Pose2D) -> np.ndarray:
        out = obstacles.copy()
        x, y = pose.apply(obstacles["x"].astype(np.float64), obstacles["y"].astype(np.float64))
        out["x"], out["y"] = x, y
        out["yaw"] = np.angle(np.exp(1j * (obstacles["yaw"] + pose.yaw)))
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

    def predict(self, tracks: np.ndarray, ego: Pose2D) -> np.ndarray:
        ids, histories = self.agent_histories(tracks, ego)
        if ids.size == 0:
            return np.zeros(0, dtype=PREDICTION_DTYPE)
        state = self.batcher.encode(histories)
        traj, probs = self._predictor("decode", *state)
        return prediction_table(ids, traj, probs)

    def process(
        self, points: np.ndarray, stamp_s: float, pose: Pose2D | None = None
    ) -> FrameResult:
        pose = pose or Pose2D()
        points = self.bound_points(_check_points(points))
        latency: dict[str, float] = {}
        t0 = time.perf_counter()
        scores, pooled, ground = self.segment(points)
        t1 = time.perf_counter()
        obstacles = self.detect(points, scores, ground)
        t2 = time.perf_counter()
        tracks = self.track(self.to_fixed_frame(obstacles, pose), stamp_s)
        t3 = time.perf_counter()
        predictions = self.predict(tracks, pose)
        t4 = time.perf_counter()
        for name, (a, b) in zip(STAGES, ((t0, t1), (t1, t2), (t2, t3), (t3, t4)), strict=True):
            latency[name] = (b - a) * 1000.0
        latency["total"] = (t4 - t0) * 1000.0
        return FrameResult(
            stamp_s=stamp_s,
            scores=scores,
            pooled=pooled,
            pooled_valid=points.shape[0] > 0,
            ground=ground,
            obstacles=obstacles,
            tracks=tracks,
            predictions=predictions,
            latency_ms=latency,
            counts={
                "points": int(points.shape[0]),
                "obstacles": int(obstacles.shape[0]),
                "tracks": int(tracks.shape[0]),
                "agents": int(np.unique(predictions["id"]).size),
                "predictions": int(predictions.shape[0]),
            },
        )


def prediction_table(ids: np.ndarray, traj: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Rows (id, k, step, x, y, prob) for every agent, hypothesis and step."""
    a_n, k_n, h_n, _ = traj.shape
    table = np.zeros(a_n * k_n * h_n, dtype=PREDICTION_DTYPE)
    grid_a, grid_k, grid_s = np.meshgrid(
        np.arange(a_n), np.arange(k_n), np.arange(h_n), indexing="ij"
    )
    table["id"] = ids[grid_a.ravel()]
    table["k"] = grid_k.ravel()
    table["step"] = grid_s.ravel()
    table["x"] = traj[..., 0].ravel()
    table["y"] = traj[..., 1].ravel()
    table["prob"] = probs[grid_a.ravel(), grid_k.ravel()]
    return table
