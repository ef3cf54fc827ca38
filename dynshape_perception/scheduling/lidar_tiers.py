"""The nodes' tiered work: near-field and full-cloud segmentation jobs, chunk sizes, diagnostics."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.clustering import (
    ClusterParams,
    cluster_obstacles,
    rows_to_score,
)
from dynshape_perception.perception.ground import GroundPlane
from dynshape_perception.perception.pipeline import ModelFn, Pipeline
from dynshape_perception.perception.records import OBSTACLE_DTYPE
from dynshape_perception.perception.streaming import NearField, subsample_far_field
from dynshape_perception.scheduling.executor import COST_SMOOTHING, DROP_REASONS
from dynshape_perception.scheduling.tiers import Tier, TierConfig

MS_PER_S = 1000.0
# Unit names: the executor keeps a service-time estimate per name.
NEAR_FIELD = "near_field"
FULL_CLOUD = "full_cloud"
PREDICT = "predict"
MARKERS = "markers"
# Per-tier counts that grow; a report's level looks at what they grew by since the last one.
_COUNTS = ("submitted", "completed", "misses", "failed", "dropped", "starvations")


class ExecutorView(Protocol):
    """What the segmentation jobs read of the executor (its live config and degraded mode)."""

    config: TierConfig

    def far_field_keep_fraction(self) -> float: ...


class Undegraded:
    """What the segmentation jobs see of an executor when they run outside one: its tier
    config, and never degraded."""

    def __init__(self, config: TierConfig | None = None) -> None:
        self.config = config or TierConfig()

    def far_field_keep_fraction(self) -> float:
        return 1.0


def _elapsed_ms(start: float) -> float:
    return (time.perf_counter() - start) * MS_PER_S


class ChunkSizer:
    """Points per segmenter call, so that one call of the full cloud lasts about the budget.

    Sizes are the segmenter's JIT bucket edges, so every whole chunk meets one (soon warm)
    specialisation. The cost per point is measured on whole chunks and smoothed as the
    executor smooths its estimates; before any measurement the smallest edge is used.
    """

    def __init__(self, edges: Sequence[int]) -> None:
        if not edges or min(edges) < 1:
            raise ConfigError(f"chunk sizes need positive bucket edges, got {list(edges)}")
        self.edges = sorted(int(e) for e in edges)
        self.ms_per_point: float | None = None

    def points(self, budget_ms: float) -> int:
        if self.ms_per_point is None:
            return self.edges[0]
        fitting = [e for e in self.edges if e * self.ms_per_point <= budget_ms]
        return fitting[-1] if fitting else self.edges[0]

    def record(self, points: int, ms: float) -> None:
        rate = ms / points
        old = self.ms_per_point
        self.ms_per_point = rate if old is None else old + COST_SMOOTHING * (rate - old)


@dataclass(frozen=True)
class NearResult:
    """Tier 1: the obstacles of the collision corridor (sensor frame)."""

    obstacles: np.ndarray
    points: int
    ms: float
    default_plane: bool
    # Obstacles beyond bounds.max_obstacles, left out (the nearest are kept).
    dropped: int = 0


@dataclass(frozen=True)
class FullCloud:
    """Tier 2: the obstacles of the whole cloud (sensor frame), and what they took."""

    obstacles: np.ndarray
    ground: GroundPlane
    points: int
    far_field_subsampled: bool
    chunks: int
    latency_ms: dict[str, float]


class PlaneFits:
    """The full clouds of one process fitting their ground plane now.

    The near field's clustering and a plane fit are both GIL-bound: run together they hand
    the GIL back and forth at every NumPy call and both take about twice as long. The
    segmenter call that follows a fit lets go of the GIL for milliseconds, which the
    clustering then has to itself. The GIL is the process's, so the segmentations of one
    process (one per lidar) share one ``PlaneFits``.
    """

    def __init__(self) -> None:
        self._running = 0
        self._cv = threading.Condition()

    @property
    def running(self) -> int:
        return self._running

    @contextmanager
    def fitting(self) -> Iterator[None]:
        """One plane fit, from start to end (a failing one too)."""
        with self._cv:
            self._running += 1
        try:
            yield
        finally:
            with self._cv:
                self._running -= 1
                if self._running == 0:
                    self._cv.notify_all()

    def await_none(self, wait_s: float) -> None:
        """Until no plane fit runs, at most ``wait_s``."""
        if wait_s <= 0.0:
            return
        with self._cv:
            self._cv.wait_for(lambda: self._running == 0, timeout=wait_s)


class Segmentation:
    """Splits one cloud into a tier-1 near-field job and a chunked tier-2 full-cloud job.

    The near field runs on its own engine (``fast``): a model's VM runs one call at a
    time, so sharing the main engine would queue tier-1 calls behind lower-tier ones. It
    takes the newest full-cloud ground plane (a plane fit costs about a tier-1 budget),
    the flat default before the first; road points are left out only with a fitted plane.
    Its clustering waits for the process's plane fits (``fits``), at most
    ``near.handover_wait_ms`` and never past half its deadline (``handover_wait_s``).
    """

    def __init__(
        self,
        fast: ModelFn,
        main: ModelFn,
        pipeline: Pipeline,
        near: NearField,
        executor: ExecutorView,
        chunk_edges: Sequence[int],
        fits: PlaneFits | None = None,
    ) -> None:
        self.fast = fast
        self.main = main
        self.pipeline = pipeline
        self.near = near
        self.executor = executor
        self.chunks = ChunkSizer(chunk_edges)
        self.plane: GroundPlane | None = None
        self.fits = fits or PlaneFits()
        self._near_cluster: tuple[ClusterParams, NearField, ClusterParams] | None = None

    def near_cluster(self, near: NearField) -> ClusterParams:
        """The clustering settings cropped to the corridor of ``near``, made again only when
        either changes: checking them takes about 0.1 ms of the thread that submits a scan."""
        cluster = self.pipeline.params.cluster
        made = self._near_cluster
        if made is None or made[0] is not cluster or made[1] is not near:
            made = (cluster, near, replace(cluster, roi=near.roi()))
            self._near_cluster = made
        return made[2]

    def handover_wait_s(self, near: NearField, made_s: float) -> float:
        """How long a near field made at ``made_s`` (``time.perf_counter``) may now wait for
        the plane fits: ``near.handover_wait_ms``, but never past half its tier's deadline.
        The other half is the clustering's, which beside a loaded shared lane takes several
        times its time alone: a unit that queued or ran slow gives up the wait, not its
        deadline."""
        latest_s = made_s + self.executor.config.deadline_ms(Tier.COLLISION) / MS_PER_S / 2.0
        wait_s = min(near.handover_wait_ms / MS_PER_S, latest_s - time.perf_counter())
        return max(0.0, wait_s)

    def near_field(self, points: np.ndarray) -> Callable[[], NearResult]:
        near = self.near
        cluster = self.near_cluster(near)
        made_s = time.perf_counter()

        def job() -> NearResult:
            start = time.perf_counter()
            fitted = self.plane
            ground = fitted or self.pipeline.default_ground()
            selected = np.take(points, near.select(points, fitted), axis=0)
            dropped = 0
            if selected.shape[0] == 0:
                obstacles = np.zeros(0, dtype=OBSTACLE_DTYPE)
            else:
                scores = self.fast("forward", selected, ground.as_array())[0]
                self.fits.await_none(self.handover_wait_s(near, made_s))
                obstacles = cluster_obstacles(selected, scores, cluster, ground)
                dropped = max(0, obstacles.shape[0] - self.pipeline.bounds.N)
                obstacles = obstacles[: self.pipeline.bounds.N]
            return NearResult(
                obstacles, int(selected.shape[0]), _elapsed_ms(start), fitted is None, dropped
            )

        return job

    def full_cloud(self, points: np.ndarray, seed: int) -> Generator[None, None, FullCloud]:
        """Far-field subsampling while degraded, plane fit, chunked segmentation, clustering.

        Every ``yield`` ends a chunk: the executor may run higher-tier work in between.
        """
        start = time.perf_counter()
        keep = self.executor.far_field_keep_fraction()
        cloud = subsample_far_field(points, self.near, keep, seed=seed)
        yield
        # No yield in the fit phase: tier-1 work that this lane ran there would wait on it.
        with self.fits.fitting():
            ground = self.pipeline.fit_ground(cloud)
            self.plane = ground
            plane = ground.as_array()
            # Road and canopy points would not join a cluster at any score.
            wanted = rows_to_score(cloud, self.pipeline.params.cluster, ground)
            rows = cloud if wanted is None else np.take(cloud, wanted, axis=0)
        yield
        scores: list[np.ndarray] = []
        done = 0
        while done < rows.shape[0]:
            size = self.chunks.points(self.executor.config.chunk_budget_ms)
            chunk = rows[done : done + size]
            called = time.perf_counter()
            scores.append(self.main("forward", chunk, plane)[0])
            if chunk.shape[0] == size:
                self.chunks.record(size, _elapsed_ms(called))
            done += chunk.shape[0]
            yield
        segmented = time.perf_counter()
        scored = np.concatenate(scores) if scores else np.zeros(0, np.float32)
        if wanted is None:
            merged = scored
        else:
            merged = np.zeros(cloud.shape[0], np.float32)
            merged[wanted] = scored
        obstacles = self.pipeline.detect(cloud, merged, ground)
        return FullCloud(
            obstacles,
            ground,
            int(cloud.shape[0]),
            cloud.shape[0] < points.shape[0],
            len(scores),
            {
                "segment": (segmented - start) * MS_PER_S,
                "cluster": _elapsed_ms(segmented),
            },
        )


def since(snapshot: Mapping[str, Any], before: Mapping[str, Any] | None) -> dict[str, Any]:
    """``snapshot`` with every per-tier count reduced by its value in ``before``.

    A report's level then says what happened in its period: one missed deadline does not
    keep a node in ERROR for the rest of its life (the counts stay cumulative).
    """
    if before is None:
        return dict(snapshot)
    tiers: dict[str, Any] = {}
    for key, st in snapshot["tiers"].items():
        old = before["tiers"][key]
        tiers[key] = {
            **st,
            **{name: st[name] - old[name] for name in _COUNTS},
            "dropped_by": {r: st["dropped_by"][r] - old["dropped_by"][r] for r in DROP_REASONS},
        }
    return {**snapshot, "tiers": tiers}


def executor_values(snapshot: Mapping[str, Any], config: TierConfig) -> dict[str, object]:
    """What the diagnostics add to the core's per-tier keys: lanes and degraded mode."""
    degraded = bool(snapshot.get("degraded", False))
    return {
        "executor.far_field_keep_fraction": config.far_field_keep_fraction if degraded else 1.0,
        "executor.realtime_lanes": snapshot["realtime_lanes"],
        "executor.shared_boosts": snapshot["shared_boosts"],
        # 0: the library keeps its own thread count (not asked for, or no OpenBLAS to set).
        "executor.blas_threads": snapshot.get("blas_threads") or 0,
        "executor.opencv_threads": snapshot.get("opencv_threads") or 0,
        "executor.running": snapshot["running"],
        "executor.degraded_entries": snapshot.get("degraded_entries", 0),
        "executor.degraded_s": snapshot.get("degraded_s", 0.0),
    }
