"""``perception_pipeline``: points in; all outputs from one process, through the tiered executor."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from functools import partial

import numpy as np
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray

from dynshape_perception import parameters
from dynshape_perception.io.tables import PREDICTION_DTYPE
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.nodes.base import (
    ODOM_REASONS,
    POINT_COUNTERS,
    POINT_REASONS,
    STALE_STAMP,
    FixedFrame,
    OdometryInput,
    output_header,
    run_node,
)
from dynshape_perception.nodes.messages import marker_array, stamp_s, table_msg
from dynshape_perception.nodes.segmenting import SegmentingNode
from dynshape_perception.perception.pipeline import Pipeline, Pose2D, prediction_table
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
    """One cloud on its way through the tiers."""

    sensor: Header
    fixed: Header
    stamp_s: float
    pose: Pose2D
    arrival: Arrival
    received_s: float
    generation: int


@dataclass(frozen=True)
class Tracked:
    """Tier 2's result: the cloud's obstacles, the tracks (None: not tracked), the histories."""

    cloud: FullCloud
    tracks: np.ndarray | None
    ids: np.ndarray
    histories: list[np.ndarray]
    track_ms: float


class PerceptionPipelineNode(SegmentingNode):
    """All stages on the arrays in memory: nothing is serialised between them.

    Tier 1 publishes ``near_obstacles``; tier 2 (full cloud, clustering, tracking)
    ``obstacles`` and ``tracks``; tier 3 ``predictions``; tier 4 ``markers``. Each tier's
    unit is submitted when the one before it finished, with the frame's arrival, so every
    deadline counts from the same instant.
    """

    def __init__(self) -> None:
        super().__init__(
            "perception_pipeline", MODEL_NAMES, (*POINT_REASONS, STALE_STAMP, *ODOM_REASONS)
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
        self.frame = FixedFrame(self, self._reset_tracks)
        self.odometry = OdometryInput(self)
        self.obstacles = self.create_publisher(PointCloud2, "obstacles", self.output_qos)
        self.tracks = self.create_publisher(PointCloud2, "tracks", self.output_qos)
        self.predictions = self.create_publisher(PointCloud2, "predictions", self.output_qos)
        self.markers = self.create_publisher(MarkerArray, "markers", self.output_qos)
        self.create_subscription(PointCloud2, "points", self.on_points, self.input_qos)

    def apply_parameters(self, changed: set[str]) -> None:
        super().apply_parameters(changed)
        self.pipeline.tracker.params = self.pipeline.params.tracker

    def _reset_tracks(self) -> None:
        with self._track_lock:
            self.pipeline.tracker.reset()
            self._generation += 1
            self._last_tracked_s = float("-inf")

    def on_points(self, msg: PointCloud2) -> None:
        with self.handling("points"):
            t0 = time.perf_counter()
            points = self.points_of(msg, self.pipeline)
            stamp = stamp_s(msg.header.stamp)
            located = self.frame.locate(self.odometry, stamp, msg.header.frame_id)
            if located is None:
                return
            pose, frame_id = located
            if not self.frame.admit(frame_id, stamp):
                return
            arrival = self.scheduler.arrive("points", stamp)
            self.record_latency({"convert": (time.perf_counter() - t0) * MS_PER_S})
            frame = Frame(
                msg.header,
                output_header(msg.header.stamp, frame_id),
                stamp,
                pose,
                arrival,
                t0,
                self._generation,
            )
            self.submit_near_field(points, msg.header, arrival)
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
            fixed = pipeline.to_fixed_frame(cloud.obstacles, frame.pose)
            tracks = pipeline.track(fixed, frame.stamp_s)
            ids, histories = pipeline.agent_histories(tracks, frame.pose)
        return Tracked(cloud, tracks, ids, histories, (time.perf_counter() - start) * MS_PER_S)

    def _publish_tracks(self, frame: Frame, result: Tracked) -> None:
        self.obstacles.publish(table_msg(result.cloud.obstacles, frame.sensor))
        self.count_full_cloud(result.cloud)
        if result.tracks is None:
            return
        self.tracks.publish(table_msg(result.tracks, frame.fixed))
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
            self.deliver("prediction", partial(self._publish_predictions, frame, result.tracks))
        )

    # -- tier 3 ------------------------------------------------------------------------
    def _predict(
        self, ids: np.ndarray, histories: list[np.ndarray]
    ) -> Generator[None, None, tuple[np.ndarray, float]]:
        if ids.size == 0:
            return np.zeros(0, dtype=PREDICTION_DTYPE), 0.0
        start = time.perf_counter()
        with self._predict_lock:
            state = self.pipeline.batcher.encode(histories)
        encode_ms = (time.perf_counter() - start) * MS_PER_S
        yield
        start = time.perf_counter()
        traj, probs = self.engine["predictor"]("decode", *state)
        table = prediction_table(ids, traj, probs)
        return table, encode_ms + (time.perf_counter() - start) * MS_PER_S

    def _publish_predictions(
        self, frame: Frame, tracks: np.ndarray, result: tuple[np.ndarray, float]
    ) -> None:
        predictions, predict_ms = result
        self.predictions.publish(table_msg(predictions, frame.fixed))
        self.record_latency(
            {"predict": predict_ms, "total": (time.perf_counter() - frame.received_s) * MS_PER_S}
        )
        self.scheduler.submit(
            partial(marker_array, tracks, predictions, frame.fixed, self.marker_style()),
            Tier.BEST_EFFORT,
            arrival=frame.arrival,
            name=MARKERS,
            size=tracks.shape[0],
        ).add_done_callback(self.deliver("markers", self.markers.publish))


def main(args: list[str] | None = None) -> int:
    return run_node(PerceptionPipelineNode, args)
