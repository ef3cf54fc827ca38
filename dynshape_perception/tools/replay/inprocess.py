"""Deterministic in-process replay: bag frames through the pipeline in simulated time, no DDS."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from dynshape_perception.errors import ConfigError, DynshapeError
from dynshape_perception.io import bags
from dynshape_perception.io.objects import (
    DETECTED_OBJECTS,
    TrackStates,
    detections_to_obstacles,
    obstacles_from_detected_objects,
)
from dynshape_perception.io.pointcloud2 import cloud_to_points, cloud_to_table
from dynshape_perception.io.topics import (
    ODOM,
    POINTS,
    TF,
    TF_STATIC,
    TRUTH,
    TopicPlan,
    plan_topics,
)
from dynshape_perception.perception.localization import Localizer, Located
from dynshape_perception.perception.objects import (
    REPLAY_NAMESPACE,
    TrackUuids,
)
from dynshape_perception.perception.pipeline import Pipeline, Pose2D
from dynshape_perception.perception.prediction.paths import PredictedPaths
from dynshape_perception.perception.prediction.stage import PredictionStage
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.perception.sectors import SectorAssembler
from dynshape_perception.perception.streaming import NearField
from dynshape_perception.perception.transforms import Matrix, TransformTree
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.scheduling.executor import TieredExecutor
from dynshape_perception.scheduling.lidar_tiers import NearResult, Segmentation
from dynshape_perception.scheduling.perception_tiers import (
    FrameInfo,
    PerceptionTiers,
    Predicted,
    SimulatedClock,
    Tracked,
)
from dynshape_perception.tools.replay.metrics import FrameRecord, RunMetrics
from dynshape_perception.tools.replay.rundir import FrameOutputs, RunRecorder
from dynshape_perception.tools.replay.scoring import PredictionScore, TruthIndex
from dynshape_perception.tools.replay.settings import ReplaySettings

log = logging.getLogger(__name__)

PROGRESS_MIN_FRAMES = 50
NS = 1_000_000_000
MS_PER_S = 1000.0


@dataclass(frozen=True)
class ReplayOptions:
    topics: tuple[str, ...] | None = None
    remaps: dict[str, str] = field(default_factory=dict)
    start_offset_s: float = 0.0
    # 0: as fast as possible; R > 0: simulated time runs at most R times wall time.
    rate: float = 0.0
    loop: bool = False
    max_frames: int | None = None
    progress: bool = True
    match_radius_m: float = 2.0
    unpredicted_penalty_m: float = 2.0

    def __post_init__(self) -> None:
        for name, value in (("start offset", self.start_offset_s), ("rate", self.rate)):
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be finite and >= 0, got {value}")
        if self.max_frames is not None and self.max_frames < 1:
            raise ConfigError("max_frames must be >= 1")


@dataclass
class ReplayResult:
    bag: Path
    plan: TopicPlan
    metrics: RunMetrics
    interrupted: bool = False

    @property
    def frames(self) -> int:
        return len(self.metrics.frames)

    def summary(self) -> dict[str, Any]:
        return self.metrics.summary()


class PoseTrack:
    """The odometry path of a bag, interpolated at any stamp (end poses outside its span)."""

    def __init__(self, samples: list[tuple[int, float, float, float]]) -> None:
        kept: list[tuple[int, float, float, float]] = []
        for sample in sorted(samples):
            if not kept or sample[0] > kept[-1][0]:
                kept.append(sample)
        arr = np.asarray(kept, dtype=np.float64).reshape(-1, 4)
        self.stamps = arr[:, 0] * 1e-9
        self.x, self.y = arr[:, 1], arr[:, 2]
        self.yaw = np.unwrap(arr[:, 3]) if arr.shape[0] else arr[:, 3]

    def __len__(self) -> int:
        return int(self.stamps.size)

    def at(self, stamp_s: float) -> Pose2D:
        if not len(self):
            return Pose2D()
        x = float(np.interp(stamp_s, self.stamps, self.x))
        y = float(np.interp(stamp_s, self.stamps, self.y))
        yaw = float(np.interp(stamp_s, self.stamps, self.yaw))
        return Pose2D(x, y, math.atan2(math.sin(yaw), math.cos(yaw)))


@dataclass
class _Frame:
    log_ns: int
    stamp_ns: int
    frame_id: str
    points: np.ndarray | None = None
    obstacles: np.ndarray | None = None
    error: str | None = None


@dataclass(frozen=True)
class _Outputs:
    """One processed frame: tables, the frames they are in, what the messages add."""

    obstacles: np.ndarray
    tracks: np.ndarray
    predictions: np.ndarray
    paths: PredictedPaths
    states: TrackStates
    obstacle_frame: str
    fixed_frame: str
    # The time the predicted paths start from (None: nothing predicted).
    reference_s: float | None = None


class _Collector:
    """One input's results, as the tiers hand them over, and why any unit gave none."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.near_result: NearResult | None = None
        self.tracked_results: list[Tracked] = []
        self.predicted_results: list[Predicted] = []
        self.errors: list[str] = []

    def near(self, frame: FrameInfo, result: NearResult) -> None:
        self.near_result = result

    def tracked(self, frame: FrameInfo, result: Tracked) -> None:
        self.tracked_results.append(result)

    def predicted(self, frame: FrameInfo, result: Predicted) -> None:
        self.predicted_results.append(result)

    def deliver(self, what: str, publish: Callable[[Any], None]) -> Callable[[Future[Any]], None]:
        def done(future: Future[Any]) -> None:
            if future.cancelled():
                self.errors.append(f"{what}: cancelled")
                return
            err = future.exception()
            if err is not None:
                self.errors.append(f"{what}: {err}")
                return
            publish(future.result())

        return done


