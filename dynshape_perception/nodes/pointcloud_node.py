"""``pointcloud_node``: lidar points in; near-field (tier 1) and all obstacles (tier 2) out."""

from __future__ import annotations

import time

from autoware_perception_msgs.msg import DetectedObjects
from sensor_msgs.msg import PointCloud2

from dynshape_perception import parameters
from dynshape_perception.nodes.base import (
    POINT_COUNTERS,
    POINT_REASONS,
    TF_BAD_MESSAGE,
    model_not_loaded,
    run_node,
)
from dynshape_perception.nodes.messages import stamp_s
from dynshape_perception.nodes.segmenting import SegmentingNode
from dynshape_perception.perception.pipeline import Pipeline, Pose2D
from dynshape_perception.perception.sectors import SectorAssembler
from dynshape_perception.scheduling.lidar_tiers import MS_PER_S, NearResult
from dynshape_perception.scheduling.perception_tiers import FrameInfo, PerceptionTiers, Tracked


class PointcloudNode(SegmentingNode):
    """The core's tiers without tracking: ``near_objects`` per cloud or sector (tier 1),
    ``detected_objects`` once per revolution (tier 2)."""

    def __init__(self) -> None:
        super().__init__("pointcloud_node", ("segmenter",), (*POINT_REASONS, TF_BAD_MESSAGE))
        pipeline = Pipeline(
            self.engine["segmenter"],
            model_not_loaded("associator"),
            model_not_loaded("predictor"),
            parameters.pipeline_params(self.values),
            self.bounds,
        )
        self.setup_segmentation(pipeline)
        self.counters.update(POINT_COUNTERS)
        self.tiers = PerceptionTiers(
            self.scheduler,
            self.segmentation,
            _Outputs(self),
            self.deliver,
            sectors=SectorAssembler(parameters.sectors_per_revolution(self.values)),
            track=False,
        )
        self.detected = self.output(DetectedObjects, "detected_objects")
        self.obstacles = self.output(PointCloud2, "obstacles") if self.tables else None
        self.report_sectors(self.tiers.sectors)
        self.subscribe(PointCloud2, "points", self.on_points, raw=True)

    def on_points(self, data: bytes) -> None:
        with self.handling("points"):
            t0 = time.perf_counter()
            delivery = self.delivery()
            points, head = self.vehicle_points(data)
            stamp = stamp_s(head.stamp)
            arrival = self.scheduler.arrive("points", stamp)
            convert_ms = (time.perf_counter() - t0) * MS_PER_S
            frame = FrameInfo(stamp, Pose2D(), arrival, t0, 0, self.next_seed(), head)
            self.tiers.cloud(points, frame)
            # After the lanes have their work: they need not wait for the debug topics.
            self.record_latency({**delivery, "convert": convert_ms})

    def on_near(self, frame: FrameInfo, result: NearResult) -> None:
        self._publish_near(frame.context, result)

    def on_tracked(self, frame: FrameInfo, result: Tracked) -> None:
        self.publish_obstacles(self.detected, self.obstacles, frame.context, result.obstacles)
        if result.cloud is not None:
            self.count_full_cloud(result.cloud)
            latency = {**result.cloud.latency_ms}
        else:
            latency = {}
        self.count("frames_out")
        self.record_latency(
            {**latency, "total": (time.perf_counter() - frame.received_s) * MS_PER_S},
            flush=True,
        )


class _Outputs:
    """The tiers' results, handed to the node that publishes them."""

    def __init__(self, node: PointcloudNode) -> None:
        self.near = node.on_near
        self.tracked = node.on_tracked
        self.predicted = _nothing_predicted


def _nothing_predicted(*_: object) -> None:
    """The point cloud node tracks nothing, so nothing reaches prediction."""


def main(args: list[str] | None = None) -> int:
    return run_node(PointcloudNode, args)
