"""The frames ``bench deadlines`` serves: a scan and the pedestrians' next step, as tiered jobs.

A scan's near-field and full-cloud jobs are the lidar nodes' own
(``scheduling.lidar_tiers.Segmentation``), one segmentation per scan source, as one per
lidar, sharing the process's plane fits.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape_perception.errors import DataError, WeightsError
from dynshape_perception.io.datasets import read_eth_ucy, read_kitti_bin
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.registry import committed_weights, parameter_shapes
from dynshape_perception.models.segmenter import P_EDGES
from dynshape_perception.models.weights import init_weights
from dynshape_perception.perception.ground import GroundPlane
from dynshape_perception.perception.pipeline import Pipeline
from dynshape_perception.perception.prediction.incremental import (
    HistoryFn,
    Prediction,
)
from dynshape_perception.perception.prediction.paths import prediction_table
from dynshape_perception.perception.prediction.speculative import (
    SpeculationConfig,
    SpeculativePredictor,
    run_to_end,
)
from dynshape_perception.perception.streaming import NearField
from dynshape_perception.perception.tracking import Tracker
from dynshape_perception.resources import shared_data_dir
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.scheduling.executor import (
    FifoExecutor,
    TieredExecutor,
    diagnostic_status,
)
from dynshape_perception.scheduling.lidar_tiers import PlaneFits, Segmentation, Undegraded
from dynshape_perception.scheduling.tiers import Tier, TierConfig
from dynshape_perception.tools.sim.scenes import driving_scene

Executor = TieredExecutor | FifoExecutor
GENERATED_SEEDS = (0, 1, 2)
DATASETS = ("eth", "hotel")
# When permitted: the tier-1 lane and the load generator under SCHED_FIFO; shared lanes
# boosted to SCHED_FIFO only while tier-1 work is pending, so that no other process
# preempts a thread holding the GIL that tier 1 waits for.
RESERVED_RT_PRIORITY = 10
SHARED_BOOST_RT_PRIORITY = 5
DIAGNOSTICS_PERIOD_S = 1.0
# Segmenter chunk candidates: bucket edges, so that every chunk hits a warm specialisation.
CHUNK_EDGES = tuple(e for e in P_EDGES if e <= 16384)


@dataclass(frozen=True)
class Job:
    fn: Callable[[], Any]
    tier: Tier
    name: str
    topic: str
    speculative: bool = False
    # Input size (points, agents): the executor estimates cost per (name, size bucket).
    size: int | None = None


@dataclass(frozen=True)
class AgentFrame:
    tick: int
    ids: np.ndarray
    positions: np.ndarray
    history_of: HistoryFn


@dataclass
class Bench:
    """What every run shares: engines, scans, agent ticks, and the sizes chosen for them."""

    fast: Engine
    main: Engine
    sources: list[tuple[str, np.ndarray]]
    planes: dict[str, GroundPlane]
    agents: dict[str, list[AgentFrame]]
    near: NearField
    # The chunk the full clouds start with, and its segmenter p50: the nodes size their
    # chunks from what the chunks they ran cost, and each run starts from this one.
    chunk_points: int
    chunk_ms: float
    tiers: TierConfig = field(default_factory=TierConfig)
    spec: SpeculationConfig = field(default_factory=SpeculationConfig)
    realtime: bool = True

    @property
    def reserved_rt(self) -> int | None:
        return RESERVED_RT_PRIORITY if self.realtime else None

    @property
    def shared_boost_rt(self) -> int | None:
        return SHARED_BOOST_RT_PRIORITY if self.realtime else None

    def agent_frame(self, dataset: str, frame: int) -> AgentFrame:
        """Frame ``frame`` of a dataset, looping; ticks keep increasing across loops."""
        frames = self.agents[dataset]
        loop, index = divmod(frame, len(frames))
        item = frames[index]
        period = frames[-1].tick + 2
        return AgentFrame(item.tick + loop * period, item.ids, item.positions, item.history_of)


class Run:
    """One run's mutable state (trackers, planes, predictors) and the jobs of each frame."""

    def __init__(self, bench: Bench, executor: Executor | None) -> None:
        self.bench = bench
        self.executor = executor
        associator = bench.main["associator"]
        self.trackers = {
            name: Tracker(lambda d, t: associator("forward", d, t)[0]) for name, _ in bench.sources
        }
        self.last_stamp = {name: float("-inf") for name, _ in bench.sources}
        pipeline = Pipeline(
            bench.main["segmenter"], bench.main["associator"], bench.main["predictor"]
        )
        lanes = executor if executor is not None else Undegraded(bench.tiers)
        fits = PlaneFits()
        self.segmentations: dict[str, Segmentation] = {}
        for name, _ in bench.sources:
            segmentation = Segmentation(
                bench.fast["segmenter"],
                bench.main["segmenter"],
                pipeline,
                bench.near,
                lanes,
                CHUNK_EDGES,
                fits,
            )
            segmentation.plane = bench.planes[name]
            segmentation.chunks.record(bench.chunk_points, bench.chunk_ms)
            self.segmentations[name] = segmentation
        self.track_lock = threading.Lock()
        self.predictors = {
            d: SpeculativePredictor(bench.main["predictor"], bench.spec) for d in DATASETS
        }
        self.agent_locks = {d: threading.Lock() for d in DATASETS}
        self.predictions: dict[str, Prediction] = {}
        self.counters: Counter[str] = Counter()
        self.last_diagnostics_s = float("-inf")

    def jobs(self, frame: int, stamp_s: float) -> list[Job]:
        name, points = self.bench.sources[frame % len(self.bench.sources)]
        agents = sum(int(self.bench.agent_frame(d, frame).ids.size) for d in DATASETS)
        return [
            Job(self._near_field(name, points), Tier.COLLISION, "near_field", "points"),
            Job(
                self._full_cloud(name, points, stamp_s, frame),
                Tier.PLANNING,
                "full_cloud",
                "points",
                size=int(points.shape[0]),
            ),
            Job(self._predict(frame), Tier.COMFORT, "predict", "agents", size=agents),
            Job(self._markers, Tier.BEST_EFFORT, "markers", "markers"),
            Job(self._speculate, Tier.BEST_EFFORT, "speculate", "agents", speculative=True),
        ]

    def _near_field(self, name: str, points: np.ndarray) -> Callable[[], int]:
        near_field = self.segmentations[name].near_field(points)

        def job() -> int:
            return int(near_field().obstacles.shape[0])

        return job

    def _full_cloud(
        self, name: str, points: np.ndarray, stamp_s: float, frame: int
    ) -> Callable[[], Generator[None, None, int]]:
        def job() -> Generator[None, None, int]:
            full = yield from self.segmentations[name].full_cloud(points, seed=frame)
            if full.far_field_subsampled:
                self.counters["far_field_subsampled"] += 1
            with self.track_lock:
                if stamp_s <= self.last_stamp[name]:
                    self.counters["tracker_out_of_order"] += 1
                    return 0
                self.last_stamp[name] = stamp_s
                tracks = self.trackers[name].update(full.obstacles, stamp_s)
            return int(tracks.shape[0])

        return job

    def _predict(self, frame: int) -> Callable[[], Generator[None, None, int]]:
        def job() -> Generator[None, None, int]:
            agents = 0
            for dataset in DATASETS:
                item = self.bench.agent_frame(dataset, frame)
                with self.agent_locks[dataset]:
                    predictor = self.predictors[dataset]
                    last = predictor.encoder.tick
                    if last is not None and item.tick <= last:
                        self.counters["agents_out_of_order"] += 1
                        continue
                    self.predictions[dataset] = predictor.observe(
                        item.tick, item.ids, item.positions, item.history_of
                    )
                agents += int(item.ids.size)
                yield
            return agents

        return job

    def _markers(self) -> int:
        rows = 0
        for prediction in list(self.predictions.values()):
            ids = prediction.ids.astype(np.uint32)
            rows += prediction_table(ids, prediction.traj, prediction.probs).shape[0]
        now = time.monotonic()
        # Diagnostics go out at about 1 Hz, as ROS diagnostics do.
        if self.executor is not None and now - self.last_diagnostics_s >= DIAGNOSTICS_PERIOD_S:
            self.last_diagnostics_s = now
            diagnostic_status(self.executor.snapshot())
        return rows

    def _speculate(self) -> Generator[None, None, int]:
        done = 0
        for predictor in self.predictors.values():
            done += yield from predictor.speculate_chunks()
        return done


