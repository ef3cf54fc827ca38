"""``perception_pipeline``: points in; all outputs from one process, through the tiered executor."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from functools import partial

import numpy as np
from autoware_perception_msgs.msg import DetectedObjects, PredictedObjects, TrackedObjects
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray

from dynshape_perception import parameters
from dynshape_perception.io.objects import TrackStates, predicted_objects, tracked_objects
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.nodes.base import (
    ODOM_REASONS,
    POINT_COUNTERS,
    POINT_REASONS,
    STALE_STAMP,
    FixedFrame,
    output_header,
    run_node,
)
from dynshape_perception.nodes.messages import (
    marker_array,
    ros_message,
    stamp_ns,
    stamp_s,
    table_msg,
)
from dynshape_perception.nodes.segmenting import SegmentingNode
from dynshape_perception.perception.objects import TrackUuids, existence_probability
from dynshape_perception.perception.pipeline import Pipeline, Pose2D
from dynshape_perception.perception.prediction import PredictedPaths
from dynshape_perception.perception.transforms import Matrix
from dynshape_perception.scheduling.executor import Arrival
from dynshape_perception.scheduling.lidar_tiers import (
    FULL_CLOUD,
    MARKERS,
    MS_PER_S,
    PREDICT,
    FullCloud,
)
from dynshape_perception.scheduling.tiers import Tier

NOT_TRACKED = "frames_not_tracked"
# Truncations at the bounds: tracks at bounds.max_tracks, agents at bounds.max_agents.
TRACKS_DROPPED = "tracks_dropped"
AGENTS_DROPPED = "agents_dropped"


@dataclass(frozen=True)
class Frame:
    """One cloud on its way through the tiers: its vehicle-frame and fixed-frame headers,
    and the transform between them at its stamp."""

    vehicle: Header
    fixed: Header
    stamp_s: float
    to_fixed: Matrix
    arrival: Arrival
    received_s: float
    generation: int


@dataclass(frozen=True)
class Tracked:
    """Tier 2's result: the cloud's obstacles, the tracks (None: not tracked) as the
    messages carry them, and the histories to predict."""

    cloud: FullCloud
    states: TrackStates | None
    ids: np.ndarray
    histories: list[np.ndarray]
    track_ms: float


class PerceptionPipelineNode(SegmentingNode):
    """All stages on the arrays in memory: nothing is serialised between them.

    Tier 1 publishes ``near_objects``; tier 2 (full cloud, clustering, tracking)
    ``detected_objects`` and ``tracked_objects``; tier 3 ``predicted_objects``; tier 4
    ``markers`` (and each its debug table, if asked). Each tier's unit is submitted when the
    one before it finished, with the frame's arrival, so every deadline counts from the
    same instant. The predictor runs in one place: the pipeline's ``PredictionStage``.
    """

    def __init__(self) -> None:
        super().__init__(
            "perception_pipeline",
            MODEL_NAMES,
            (*POINT_REASONS, STALE_STAMP, *ODOM_REASONS),
            odometry=True,
        )
        self.setup_segmentation(
            Pipeline(
                self.engine["segmenter"],
                self.engine["associator"],
                self.engine["predictor"],
                parameters.pipeline_params(self.values),
                self.bounds,
            )
        )
        self.counters.update(POINT_COUNTERS)
        self.counters[NOT_TRACKED] = 0
        self.counters[TRACKS_DROPPED] = 0
        self.counters[AGENTS_DROPPED] = 0
        # The tracker's state is touched by tier 2 (a lane) and reset by a frame change
        # (the subscription); the history batcher's statistics by tier 3 units.
        self._track_lock = threading.Lock()
        self._predict_lock = threading.Lock()
        self._generation = 0
        self._last_tracked_s = float("-inf")
        self.uuids = TrackUuids()
        self.frame = FixedFrame(self, self._reset_tracks)
        self.detected = self.output(DetectedObjects, "detected_objects")
        self.tracked = self.output(TrackedObjects, "tracked_objects")
        self.predicted = self.output(PredictedObjects, "predicted_objects")
        tables = self.tables
        self.obstacles = self.output(PointCloud2, "obstacles") if tables else None
        self.tracks = self.output(PointCloud2, "tracks") if tables else None
        self.predictions = self.output(PointCloud2, "predictions") if tables else None
        markers = bool(self.values["debug.publish_markers"])
        self.markers = self.output(MarkerArray, "markers", stamped=False) if markers else None
        self.subscribe(PointCloud2, "points", self.on_points)

    def apply_parameters(self, changed: set[str]) -> None:
        super().apply_parameters(changed)
        self.pipeline.tracker.params = self.pipeline.params.tracker

    def _reset_tracks(self) -> None:
        with self._track_lock:
            self.pipeline.tracker.reset()
            self.uuids.reset()
            self._generation += 1
            self._last_tracked_s = float("-inf")

    def on_points(self, msg: PointCloud2) -> None:
        with self.handling("points"):
            t0 = time.perf_counter()
            points, head = self.vehicle_points(msg)
            stamp = stamp_s(msg.header.stamp)
            located = self.frame.place(self.pose, self.base_frame, stamp)
            if located is None or not self.frame.admit(located.fixed_frame, stamp):
                return
            arrival = self.scheduler.arrive("points", stamp)
            self.record_latency({"convert": (time.perf_counter() - t0) * MS_PER_S})
            frame = Frame(
                head,
                output_header(msg.header.stamp, located.fixed_frame),
                stamp,
                located.to_fixed,
                arrival,
                t0,
                self._generation,
            )
            self.submit_near_field(points, head, arrival)
            self.scheduler.submit(
                partial(self._full_cloud, points, frame, self.next_seed()),
                Tier.PLANNING,
                arrival=arrival,
                name=FULL_CLOUD,
                size=points.shape[0],
            ).add_done_callback(self.deliver("full cloud", partial(self._publish_tracks, frame)))

    # -- tier 2 ------------------------------------------------------------------------
    def _full_cloud(
        self, points: np.ndarray, frame: Frame, seed: int
    ) -> Generator[None, None, Tracked]:
        cloud = yield from self.segmentation.full_cloud(points, seed)
        start = time.perf_counter()
        pipeline = self.pipeline
        with self._track_lock:
            # A frame change since submission restarted the tracks; a newer frame tracked
            # first (more than one shared lane) makes this one too old to track.
            if frame.generation != self._generation or frame.stamp_s <= self._last_tracked_s:
                self.count(NOT_TRACKED)
                return Tracked(cloud, None, np.zeros(0, np.uint32), [], 0.0)
            self._last_tracked_s = frame.stamp_s
            fixed = pipeline.to_fixed_frame(cloud.obstacles, frame.to_fixed)
            tracks = pipeline.track(fixed, frame.stamp_s)
            tracker = pipeline.tracker
            states = TrackStates(
                tracks,
                self.uuids.of(tracks["id"]),
                existence_probability(
                    tracker.hits, tracker.missed, tracker.params.max_missed_frames
                ),
                tracker.missed,
            )
            ids, histories = pipeline.agent_histories(tracks, Pose2D.of(frame.to_fixed))
        return Tracked(cloud, states, ids, histories, (time.perf_counter() - start) * MS_PER_S)

    def _publish_tracks(self, frame: Frame, result: Tracked) -> None:
        self.publish_obstacles(self.detected, self.obstacles, frame.vehicle, result.cloud.obstacles)
        self.count_full_cloud(result.cloud)
        states = result.states
        if states is None:
            return
        ns = stamp_ns(frame.fixed.stamp)
        objects = self.pipeline.params.objects
        self.tracked.publish(
            tracked_objects(ros_message, ns, frame.fixed.frame_id, states, objects)
        )
        if self.tracks is not None:
            self.tracks.publish(table_msg(states.tracks, frame.fixed))
        self.set_counter(TRACKS_DROPPED, self.pipeline.tracker.dropped_tracks)
        self.set_counter(AGENTS_DROPPED, self.pipeline.dropped_agents)
        self.count("frames_out")
        self.record_latency({**result.cloud.latency_ms, "track": result.track_ms})
        self.scheduler.submit(
            partial(self._predict, result.ids, result.histories),
            Tier.COMFORT,
            arrival=frame.arrival,
            name=PREDICT,
            size=result.ids.size,
        ).add_done_callback(
            self.deliver("prediction", partial(self._publish_predictions, frame, states))
        )

    # -- tier 3 ------------------------------------------------------------------------
    def _predict(
        self, ids: np.ndarray, histories: list[np.ndarray]
    ) -> Generator[None, None, tuple[PredictedPaths, float]]:
        stage = self.pipeline.prediction
        if ids.size == 0:
            return PredictedPaths.empty(stage.step_s), 0.0
        start = time.perf_counter()
        with self._predict_lock:
            state = stage.encode(histories)
        encode_ms = (time.perf_counter() - start) * MS_PER_S
        yield
        start = time.perf_counter()
        paths = stage.decode(ids, state)
        return paths, encode_ms + (time.perf_counter() - start) * MS_PER_S

    def _publish_predictions(
        self, frame: Frame, states: TrackStates, result: tuple[PredictedPaths, float]
    ) -> None:
        paths, predict_ms = result
        ns = stamp_ns(frame.fixed.stamp)
        objects = self.pipeline.params.objects
        self.predicted.publish(
            predicted_objects(ros_message, ns, frame.fixed.frame_id, states, paths, objects)
        )
        table = paths.table()
        if self.predictions is not None:
            self.predictions.publish(table_msg(table, frame.fixed))
        self.record_latency(
            {"predict": predict_ms, "total": (time.perf_counter() - frame.received_s) * MS_PER_S}
        )
        if self.markers is None:
            return
        self.scheduler.submit(
            partial(marker_array, states.tracks, table, frame.fixed, self.marker_style()),
            Tier.BEST_EFFORT,
            arrival=frame.arrival,
            name=MARKERS,
            size=states.tracks.shape[0],
        ).add_done_callback(self.deliver("markers", self.markers.publish))


def main(args: list[str] | None = None) -> int:
    return run_node(PerceptionPipelineNode, args)
