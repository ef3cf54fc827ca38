"""One tier model for the lidar nodes and the in-process replay, as units of the tiered executor."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

import numpy as np

from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.perception.prediction.stage import PredictionStage, StageOutput
from dynshape_perception.perception.records import OBSTACLE_DTYPE
from dynshape_perception.perception.sectors import Revolution, SectorAssembler
from dynshape_perception.scheduling.executor import Arrival, TieredExecutor
from dynshape_perception.scheduling.lidar_tiers import (
    FULL_CLOUD,
    MS_PER_S,
    NEAR_FIELD,
    PREDICT,
    FullCloud,
    NearResult,
    Segmentation,
)
from dynshape_perception.scheduling.tiers import Tier

SPECULATE = "speculate"
TRACK = "track"
# Frames that reached tier 2 or 3 too late to change the state (a newer one came first,
# or the tracks restarted since): counted, never applied out of order.
NOT_TRACKED = "frames_not_tracked"
NOT_PREDICTED = "frames_not_predicted"
# A unit's done-callback: it hands the result on, or counts why there is none.
Deliver = Callable[[str, Callable[[Any], None]], Callable[["Future[Any]"], None]]


@dataclass(frozen=True)
class FrameInfo:
    """One input on its way through the tiers; ``context`` is the caller's (headers)."""

    stamp_s: float
    # The input's frame into the fixed frame (a pose or a 4x4 transform).
    pose: Pose2D | np.ndarray
    arrival: Arrival
    received_s: float
    generation: int
    seed: int
    context: Any = None
    # Where the vehicle is in the fixed frame, for nearest-first agents (default: ``pose``).
    ego: Pose2D | None = None

    def vehicle(self) -> Pose2D:
        if self.ego is not None:
            return self.ego
        return self.pose if isinstance(self.pose, Pose2D) else Pose2D.of(self.pose)


@dataclass(frozen=True)
class Tracked:
    """Tier 2: the obstacles (and the full cloud they came from, for lidar input) and the
    tracks (None: not tracked)."""

    obstacles: np.ndarray
    cloud: FullCloud | None
    tracks: np.ndarray | None
    track_ms: float
    revolution: Revolution | None = None
    # What ``describe`` made of the tracks, under the lock that tracked them.
    states: Any = None


@dataclass(frozen=True)
class Predicted:
    tracks: np.ndarray
    output: StageOutput
    ms: float
    states: Any = None


class TierOutputs(Protocol):
    """Where each tier's result goes: topics in a node, the run record in a replay."""

    def near(self, frame: FrameInfo, result: NearResult) -> None: ...

    def tracked(self, frame: FrameInfo, result: Tracked) -> None: ...

    def predicted(self, frame: FrameInfo, result: Predicted) -> None: ...


class SimulatedClock:
    """The executor's clock in a deterministic run: the input's stamp, still while units run.

    No unit then takes any time by the executor's measure, so none is shed or expires
    whatever the host's speed: a run gives the same outputs on any machine, at any load.
    """

    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


