"""``pointcloud_node``: lidar points in; near-field (tier 1) and all obstacles (tier 2) out."""

from __future__ import annotations

import time
from functools import partial

from autoware_perception_msgs.msg import DetectedObjects
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header

from dynshape_perception import parameters
from dynshape_perception.nodes.base import (
    POINT_COUNTERS,
    POINT_REASONS,
    model_not_loaded,
    run_node,
)
from dynshape_perception.nodes.messages import stamp_s
from dynshape_perception.nodes.segmenting import SegmentingNode
from dynshape_perception.perception.pipeline import Pipeline
from dynshape_perception.scheduling.lidar_tiers import FULL_CLOUD, MS_PER_S, FullCloud
from dynshape_perception.scheduling.tiers import Tier


class PointcloudNode(SegmentingNode):
    def __init__(self) -> None:
        super().__init__("pointcloud_node", ("segmenter",), POINT_REASONS)
        pipeline = Pipeline(
            self.engine["segmenter"],
            model_not_loaded("associator"),
            model_not_loaded("predictor"),
            parameters.pipeline_params(self.values),
            self.bounds,
        )
        self.setup_segmentation(pipeline)
        self.counters.update(POINT_COUNTERS)
        self.detected = self.output(DetectedObjects, "detected_objects")
        self.obstacles = self.output(PointCloud2, "obstacles") if self.tables else None
        self.subscribe(PointCloud2, "points", self.on_points)

    def on_points(self, msg: PointCloud2) -> None:
        with self.handling("points"):
            t0 = time.perf_counter()
            points, head = self.vehicle_points(msg)
            arrival = self.scheduler.arrive("points", stamp_s(msg.header.stamp))
            self.record_latency({"convert": (time.perf_counter() - t0) * MS_PER_S})
            self.submit_near_field(points, head, arrival)
            self.scheduler.submit(
                partial(self.segmentation.full_cloud, points, self.next_seed()),
                Tier.PLANNING,
                arrival=arrival,
                name=FULL_CLOUD,
                size=points.shape[0],
            ).add_done_callback(self.deliver("full cloud", partial(self._publish, head, t0)))

    def _publish(self, head: Header, t0: float, cloud: FullCloud) -> None:
        self.publish_obstacles(self.detected, self.obstacles, head, cloud.obstacles)
        self.count_full_cloud(cloud)
        self.count("frames_out")
        self.record_latency({**cloud.latency_ms, "total": (time.perf_counter() - t0) * MS_PER_S})


def main(args: list[str] | None = None) -> int:
    return run_node(PointcloudNode, args)
