"""``pointcloud_node``: lidar points in, obstacle table (sensor frame) out."""

from __future__ import annotations

import time

from sensor_msgs.msg import PointCloud2

from dynshape_perception.core.perception.pipeline import Pipeline
from dynshape_perception.nodes import params as P
from dynshape_perception.nodes.base import (
    POINT_COUNTERS,
    POINT_REASONS,
    PerceptionNode,
    model_not_loaded,
    run_node,
)
from dynshape_perception.nodes.messages import table_msg

MS_PER_S = 1000.0


class PointcloudNode(PerceptionNode):
    def __init__(self) -> None:
        super().__init__("pointcloud_node", ("segmenter",), POINT_REASONS)
        self.pipeline = Pipeline(
            self.engine["segmenter"],
            model_not_loaded("associator"),
            model_not_loaded("predictor"),
            P.pipeline_params(self.values),
            self.bounds,
        )
        self.counters.update(POINT_COUNTERS)
        self.obstacles = self.create_publisher(PointCloud2, "obstacles", self.output_qos)
        self.create_subscription(PointCloud2, "points", self.on_points, self.input_qos)

    def apply_parameters(self, changed: set[str]) -> None:
        self.pipeline.params = P.pipeline_params(self.values)

    def on_points(self, msg: PointCloud2) -> None:
        with self.handling("points"):
            t0 = time.perf_counter()
            points = self.points_of(msg, self.pipeline)
            t1 = time.perf_counter()
            scores, _, ground = self.pipeline.segment(points)
            t2 = time.perf_counter()
            obstacles = self.pipeline.detect(points, scores, ground)
            t3 = time.perf_counter()
            self.obstacles.publish(table_msg(obstacles, msg.header))
            self.counters["frames_out"] += 1
            self.record_latency(
                {
                    "convert": (t1 - t0) * MS_PER_S,
                    "segment": (t2 - t1) * MS_PER_S,
                    "cluster": (t3 - t2) * MS_PER_S,
                    "total": (time.perf_counter() - t0) * MS_PER_S,
                }
            )


def main(args: list[str] | None = None) -> int:
    return run_node(PointcloudNode, args)