class PerceptionTiers:
    """Tier 1 the near field of every cloud or sector; tier 2 the full cloud of a whole
    revolution, clustered and tracked; tier 3 the prediction stage; tier 4 speculation.

    Each tier's unit is submitted when the one before it finished, with the input's
    arrival, so every deadline counts from the same instant. Sectors are grouped into
    revolutions (``sectors``; one sector per revolution is the whole-scan case). Without a
    prediction stage the tracks are not predicted; with ``track=False`` the full cloud's
    obstacles are the last result (the point cloud node).
    """

    def __init__(
        self,
        executor: TieredExecutor,
        segmentation: Segmentation,
        outputs: TierOutputs,
        deliver: Deliver,
        stage: PredictionStage | None = None,
        sectors: SectorAssembler | None = None,
        track: bool = True,
        describe: Callable[[np.ndarray], Any] | None = None,
    ) -> None:
        self.executor = executor
        self.segmentation = segmentation
        self.outputs = outputs
        self.deliver = deliver
        self.stage = stage
        self.sectors = sectors or SectorAssembler(1)
        self.track = track
        # Called with each frame's tracks while the tracker is locked (track identities that
        # a reset restarts): its result travels with the tracks to the outputs.
        self.describe = describe
        self.counts = {NOT_TRACKED: 0, NOT_PREDICTED: 0}
        # The tracker is touched by tier 2 (a lane), the stage by tier 3, and both are reset
        # from outside (a subscription); sectors by the subscription only.
        self._track_lock = threading.Lock()
        self._predict_lock = threading.Lock()
        self._generation = 0
        self._last_tracked_s = -math.inf
        self._last_predicted_s = -math.inf

    @property
    def generation(self) -> int:
        return self._generation

    def reset(self) -> None:
        """Restart tracks, predictions and the revolution in progress (a frame change)."""
        with self._track_lock, self._predict_lock:
            self.segmentation.pipeline.tracker.reset()
            if self.stage is not None:
                self.stage.reset()
            self.sectors.reset()
            self._generation += 1
            self._last_tracked_s = -math.inf
            self._last_predicted_s = -math.inf

    # -- inputs ---------------------------------------------------------------------------
    def cloud(self, points: np.ndarray, frame: FrameInfo) -> list[Revolution]:
        """A cloud (a sector, or a whole scan): its near field now, and the full cloud of
        every revolution it completes; returns those revolutions."""
        # The revolutions first, then both submissions back to back: once tier 1 runs on its
        # real-time lane, this thread waits for the GIL, and the full cloud with it.
        done = self.sectors.add(points, frame.stamp_s)
        self.executor.submit(
            self.segmentation.near_field(points),
            Tier.COLLISION,
            arrival=frame.arrival,
            name=NEAR_FIELD,
            size=int(points.shape[0]),
        ).add_done_callback(self.deliver("near field", partial(self.outputs.near, frame)))
        if not done and points.shape[0] == 0 and self.sectors.configured == 1:
            # A whole scan cropped to nothing is a frame all the same: its empty outputs say
            # so downstream, and the tracks coast through it.
            self.executor.submit(
                partial(self._empty_scan, frame),
                Tier.PLANNING,
                arrival=frame.arrival,
                name=FULL_CLOUD,
                size=0,
            ).add_done_callback(self.deliver("full cloud", partial(self._tracked, frame)))
        for revolution in done:
            # A revolution ended by the next one's first sector keeps its own last stamp.
            whole = replace(frame, stamp_s=revolution.stamp_s)
            self.executor.submit(
                partial(self._full_cloud, revolution, whole),
                Tier.PLANNING,
                arrival=frame.arrival,
                name=FULL_CLOUD,
                size=int(revolution.points.shape[0]),
            ).add_done_callback(self.deliver("full cloud", partial(self._tracked, whole)))
        return done

    def detections(self, obstacles: np.ndarray, frame: FrameInfo) -> None:
        """Obstacles from elsewhere (a detection stream): tracked at tier 2, then predicted."""
        self.executor.submit(
            partial(self._track_only, obstacles, frame),
            Tier.PLANNING,
            arrival=frame.arrival,
            name=TRACK,
            size=int(obstacles.shape[0]),
        ).add_done_callback(self.deliver("tracking", partial(self._tracked, frame)))

    # -- tier 2 ---------------------------------------------------------------------------
    def _full_cloud(
        self, revolution: Revolution, frame: FrameInfo
    ) -> Generator[None, None, Tracked]:
        # Sectors were bounded one by one; their revolution is bounded here.
        points = self.segmentation.pipeline.bound_points(revolution.points)
        cloud = yield from self.segmentation.full_cloud(points, frame.seed)
        if not self.track:
            return Tracked(cloud.obstacles, cloud, None, 0.0, revolution)
        return self._track_frame(cloud.obstacles, frame, cloud, revolution)

    def _empty_scan(self, frame: FrameInfo) -> Tracked:
        obstacles = np.zeros(0, dtype=OBSTACLE_DTYPE)
        if not self.track:
            return Tracked(obstacles, None, None, 0.0)
        return self._track_frame(obstacles, frame, None, None)

    def _track_only(self, obstacles: np.ndarray, frame: FrameInfo) -> Tracked:
        pipeline = self.segmentation.pipeline
        bound = pipeline.bounds.N
        if obstacles.shape[0] > bound:
            pipeline.dropped_detections += obstacles.shape[0] - bound
            obstacles = obstacles[:bound]
        return self._track_frame(obstacles, frame, None, None)

    def _track_frame(
        self,
        obstacles: np.ndarray,
        frame: FrameInfo,
        cloud: FullCloud | None,
        revolution: Revolution | None,
    ) -> Tracked:
        start = time.perf_counter()
        pipeline = self.segmentation.pipeline
        with self._track_lock:
            # A frame change since submission restarted the tracks; a newer frame tracked
            # first (more than one shared lane) makes this one too old to track.
            if frame.generation != self._generation or frame.stamp_s <= self._last_tracked_s:
                self.counts[NOT_TRACKED] += 1
                return Tracked(obstacles, cloud, None, 0.0, revolution)
            self._last_tracked_s = frame.stamp_s
            tracks = pipeline.track(pipeline.to_fixed_frame(obstacles, frame.pose), frame.stamp_s)
            states = self.describe(tracks) if self.describe is not None else None
        ms = (time.perf_counter() - start) * MS_PER_S
        return Tracked(obstacles, cloud, tracks, ms, revolution, states)

    def _tracked(self, frame: FrameInfo, result: Tracked) -> None:
        self.outputs.tracked(frame, result)
        if result.tracks is None or self.stage is None:
            return
        self.executor.submit(
            partial(self._predict, result.tracks, frame, result.states),
            Tier.COMFORT,
            arrival=frame.arrival,
            name=PREDICT,
            size=int(result.tracks.shape[0]),
        ).add_done_callback(self.deliver("prediction", partial(self._predicted, frame)))

    # -- tier 3 and 4 ---------------------------------------------------------------------
    def _predict(self, tracks: np.ndarray, frame: FrameInfo, states: Any) -> Predicted | None:
        assert self.stage is not None
        start = time.perf_counter()
        with self._predict_lock:
            if frame.generation != self._generation or frame.stamp_s <= self._last_predicted_s:
                self.counts[NOT_PREDICTED] += 1
                return None
            self._last_predicted_s = frame.stamp_s
            output = self.stage.predict(tracks, frame.stamp_s, frame.vehicle())
        return Predicted(tracks, output, (time.perf_counter() - start) * MS_PER_S, states)

    def _predicted(self, frame: FrameInfo, result: Predicted | None) -> None:
        if result is None:
            return
        self.outputs.predicted(frame, result)
        stage = self.stage
        if stage is not None and stage.settings.speculation:
            self.executor.submit(
                stage.speculate_chunks,
                Tier.BEST_EFFORT,
                arrival=frame.arrival,
                name=SPECULATE,
                speculative=True,
                size=int(result.output.ids.size),
            ).add_done_callback(self.deliver("speculation", _ignore))


def _ignore(_: object) -> None:
    """Speculation leaves its result in the stage; there is nothing to hand on."""