def exhaust(result: Any) -> Any:
    if isinstance(result, Generator):
        return run_to_end(result)
    return result


def load_weights() -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
    """Committed weights where there are some, else the deterministic initial ones."""
    weights: dict[str, dict[str, np.ndarray]] = {}
    source: dict[str, str] = {}
    for name in MODEL_NAMES:
        try:
            weights[name] = committed_weights(name)[1]
            source[name] = "committed"
        except WeightsError:
            weights[name] = init_weights(parameter_shapes(model_definition(name)), seed=0)
            source[name] = "init_weights(seed=0): no committed weights"
    return weights, source


def load_data() -> tuple[list[tuple[str, np.ndarray]], dict[str, Any]]:
    data = shared_data_dir()
    if data is None:
        raise DataError("bench deadlines needs ../shared/data (the KITTI scan and ETH/HOTEL)")
    sources = [("kitti_000008", read_kitti_bin(data / "lidar" / "kitti_000008.bin"))]
    sources += [(f"generated_{s}", driving_scene(seed=s).points) for s in GENERATED_SEEDS]
    tracks = {
        "eth": read_eth_ucy(data / "eth_ucy" / "biwi_eth.txt").tracks(),
        "hotel": read_eth_ucy(data / "eth_ucy" / "biwi_hotel.txt").tracks(),
    }
    return sources, tracks
