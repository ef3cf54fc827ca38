"""``tracker_node``: obstacle table (or opt-in Detection3DArray) in, tracks with ids out."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from sensor_msgs.msg import PointCloud2

from dynshape_perception import parameters
from dynshape_perception.errors import ConfigError
from dynshape_perception.io.pointcloud2 import REASONS, cloud_to_table
from dynshape_perception.io.tables import OBSTACLE_DTYPE, check_box_sizes
from dynshape_perception.nodes.base import (
    INTERNAL_ERROR,
    ODOM_REASONS,
    OVER_BOUND,
    PROCESSING_ERROR,
    STALE_STAMP,
    FixedFrame,
    OdometryInput,
    PerceptionNode,
    model_not_loaded,
    output_header,
    run_node,
)
from dynshape_perception.nodes.messages import stamp_s, table_msg
from dynshape_perception.nodes.vision_input import detection3d_array_type, detections_to_obstacles
from dynshape_perception.perception.pipeline import Pipeline

MS_PER_S = 1000.0
# Tracks the tracker let go at bounds.max_tracks.
TRACKS_DROPPED = "tracks_dropped"


class TrackerNode(PerceptionNode):
    def __init__(self) -> None:
        super().__init__(
            "tracker_node",
            ("associator",),
            (*REASONS, OVER_BOUND, STALE_STAMP, PROCESSING_ERROR, INTERNAL_ERROR, *ODOM_REASONS),
        )
        self.pipeline = Pipeline(
            model_not_loaded("segmenter"),
            self.engine["associator"],
            model_not_loaded("predictor"),
            parameters.pipeline_params(self.values),
            self.bounds,
        )
        self.frame = FixedFrame(self, self.pipeline.tracker.reset)
        self.odometry = OdometryInput(self)
        self.counters[TRACKS_DROPPED] = 0
        self.tracks = self.create_publisher(PointCloud2, "tracks", self.output_qos)
        self._subscribe_input(str(self.values["tracker.input_type"]))

    def _subscribe_input(self, input_type: str) -> None:
        if input_type == parameters.TRACKER_INPUT_VISION:
            try:
                msg_type = detection3d_array_type()
            except ConfigError as err:
                self.get_logger().error(f"{err}; falling back to the obstacle table on 'obstacles'")
                self.note("input", f"obstacle table (vision_msgs unavailable: {err})", warn=True)
            else:
                self.create_subscription(msg_type, "detections", self.on_detections, self.input_qos)
                self.note("input", "vision_msgs/Detection3DArray on 'detections'")
                return
        else:
            self.note("input", "obstacle table on 'obstacles'")
        self.create_subscription(PointCloud2, "obstacles", self.on_obstacles, self.input_qos)

    def apply_parameters(self, changed: set[str]) -> None:
        self.pipeline.params = parameters.pipeline_params(self.values)
        self.pipeline.tracker.params = self.pipeline.params.tracker

    def on_obstacles(self, msg: PointCloud2) -> None:
        with self.handling("obstacles"):
            self._track(check_box_sizes(cloud_to_table(msg, OBSTACLE_DTYPE)), msg.header)

    def on_detections(self, msg: Any) -> None:
        with self.handling("detections"):
            self._track(detections_to_obstacles(msg), msg.header)

    def _track(self, obstacles: np.ndarray, header: Any) -> None:
        t0 = time.perf_counter()
        self.bounds.check("N", obstacles.shape[0], "obstacles")
        stamp = stamp_s(header.stamp)
        located = self.frame.locate(self.odometry, stamp, header.frame_id)
        if located is None:
            return
        pose, frame_id = located
        if not self.frame.admit(frame_id, stamp):
            return
        tracks = self.pipeline.track(self.pipeline.to_fixed_frame(obstacles, pose), stamp)
        self.set_counter(TRACKS_DROPPED, self.pipeline.tracker.dropped_tracks)
        t1 = time.perf_counter()
        self.tracks.publish(table_msg(tracks, output_header(header.stamp, frame_id)))
        self.count("frames_out")
        self.record_latency(
            {"track": (t1 - t0) * MS_PER_S, "total": (time.perf_counter() - t0) * MS_PER_S}
        )


def main(args: list[str] | None = None) -> int:
    return run_node(TrackerNode, args)