class _TierRun:
    """The nodes' tiers on one engine, driven one unit after the other in simulated time."""

    def __init__(self, engine: Engine, settings: ReplaySettings, pipeline: Pipeline) -> None:
        self.clock = SimulatedClock()
        self.executor = TieredExecutor(start=False, clock=self.clock)
        self.results = _Collector()
        segmenter = engine["segmenter"]
        # One chunk of up to the point bound: chunks only matter to a node's other tiers.
        segmentation = Segmentation(
            segmenter, segmenter, pipeline, NearField(), self.executor, (settings.bounds.P,)
        )
        self.stage = PredictionStage(engine["predictor"], settings.prediction)
        self.tiers = PerceptionTiers(
            self.executor,
            segmentation,
            self.results,
            self.results.deliver,
            self.stage,
            SectorAssembler(settings.sectors_per_revolution),
        )

    def close(self) -> None:
        self.executor.close()

    def run(
        self,
        stamp_s: float,
        to_fixed: Matrix,
        ego: Pose2D,
        seed: int,
        points: np.ndarray | None,
        obstacles: np.ndarray | None,
    ) -> _Collector:
        self.results.clear()
        self.clock.now_s = stamp_s
        frame = FrameInfo(
            stamp_s,
            to_fixed,
            self.executor.arrive("points"),
            0.0,
            self.tiers.generation,
            seed,
            ego=ego,
        )
        try:
            if points is not None:
                self.tiers.cloud(points, frame)
            else:
                assert obstacles is not None
                self.tiers.detections(obstacles, frame)
        finally:
            # Whatever was submitted before a refusal runs now, not with the next input.
            while self.executor.run_one():
                pass
        return self.results


