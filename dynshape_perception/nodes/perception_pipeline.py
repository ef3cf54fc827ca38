"""``perception_pipeline``: points in; all outputs from one process, through the tiered executor."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import numpy as np
from autoware_perception_msgs.msg import DetectedObjects, PredictedObjects, TrackedObjects
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header

from dynshape_perception import parameters
from dynshape_perception.io.objects import TrackStates, predicted_objects, tracked_objects
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.nodes import diagnostics as diag
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
    marker_bytes,
    stamp_ns,
    stamp_s,
    table_msg,
)
from dynshape_perception.nodes.segmenting import SegmentingNode
from dynshape_perception.perception.objects import TrackUuids
from dynshape_perception.perception.pipeline import Pipeline
from dynshape_perception.perception.prediction.stage import PredictionStage
from dynshape_perception.perception.sectors import SectorAssembler
from dynshape_perception.scheduling.lidar_tiers import MARKERS, MS_PER_S, NearResult
from dynshape_perception.scheduling.perception_tiers import (
    NOT_PREDICTED,
    FrameInfo,
    PerceptionTiers,
    Predicted,
    Tracked,
)
from dynshape_perception.scheduling.tiers import Tier

NOT_TRACKED = "frames_not_tracked"
# Truncations at the bounds: tracks at bounds.max_tracks, agents at bounds.max_agents.
TRACKS_DROPPED = "tracks_dropped"
AGENTS_DROPPED = "agents_dropped"


@dataclass(frozen=True)
class Heads:
    """The headers of one input's outputs: vehicle frame (obstacles), fixed frame (tracks)."""

    vehicle: Header
    fixed: Header


