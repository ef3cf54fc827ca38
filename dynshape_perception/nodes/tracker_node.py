"""``tracker_node``: detections in; tracks with stable UUIDs in the fixed frame out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from autoware_perception_msgs.msg import DetectedObjects, TrackedObjects
from sensor_msgs.msg import PointCloud2
from vision_msgs.msg import Detection3DArray

from dynshape_perception import parameters
from dynshape_perception.io.objects import (
    BAD_OBJECT,
    TrackStates,
    detections_to_obstacles,
    obstacles_from_detected_objects,
    row_problems,
    tracked_objects,
)
from dynshape_perception.io.pointcloud2 import REASONS, cloud_to_table
from dynshape_perception.nodes.base import (
    BAD_MESSAGE,
    INTERNAL_ERROR,
    ODOM_REASONS,
    OVER_BOUND,
    PROCESSING_ERROR,
    STALE_STAMP,
    FixedFrame,
    PerceptionNode,
    model_not_loaded,
    output_header,
    run_node,
)
from dynshape_perception.nodes.frames import PoseInput
from dynshape_perception.nodes.messages import (
    deserialized,
    serialized_header,
    stamp_ns,
    stamp_s,
    table_msg,
)
from dynshape_perception.perception.objects import TrackUuids
from dynshape_perception.perception.pipeline import Pipeline
from dynshape_perception.perception.records import OBSTACLE_DTYPE

MS_PER_S = 1000.0
# Tracks the tracker let go at bounds.max_tracks.
TRACKS_DROPPED = "tracks_dropped"
TRACKER_REASONS = (
    *REASONS,
    BAD_MESSAGE,
    BAD_OBJECT,
    OVER_BOUND,
    STALE_STAMP,
    PROCESSING_ERROR,
    INTERNAL_ERROR,
    *ODOM_REASONS,
)
# tracker.input_type -> (message type, topic, reader into unchecked obstacle rows that
# records in its dict the rows it could not read, whether the reader takes the CDR bytes:
# detected objects are read with NumPy, not as message objects).
INPUTS: dict[str, tuple[Any, str, Callable[[Any, dict[int, str]], np.ndarray], bool]] = {
    parameters.TRACKER_INPUT_OBJECTS: (
        DetectedObjects,
        "detected_objects",
        lambda msg, _: obstacles_from_detected_objects(msg, check=False),
        True,
    ),
    parameters.TRACKER_INPUT_VISION: (
        Detection3DArray,
        "detections",
        detections_to_obstacles,
        False,
    ),
    parameters.TRACKER_INPUT_TABLE: (
        PointCloud2,
        "obstacles",
        lambda msg, _: cloud_to_table(msg, OBSTACLE_DTYPE),
        False,
    ),
}


class TrackerNode(PerceptionNode):
    def __init__(self) -> None:
        super().__init__("tracker_node", ("associator",), TRACKER_REASONS)
        self.pipeline = Pipeline(
            model_not_loaded("segmenter"),
            self.engine["associator"],
            model_not_loaded("predictor"),
            parameters.pipeline_params(self.values),
            self.bounds,
        )
        self.uuids = TrackUuids()
        self.frame = FixedFrame(self, self._reset)
        self.pose = PoseInput(self)
        self.counters[TRACKS_DROPPED] = 0
        self.tracked = self.output(TrackedObjects, "tracked_objects")
        self.tables = bool(self.values["debug.publish_tables"])
        self.tracks = self.output(PointCloud2, "tracks") if self.tables else None
        msg_type, topic, self._read, self._raw = INPUTS[str(self.values["tracker.input_type"])]
        self._type = msg_type
        self.note("input", f"{msg_type.__name__} on {self.resolve_topic_name(topic)!r}")
        # Always the bytes: a message rclpy cannot read is then a counted bad_message here,
        # where the executor's own read would raise out of spin.
        self.subscribe(msg_type, topic, self.on_detections, raw=True)

    def _reset(self) -> None:
        self.pipeline.tracker.reset()
        self.uuids.reset()

    def apply_parameters(self, changed: set[str]) -> None:
        self.pipeline.params = parameters.pipeline_params(self.values)
        self.pipeline.tracker.params = self.pipeline.params.tracker

    def on_detections(self, data: bytes) -> None:
        with self.handling("detections"):
            t0 = time.perf_counter()
            delivery = self.delivery()
            msg: Any = data if self._raw else deserialized(data, self._type)
            head = serialized_header(msg) if self._raw else msg.header
            obstacles = self._usable(msg)
            convert_ms = (time.perf_counter() - t0) * MS_PER_S
            self._track(obstacles, head, t0, {**delivery, "convert": convert_ms})

    def _usable(self, msg: Any) -> np.ndarray:
        """The message's obstacles; each that is none is a counted drop, the rest are kept."""
        problems: dict[int, str] = {}
        rows = self._read(msg, problems)
        problems.update(row_problems(rows, "object"))
        if not problems:
            return rows
        for row in sorted(problems):
            self.drops.drop(BAD_OBJECT, problems[row])
        keep = np.ones(rows.shape[0], bool)
        keep[sorted(problems)] = False
        return rows[keep]

    def _track(self, obstacles: np.ndarray, header: Any, t0: float, read: dict[str, float]) -> None:
        """Track ``obstacles``, whose message was taken at ``t0``; ``read``: the stages timed
        since (its delivery and read)."""
        t1 = time.perf_counter()
        self.bounds.check("N", obstacles.shape[0], "obstacles")
        stamp = stamp_s(header.stamp)
        located = self.frame.place(self.pose, header.frame_id, stamp)
        if located is None or not self.frame.admit(located.fixed_frame, stamp):
            return
        pipeline = self.pipeline
        tracks = pipeline.track(pipeline.to_fixed_frame(obstacles, located.to_fixed), stamp)
        tracker = pipeline.tracker
        self.set_counter(TRACKS_DROPPED, tracker.dropped_tracks)
        t2 = time.perf_counter()
        states = TrackStates.of_tracker(tracks, tracker, self.uuids)
        ns = stamp_ns(header.stamp)
        self.tracked.publish_serialized(
            tracked_objects(ns, located.fixed_frame, states, pipeline.params.objects),
            header.stamp,
        )
        if self.tracks is not None:
            self.tracks.publish(table_msg(tracks, output_header(header.stamp, located.fixed_frame)))
        self.count("frames_out")
        self.record_latency(
            {
                **read,
                "track": (t2 - t1) * MS_PER_S,
                "total": (time.perf_counter() - t0) * MS_PER_S,
            }
        )


def main(args: list[str] | None = None) -> int:
    return run_node(TrackerNode, args)
