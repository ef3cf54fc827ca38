"""``perception_pipeline``: points in; obstacles, tracks, predictions, markers out; one process."""

from __future__ import annotations

import time

from sensor_msgs.msg import PointCloud2
from visualization_msgs.msg import MarkerArray

from dynshape_perception.core.perception.pipeline import Pipeline
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.nodes import params as P
from dynshape_perception.nodes.base import (
    ODOM_REASONS,
    POINT_COUNTERS,
    POINT_REASONS,
    STALE_STAMP,
    FixedFrame,
    OdometryInput,
    PerceptionNode,
    output_header,
    run_node,
)
from dynshape_perception.nodes.messages import marker_array, stamp_s, table_msg

MS_PER_S = 1000.0


class PerceptionPipelineNode(PerceptionNode):
    """All stages on the arrays in memory: nothing is serialised between them."""

    def __init__(self) -> None:
        super().__init__(
            "perception_pipeline", MODEL_NAMES, (*POINT_REASONS, STALE_STAMP, *ODOM_REASONS)
        )
        self.pipeline = Pipeline(
            self.engine["segmenter"],
            self.engine["associator"],
            self.engine["predictor"],
            P.pipeline_params(self.values),
            self.bounds,
        )
        self.counters.update(POINT_COUNTERS)
        self.frame = FixedFrame(self, self.pipeline.tracker.reset)
        self.odometry = OdometryInput(self)
        self.obstacles = self.create_publisher(PointCloud2, "obstacles", self.output_qos)
        self.tracks = self.create_publisher(PointCloud2, "tracks", self.output_qos)
        self.predictions = self.create_publisher(PointCloud2, "predictions", self.output_qos)
        self.markers = self.create_publisher(MarkerArray, "markers", self.output_qos)
        self.create_subscription(PointCloud2, "points", self.on_points, self.input_qos)

    def apply_parameters(self, changed: set[str]) -> None:
        self.pipeline.params = P.pipeline_params(self.values)
        self.pipeline.tracker.params = self.pipeline.params.tracker

    def on_points(self, msg: PointCloud2) -> None:
        with self.handling("points"):
            t0 = time.perf_counter()
            points = self.points_of(msg, self.pipeline)
            stamp = stamp_s(msg.header.stamp)
            pose, frame_id = self.odometry.pose_at(stamp, msg.header.frame_id)
            if not self.frame.admit(frame_id, stamp):
                return
            t1 = time.perf_counter()
            result = self.pipeline.process(points, stamp, pose)
            fixed = output_header(msg.header.stamp, frame_id)
            self.obstacles.publish(table_msg(result.obstacles, msg.header))
            self.tracks.publish(table_msg(result.tracks, fixed))
            self.predictions.publish(table_msg(result.predictions, fixed))
            self.markers.publish(
                marker_array(result.tracks, result.predictions, fixed, self.marker_style())
            )
            self.counters["frames_out"] += 1
            self.record_latency(
                {
                    "convert": (t1 - t0) * MS_PER_S,
                    **result.latency_ms,
                    "total": (time.perf_counter() - t0) * MS_PER_S,
                }
            )


def main(args: list[str] | None = None) -> int:
    return run_node(PerceptionPipelineNode, args)