class PerceptionPipelineNode(SegmentingNode):
    """All stages on the arrays in memory: nothing is serialised between them.

    The core's tiers (``PerceptionTiers``, as in-process replay runs them): tier 1
    publishes ``near_objects`` per cloud or sector; tier 2 (full cloud of a revolution,
    clustering, tracking) ``detected_objects`` and ``tracked_objects``; tier 3 (the
    prediction stage) ``predicted_objects``; tier 4 speculation and ``markers`` (and each
    its debug table, if asked). Each tier's unit is submitted when the one before it
    finished, with the input's arrival, so every deadline counts from the same instant.
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
        self.counters[NOT_PREDICTED] = 0
        self.counters[TRACKS_DROPPED] = 0
        self.counters[AGENTS_DROPPED] = 0
        self.uuids = TrackUuids()
        self.stage = PredictionStage(
            self.engine["predictor"], parameters.prediction_settings(self.values)
        )
        self.tiers = PerceptionTiers(
            self.scheduler,
            self.segmentation,
            _Outputs(self),
            self.deliver,
            self.stage,
            SectorAssembler(parameters.sectors_per_revolution(self.values)),
            describe=self._states,
        )
        self.frame = FixedFrame(self, self._reset_tracks)
        self.detected = self.output(DetectedObjects, "detected_objects")
        self.tracked = self.output(TrackedObjects, "tracked_objects")
        self.predicted = self.output(PredictedObjects, "predicted_objects")
        tables = self.tables
        self.obstacles = self.output(PointCloud2, "obstacles") if tables else None
        self.tracks = self.output(PointCloud2, "tracks") if tables else None
        self.predictions = self.output(PointCloud2, "predictions") if tables else None
        self.markers = self.marker_output()
        self.diagnostics.add_task(diag.PREDICTION, self.report_prediction)
        self.report_sectors(self.tiers.sectors)
        self.subscribe(PointCloud2, "points", self.on_points, raw=True)

    def apply_parameters(self, changed: set[str]) -> None:
        super().apply_parameters(changed)
        self.pipeline.tracker.params = self.pipeline.params.tracker
        if any(name.startswith("prediction.") for name in changed):
            self.stage.update_settings(parameters.prediction_settings(self.values))

    def _reset_tracks(self) -> None:
        self.tiers.reset()
        self.uuids.reset()

    def _states(self, tracks: np.ndarray) -> TrackStates:
        """The tracks as the messages carry them (called under the tracker's lock)."""
        return TrackStates.of_tracker(tracks, self.pipeline.tracker, self.uuids)

    def on_points(self, data: bytes) -> None:
        with self.handling("points"):
            t0 = time.perf_counter()
            delivery = self.delivery()
            points, head = self.vehicle_points(data)
            stamp = stamp_s(head.stamp)
            located = self.frame.place(self.pose, self.base_frame, stamp)
            # Sectors of one revolution may share its stamp, as pointcloud_node takes them.
            sectors = self.tiers.sectors.configured != 1
            if located is None or not self.frame.admit(located.fixed_frame, stamp, sectors):
                return
            arrival = self.scheduler.arrive("points", stamp)
            convert_ms = (time.perf_counter() - t0) * MS_PER_S
            frame = FrameInfo(
                stamp,
                located.to_fixed,
                arrival,
                t0,
                self.tiers.generation,
                self.next_seed(),
                Heads(head, output_header(head.stamp, located.fixed_frame)),
            )
            self.tiers.cloud(points, frame)
            # After the lanes have their work: they need not wait for the debug topics.
            self.record_latency({**delivery, "convert": convert_ms})

    # -- what the tiers give --------------------------------------------------------------
    def on_near(self, frame: FrameInfo, result: NearResult) -> None:
        self._publish_near(frame.context.vehicle, result)

    def on_tracked(self, frame: FrameInfo, result: Tracked) -> None:
        heads: Heads = frame.context
        self.publish_obstacles(self.detected, self.obstacles, heads.vehicle, result.obstacles)
        try:
            self._publish_tracked(heads, result)
        finally:
            # After the outputs, which then wait for none of it.
            self.set_counter(NOT_TRACKED, self.tiers.counts[NOT_TRACKED])
            stages: dict[str, float] = {}
            if result.cloud is not None:
                self.count_full_cloud(result.cloud)
                stages.update(result.cloud.latency_ms)
            if result.states is not None:
                stages["track"] = result.track_ms
            if stages:
                # With tracks, the prediction's outputs are the frame's last.
                self.record_latency(stages, flush=result.tracks is None)

    def _publish_tracked(self, heads: Heads, result: Tracked) -> None:
        states: TrackStates | None = result.states
        if states is None:
            return
        ns = stamp_ns(heads.fixed.stamp)
        objects = self.pipeline.params.objects
        self.tracked.publish_serialized(
            tracked_objects(ns, heads.fixed.frame_id, states, objects), heads.fixed.stamp
        )
        if self.tracks is not None:
            self.tracks.publish(table_msg(states.tracks, heads.fixed))
        self.set_counter(TRACKS_DROPPED, self.pipeline.tracker.dropped_tracks)
        self.count("frames_out")

    def on_predicted(self, frame: FrameInfo, result: Predicted) -> None:
        heads: Heads = frame.context
        states: TrackStates = result.states
        paths = result.output.paths(self.stage.settings.step_s)
        ns = stamp_ns(heads.fixed.stamp)
        objects = self.pipeline.params.objects
        self.predicted.publish_serialized(
            predicted_objects(ns, heads.fixed.frame_id, states, paths, objects), heads.fixed.stamp
        )
        self.set_counter(AGENTS_DROPPED, self.stage.counters.agents_dropped)
        self.set_counter(NOT_PREDICTED, self.tiers.counts[NOT_PREDICTED])
        self.record_latency(
            {"predict": result.ms, "total": (time.perf_counter() - frame.received_s) * MS_PER_S},
            flush=True,
        )
        markers = self.markers_to_build(self.markers)
        if self.predictions is None and markers is None:
            return
        # The rows only the debug table and the markers read.
        table = paths.table()
        if self.predictions is not None:
            self.predictions.publish(table_msg(table, heads.fixed))
        if markers is None:
            return
        self.scheduler.submit(
            partial(marker_bytes, states.tracks, table, heads.fixed, self.marker_style()),
            Tier.BEST_EFFORT,
            arrival=frame.arrival,
            name=MARKERS,
            size=states.tracks.shape[0],
        ).add_done_callback(
            self.deliver("markers", partial(markers.publish_serialized, stamp=heads.fixed.stamp))
        )

    # -- diagnostics ----------------------------------------------------------------------
    def report_prediction(self) -> diag.Report:
        return diag.prediction_report(self.stage)


class _Outputs:
    """The tiers' results, handed to the node that publishes them."""

    def __init__(self, node: PerceptionPipelineNode) -> None:
        self.near = node.on_near
        self.tracked = node.on_tracked
        self.predicted = node.on_predicted


def main(args: list[str] | None = None) -> int:
    return run_node(PerceptionPipelineNode, args)
