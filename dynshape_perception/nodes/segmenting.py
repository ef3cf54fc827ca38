"""What the lidar nodes share: the tier-1 near field on ``near_obstacles``, the tier-2 cloud."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
from sensor_msgs.msg import PointCloud2

from dynshape_perception import parameters
from dynshape_perception.errors import ConfigError
from dynshape_perception.nodes.base import PerceptionNode
from dynshape_perception.nodes.messages import table_msg
from dynshape_perception.perception.pipeline import Pipeline
from dynshape_perception.scheduling.executor import Arrival, TieredExecutor
from dynshape_perception.scheduling.lidar_tiers import (
    NEAR_FIELD,
    FullCloud,
    NearResult,
    Segmentation,
)
from dynshape_perception.scheduling.tiers import Tier

SEGMENTER = "segmenter"
SEGMENTING_COUNTERS = {
    "near_field_out": 0,
    "near_field_default_plane": 0,
    "frames_far_field_subsampled": 0,
    "segment_chunks": 0,
    # Obstacles cut at bounds.max_obstacles: by the full cloud, by the near field.
    "detections_dropped": 0,
    "near_field_detections_dropped": 0,
}


class SegmentingNode(PerceptionNode):
    """A node whose lidar work runs through the tiered executor.

    Per cloud: tier 1 segments the collision corridor on the node's second engine and
    publishes ``near_obstacles`` as soon as it is done; tier 2 segments the whole cloud in
    chunks and clusters it. Subclasses submit tier 2 and publish what it gives.
    """

    def __init__(self, kind: str, models: Sequence[str], reasons: Sequence[str]) -> None:
        super().__init__(kind, models, reasons)
        if self.deadline_executor is None or self.fast_engine is None:
            self._stop_workers()
            raise ConfigError(f"{kind} declares no tiers.* parameters: it needs the executor")
        self.scheduler: TieredExecutor = self.deadline_executor
        self.near_obstacles = self.create_publisher(PointCloud2, "near_obstacles", self.output_qos)
        self._seed = 0
        self.counters.update(SEGMENTING_COUNTERS)

    def setup_segmentation(self, pipeline: Pipeline) -> None:
        assert self.fast_engine is not None
        self.pipeline = pipeline
        self.segmentation = Segmentation(
            self.fast_engine[SEGMENTER],
            self.engine[SEGMENTER],
            pipeline,
            parameters.near_field(self.values),
            self.scheduler,
            self.engine.jit.weak_edges[SEGMENTER]["P"],
        )

    def apply_parameters(self, changed: set[str]) -> None:
        self.pipeline.params = parameters.pipeline_params(self.values)
        self.segmentation.near = parameters.near_field(self.values)

    def next_seed(self) -> int:
        """Seed of this frame's far-field subsample: reproducible, different every frame."""
        self._seed += 1
        return self._seed

    def submit_near_field(self, points: np.ndarray, head: Any, arrival: Arrival) -> None:
        future = self.scheduler.submit(
            self.segmentation.near_field(points),
            Tier.COLLISION,
            arrival=arrival,
            name=NEAR_FIELD,
            size=points.shape[0],
        )
        future.add_done_callback(self.deliver("near field", partial(self._publish_near, head)))

    def _publish_near(self, head: Any, result: NearResult) -> None:
        self.near_obstacles.publish(table_msg(result.obstacles, head))
        self.count("near_field_out")
        self.count("near_field_detections_dropped", result.dropped)
        if result.default_plane:
            self.count("near_field_default_plane")
        self.record_latency({NEAR_FIELD: result.ms})

    def count_full_cloud(self, cloud: FullCloud) -> None:
        if cloud.far_field_subsampled:
            self.count("frames_far_field_subsampled")
        self.count("segment_chunks", cloud.chunks)
        self.set_counter("detections_dropped", self.pipeline.dropped_detections)
