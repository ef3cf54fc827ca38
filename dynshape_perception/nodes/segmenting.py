"""What the lidar nodes share: the tier-1 near field on ``near_objects``, the tier-2 cloud."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from autoware_perception_msgs.msg import DetectedObjects
from builtin_interfaces.msg import Time
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header

from dynshape_perception import parameters
from dynshape_perception.errors import ConfigError
from dynshape_perception.io.cdr import read_point_cloud2
from dynshape_perception.io.objects import detected_objects
from dynshape_perception.io.pointcloud2 import CloudError
from dynshape_perception.nodes import diagnostics as diag
from dynshape_perception.nodes.base import PerceptionNode
from dynshape_perception.nodes.frames import PoseInput
from dynshape_perception.nodes.messages import NS_PER_S, stamp_ns, stamp_s, table_msg
from dynshape_perception.nodes.outputs import Output
from dynshape_perception.perception.pipeline import Pipeline
from dynshape_perception.perception.sectors import SectorAssembler
from dynshape_perception.perception.stamps import OUTLIER_STAMP
from dynshape_perception.scheduling.executor import TieredExecutor
from dynshape_perception.scheduling.lidar_tiers import (
    NEAR_FIELD,
    FullCloud,
    NearResult,
    Segmentation,
)

SEGMENTER = "segmenter"
# Scans with no point left after cropping: published as empty outputs, the input task warns.
EMPTY_AFTER_CROP = "empty_after_crop"
SEGMENTING_COUNTERS = {
    "near_field_out": 0,
    "near_field_default_plane": 0,
    "frames_far_field_subsampled": 0,
    "segment_chunks": 0,
    # Obstacles cut at bounds.max_obstacles: by the full cloud, by the near field.
    "detections_dropped": 0,
    "near_field_detections_dropped": 0,
    EMPTY_AFTER_CROP: 0,
}


class SegmentingNode(PerceptionNode):
    """A node whose lidar work runs through the tiered executor.

    Per cloud or sector, in the vehicle frame (``frames.base_frame``, the mount from TF):
    tier 1 segments the collision corridor on the node's second engine and publishes
    ``near_objects`` as soon as it is done; tier 2 segments a whole revolution in chunks
    and clusters it. Subclasses drive the core's ``PerceptionTiers`` and publish what it
    gives.
    """

    def __init__(
        self, kind: str, models: Sequence[str], reasons: Sequence[str], odometry: bool = False
    ) -> None:
        super().__init__(kind, models, reasons)
        if self.deadline_executor is None or self.fast_engine is None:
            self._stop_workers()
            raise ConfigError(f"{kind} declares no tiers.* parameters: it needs the executor")
        self.scheduler: TieredExecutor = self.deadline_executor
        self.tables = bool(self.values["debug.publish_tables"])
        self.pose = PoseInput(self, odometry)
        self.base_frame = self.pose.params.base_frame
        self.near_objects = self.output(DetectedObjects, "near_objects")
        self.near_obstacles = self.output(PointCloud2, "near_obstacles") if self.tables else None
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
            self.engine.jit.dim_policy(self.engine[SEGMENTER].model.spec).weak_edges["P"],
        )

    def apply_parameters(self, changed: set[str]) -> None:
        self.pipeline.params = parameters.pipeline_params(self.values)
        self.segmentation.near = parameters.near_field(self.values)

    def next_seed(self) -> int:
        """Seed of this frame's far-field subsample: reproducible, different every frame."""
        self._seed += 1
        return self._seed

    def vehicle_points(self, data: bytes) -> tuple[np.ndarray, Header]:
        """A PointCloud2's CDR bytes, read in place, as points in the vehicle frame, cropped
        and bounded; the outputs' header (the cloud's stamp)."""
        cloud = read_point_cloud2(data)
        sec, nanosec, frame_id = cloud.header
        if not (sec > 0 or (sec == 0 and nanosec > 0)) or nanosec >= NS_PER_S:
            # Unset, before 1970 or a year-2038+ time wrapped on the 32-bit wire: no time to
            # look a mount up at, nor to order the frame by.
            raise CloudError(OUTLIER_STAMP, f"stamp ({sec} s, {nanosec} ns) is not a positive time")
        stamp = Time(sec=sec, nanosec=nanosec)
        mount = self.pose.mount(frame_id, stamp_s(stamp))
        points = self.points_of(cloud, self.pipeline, mount)
        if points.shape[0] == 0:
            self.count(EMPTY_AFTER_CROP)
            self.note(
                "scan",
                f"{cloud.width * cloud.height} point(s) in, none left after cropping (scan.roi_*, "
                "scan.min_range_m, scan.crop_ego): empty outputs",
                warn=True,
            )
        elif "scan" in self.notes:
            self.note("scan", "ok")
        return points, Header(stamp=stamp, frame_id=self.base_frame)

    def publish_obstacles(
        self, objects: Output, table: Output | None, head: Header, obstacles: np.ndarray
    ) -> None:
        objects.publish_serialized(
            detected_objects(stamp_ns(head.stamp), head.frame_id, obstacles), head.stamp
        )
        if table is not None:
            table.publish(table_msg(obstacles, head))

    def _publish_near(self, head: Any, result: NearResult) -> None:
        self.publish_obstacles(self.near_objects, self.near_obstacles, head, result.obstacles)
        self.count("near_field_out")
        self.count("near_field_detections_dropped", result.dropped)
        if result.default_plane:
            self.count("near_field_default_plane")
        self.record_latency({NEAR_FIELD: result.ms})

    def report_sectors(self, sectors: SectorAssembler) -> None:
        """A diagnostics task for the sector clouds: counts, and WARN on lost sectors."""

        def report() -> diag.Report:
            counts = sectors.counters
            values: dict[str, object] = {f"sectors.{k}": v for k, v in counts.as_dict().items()}
            values["sectors.per_revolution"] = sectors.sectors_per_revolution
            problems = []
            if counts.incomplete_revolutions:
                problems.append(f"{counts.incomplete_revolutions} revolution(s) missed a sector")
            if counts.short_revolutions:
                problems.append(
                    f"{counts.short_revolutions} revolution(s) of {sectors.configured} sector(s) "
                    "ended while the scan went on: points.sectors_per_revolution is below the "
                    "driver's sectors per revolution"
                )
            return int(bool(problems)), problems, values

        self.diagnostics.add_task(diag.SECTORS, report)

    def count_full_cloud(self, cloud: FullCloud) -> None:
        if cloud.far_field_subsampled:
            self.count("frames_far_field_subsampled")
        self.count("segment_chunks", cloud.chunks)
        self.set_counter("detections_dropped", self.pipeline.dropped_detections)