class InProcessReplay:
    """Replays one bag through a fresh pipeline on an engine in a deterministic JIT mode.

    Frames come from the points topic (full pipeline) or, without one, from a detection
    stream (tracking and prediction). Odometry and ground truth are read ahead, so the
    pose is interpolated at each frame's stamp and prediction errors are scored online.
    """

    def __init__(self, engine: Engine, settings: ReplaySettings) -> None:
        self.engine = engine
        self.settings = settings
        self._jit_prev = (engine.metrics.calls, engine.metrics.hits)
        self._uuids = TrackUuids(REPLAY_NAMESPACE)

    def _pipeline(self) -> Pipeline:
        """The tiers' shared state: bounds, clustering and the tracker."""
        return Pipeline(
            self.engine["segmenter"],
            self.engine["associator"],
            self.engine["predictor"],
            self.settings.pipeline,
            self.settings.bounds,
        )

    def run(
        self,
        bag_path: Path,
        options: ReplayOptions,
        recorder: RunRecorder | None = None,
        run_info: dict[str, Any] | None = None,
    ) -> ReplayResult:
        metrics = RunMetrics(self.settings.deadlines_ms, dict(run_info or {}))
        self._jit_prev = (self.engine.metrics.calls, self.engine.metrics.hits)
        t0 = time.monotonic()
        earlier, seen_events = self.engine.metrics.events_since(0)
        for event in earlier:
            metrics.add_event(event, t0, -1)
        with bags.BagReader(bag_path) as reader:
            plan = plan_topics(reader.topics(), options.topics, options.remaps)
            metrics.topics = {
                "used": [vars(u) for u in plan.used.values()],
                "skipped": [vars(s) for s in plan.skipped],
            }
            result = ReplayResult(Path(bag_path), plan, metrics)
            driver = plan.driver
            if driver is None:
                return result
            poses, odom_frame = self._read_odometry(reader, plan)
            tree = self._read_transforms(reader, plan)
            localizer = Localizer(
                tree,
                self.settings.frames,
                lambda stamp_s: (poses.at(stamp_s).matrix(), odom_frame),
                lambda: len(poses) > 0,
            )
            truth = self._read_truth(reader, plan)
            pipeline = self._pipeline()
            self._uuids = TrackUuids(REPLAY_NAMESPACE)
            tier_run = _TierRun(self.engine, self.settings, pipeline)
            score = PredictionScore(
                pipeline.step_s, options.match_radius_m, options.unpredicted_penalty_m
            )
            start_ns = reader.start_at(options.start_offset_s)
            period_ns = self._period_ns(reader, driver.topic)
            span_ns = max(reader.end_ns - start_ns, 0) + period_ns
            total = None if options.loop else driver.count
            if options.max_frames is not None:
                total = min(total or options.max_frames, options.max_frames)
            short = not options.progress or (total or PROGRESS_MIN_FRAMES) < PROGRESS_MIN_FRAMES
            # disable=None shows the bar on a terminal only.
            bar = tqdm(
                total=total,
                unit="frame",
                desc=Path(bag_path).name,
                disable=True if short else None,
                leave=False,
            )
            wall0 = time.perf_counter()
            first_t: int | None = None
            index = 0
            try:
                passes = 0
                while True:
                    shift_ns = passes * span_ns
                    for frame in self._frames(reader, plan, start_ns):
                        stamp_ns = frame.stamp_ns + shift_ns
                        if first_t is None:
                            first_t = stamp_ns
                        if options.rate > 0:
                            due = (stamp_ns - first_t) * 1e-9 / options.rate
                            delay = due - (time.perf_counter() - wall0)
                            if delay > 0:
                                time.sleep(delay)
                        record = FrameRecord(
                            index=index,
                            stamp_ns=stamp_ns,
                            t_s=round((stamp_ns - first_t) * 1e-9, 6),
                            wall_s=0.0,
                        )
                        outputs = self._process(
                            pipeline, tier_run, frame, stamp_ns, localizer, record
                        )
                        if outputs is not None:
                            if recorder is not None:
                                recorder.write_frame(
                                    frame.log_ns + shift_ns,
                                    stamp_ns,
                                    FrameOutputs(
                                        outputs.obstacle_frame,
                                        outputs.fixed_frame,
                                        outputs.obstacles,
                                        outputs.states,
                                        outputs.predictions,
                                        outputs.paths,
                                        self.settings.pipeline.objects,
                                    ),
                                )
                            if len(truth):
                                matched, missed, err = score.add(
                                    truth,
                                    frame.stamp_ns,
                                    outputs.tracks,
                                    outputs.predictions,
                                    outputs.reference_s,
                                )
                                record.prediction = {
                                    "matched": matched,
                                    "unpredicted": missed,
                                    "min_ade_m": round(err / matched, 4) if matched else 0.0,
                                }
                        self._jit_state(record)
                        record.wall_s = round(time.perf_counter() - wall0, 6)
                        metrics.add_frame(record)
                        events, seen_events = self.engine.metrics.events_since(seen_events)
                        for event in events:
                            metrics.add_event(event, t0, index)
                        index += 1
                        bar.update(1)
                        if options.max_frames is not None and index >= options.max_frames:
                            break
                    passes += 1
                    done = options.max_frames is not None and index >= options.max_frames
                    if done or not options.loop or index == 0:
                        break
            except KeyboardInterrupt:
                result.interrupted = True
            finally:
                bar.close()
                tier_run.close()
            if len(truth):
                metrics.summary_extra["prediction"] = score.summary()
            metrics.summary_extra["no_odometry"] = not len(poses)
            metrics.summary_extra["fixed_frame_source"] = localizer.fixed_source()
            metrics.summary_extra["prediction_stage"] = tier_run.stage.diagnostics()
            metrics.summary_extra["sectors"] = tier_run.tiers.sectors.counters.as_dict()
            return result

    # -- reading --------------------------------------------------------------------------
    @staticmethod
    def _period_ns(reader: bags.BagReader, topic: str) -> int:
        count = next((t.count for t in reader.topics() if t.name == topic), 0)
        span = reader.end_ns - reader.start_ns
        return max(span // max(count - 1, 1), 1) if count > 1 else NS // 10

    @staticmethod
    def _read_odometry(reader: bags.BagReader, plan: TopicPlan) -> tuple[PoseTrack, str]:
        used = plan.used.get(ODOM)
        samples: list[tuple[int, float, float, float]] = []
        frame_id = ""
        if used is not None:
            for message in reader.messages([used.topic]):
                try:
                    msg = reader.deserialize(message)
                except DynshapeError as err:
                    log.warning("skipping odometry: %s", err)
                    continue
                samples.append(bags.odometry_pose(msg))
                frame_id = frame_id or str(msg.header.frame_id)
        return PoseTrack(samples), frame_id

    @staticmethod
    def _read_transforms(reader: bags.BagReader, plan: TopicPlan) -> TransformTree:
        """Every transform of the bag's /tf and /tf_static (static ones hold at all stamps)."""
        tree = TransformTree()
        for role in (TF_STATIC, TF):
            used = plan.used.get(role)
            if used is None:
                continue
            for message in reader.messages([used.topic]):
                try:
                    transforms = bags.transforms_of(reader.deserialize(message))
                    for parent, child, ns, m in transforms:
                        tree.set(parent, child, ns * 1e-9, m, static=role == TF_STATIC)
                except DynshapeError as err:
                    log.warning("skipping a transform of %s: %s", used.topic, err)
        return tree

    @staticmethod
    def _read_truth(reader: bags.BagReader, plan: TopicPlan) -> TruthIndex:
        used = plan.used.get(TRUTH)
        tables: list[tuple[int, np.ndarray]] = []
        if used is not None:
            for message in reader.messages([used.topic]):
                try:
                    msg = reader.deserialize(message)
                    table = cloud_to_table(msg, TRACK_DTYPE)
                except DynshapeError as err:
                    log.warning("skipping ground truth: %s", err)
                    continue
                tables.append((bags.stamp_ns(msg.header.stamp), table))
        return TruthIndex(tables)

    @staticmethod
    def _frames(reader: bags.BagReader, plan: TopicPlan, start_ns: int) -> Iterator[_Frame]:
        driver = plan.driver
        assert driver is not None
        for message in reader.messages([driver.topic], start_ns=start_ns):
            try:
                msg = reader.deserialize(message)
            except DynshapeError as err:
                yield _Frame(message.log_ns, message.log_ns, "", error=str(err))
                continue
            stamp = bags.stamp_ns(msg.header.stamp) or message.log_ns
            frame = _Frame(message.log_ns, stamp, str(msg.header.frame_id))
            try:
                if driver.role == POINTS:
                    frame.points = cloud_to_points(msg).xyzi
                elif driver.msgtype == bags.DETECTION3D_ARRAY:
                    frame.obstacles = detections_to_obstacles(msg)
                elif driver.msgtype == DETECTED_OBJECTS:
                    frame.obstacles = obstacles_from_detected_objects(msg)
                else:
                    frame.obstacles = cloud_to_table(msg, OBSTACLE_DTYPE)
            except DynshapeError as err:
                frame.error = str(err)
            yield frame

    # -- processing -----------------------------------------------------------------------
    def _process(
        self,
        pipeline: Pipeline,
        tier_run: _TierRun,
        frame: _Frame,
        stamp_ns: int,
        localizer: Localizer,
        record: FrameRecord,
    ) -> _Outputs | None:
        """One input through the tiers; its outputs once a revolution is done (None:
        dropped, or a sector that ends none)."""
        before = (pipeline.dropped_detections, int(tier_run.stage.counters.agents_dropped))
        results = None
        obstacle_frame = fixed_frame = ""
        if frame.error is None:
            bag_s = frame.stamp_ns * 1e-9
            base = self.settings.frames.base_frame
            try:
                points = None
                if frame.points is not None:
                    mount = localizer.mount(frame.frame_id, bag_s)
                    located = self._locate(localizer, base, bag_s)
                    points, removed = pipeline.prepare(frame.points, mount)
                    record.counts.update({**removed, "points": int(points.shape[0])})
                    obstacle_frame, ego = base, Pose2D.of(located.to_fixed)
                else:
                    located = self._locate(localizer, frame.frame_id, bag_s)
                    obstacle_frame, ego = frame.frame_id, Pose2D.of(located.vehicle)
                fixed_frame = located.fixed_frame
                results = tier_run.run(
                    stamp_ns * 1e-9, located.to_fixed, ego, record.index, points, frame.obstacles
                )
            except DynshapeError as err:
                frame.error = str(err)
            if results is not None and results.errors:
                frame.error = "; ".join(results.errors)
        if frame.error is not None or results is None:
            record.drop_reason = frame.error
            record.dropped = {"1": 1}
            return None
        latency: dict[str, float] = {}
        if results.near_result is not None:
            latency["near_field"] = results.near_result.ms
            record.counts["near_obstacles"] = int(results.near_result.obstacles.shape[0])
        record.dropped = {
            "2": pipeline.dropped_detections - before[0],
            "3": int(tier_run.stage.counters.agents_dropped) - before[1],
        }
        if not results.tracked_results:
            record.latency_ms = latency
            return None
        # A sector that ends two revolutions (one cut short by a lost sector): the newest.
        tracked = results.tracked_results[-1]
        if tracked.cloud is not None:
            latency.update(tracked.cloud.latency_ms)
        latency["track"] = tracked.track_ms
        tracks = tracked.tracks if tracked.tracks is not None else np.zeros(0, TRACK_DTYPE)
        predicted = results.predicted_results[-1] if results.predicted_results else None
        step_s = tier_run.stage.settings.step_s
        if predicted is not None:
            latency["predict"] = predicted.ms
            paths = predicted.output.paths(step_s)
        else:
            paths = PredictedPaths.empty(step_s)
        latency["total"] = sum(latency.values())
        record.latency_ms = latency
        table = paths.table()
        record.counts.update(
            {
                "obstacles": int(tracked.obstacles.shape[0]),
                "tracks": int(tracks.shape[0]),
                "agents": int(paths.ids.size),
                "predictions": int(table.shape[0]),
            }
        )
        reference = predicted.output.reference_s if predicted is not None else None
        return _Outputs(
            tracked.obstacles,
            tracks,
            table,
            paths,
            TrackStates.of_tracker(tracks, pipeline.tracker, self._uuids),
            obstacle_frame,
            fixed_frame,
            reference,
        )

    @staticmethod
    def _locate(localizer: Localizer, frame_id: str, stamp_s: float) -> Located:
        located = localizer.locate(frame_id, stamp_s)
        if located is None:
            raise ConfigError(f"no pose of {frame_id!r} at {stamp_s:.6f} s")
        return located

    def _jit_state(self, record: FrameRecord) -> None:
        m = self.engine.metrics
        record.jit_calls = m.calls - self._jit_prev[0]
        record.jit_hits = m.hits - self._jit_prev[1]
        record.hit_rate = round(m.hit_rate, 4)
        self._jit_prev = (m.calls, m.hits)
