"""``prediction_node``: tracked objects in; K predicted paths per agent (and markers) out."""

from __future__ import annotations

import time

import numpy as np
from autoware_perception_msgs.msg import PredictedObjects, TrackedObjects
from sensor_msgs.msg import PointCloud2

from dynshape_perception import parameters
from dynshape_perception.io.objects import (
    BAD_OBJECT,
    TrackStates,
    predicted_objects,
    row_problems,
    tracks_from_tracked_objects,
)
from dynshape_perception.io.pointcloud2 import REASONS
from dynshape_perception.nodes import diagnostics as diag
from dynshape_perception.nodes.base import (
    BAD_MESSAGE,
    INTERNAL_ERROR,
    ODOM_REASONS,
    OVER_BOUND,
    PROCESSING_ERROR,
    STALE_STAMP,
    FixedFrame,
    PerceptionNode,
    output_header,
    run_node,
)
from dynshape_perception.nodes.frames import PoseInput
from dynshape_perception.nodes.messages import (
    marker_bytes,
    serialized_header,
    stamp_ns,
    stamp_s,
    table_msg,
)
from dynshape_perception.perception.objects import UuidIndex
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.perception.prediction.stage import IdleSpeculation, PredictionStage
from dynshape_perception.perception.transforms import inverse

MS_PER_S = 1000.0
AGENTS_DROPPED = "agents_dropped"
# UUIDs repeated in one message: each occurrence is an agent of its own.
DUPLICATE_UUIDS = "duplicate_uuids"


class PredictionNode(PerceptionNode):
    def __init__(self) -> None:
        super().__init__(
            "prediction_node",
            ("predictor",),
            (
                *REASONS,
                BAD_MESSAGE,
                BAD_OBJECT,
                OVER_BOUND,
                STALE_STAMP,
                PROCESSING_ERROR,
                INTERNAL_ERROR,
                *ODOM_REASONS,
            ),
        )
        self.stage = PredictionStage(
            self.engine["predictor"], parameters.prediction_settings(self.values)
        )
        # Speculation runs in the node's idle time: it has no tiered executor.
        self.speculation = IdleSpeculation(self.stage)
        self.diagnostics.add_task(diag.PREDICTION, self.report_prediction)
        self.ids = UuidIndex()
        self.frame = FixedFrame(self, self._reset)
        self.pose = PoseInput(self)
        self.counters[AGENTS_DROPPED] = 0
        self.counters[DUPLICATE_UUIDS] = 0
        self.predicted = self.output(PredictedObjects, "predicted_objects")
        # Read once and on each change, not per frame.
        self.object_params = parameters.object_params(self.values)
        tables = bool(self.values["debug.publish_tables"])
        self.predictions = self.output(PointCloud2, "predictions") if tables else None
        self.markers = self.marker_output()
        # Read with NumPy from the CDR bytes: no message objects per pose and covariance.
        self.subscribe(TrackedObjects, "tracked_objects", self.on_tracks, raw=True)

    def _reset(self) -> None:
        self.stage.reset()
        self.ids.reset()

    def apply_parameters(self, changed: set[str]) -> None:
        if any(name.startswith("objects.") for name in changed):
            self.object_params = parameters.object_params(self.values)
        if any(name.startswith("prediction.") for name in changed):
            self.stage.update_settings(parameters.prediction_settings(self.values))

    def close(self) -> None:
        self.speculation.close()
        super().close()

    def on_tracks(self, data: bytes) -> None:
        with self.handling("tracked_objects"):
            t0 = time.perf_counter()
            delivery = self.delivery()
            head_in = serialized_header(data)
            received = self._usable(tracks_from_tracked_objects(data, check=False))
            self.bounds.check("M", received.tracks.shape[0], "tracks")
            stamp = stamp_s(head_in.stamp)
            frame_id = head_in.frame_id
            located = self.frame.place(self.pose, frame_id, stamp)
            if located is None or not self.frame.admit(frame_id, stamp):
                return
            tracks = received.tracks.copy()
            tracks["id"] = self.ids.update(received.uuids)
            self.count(DUPLICATE_UUIDS, self.ids.repeated)
            states = TrackStates(tracks, received.uuids, received.existence, received.missed)
            # The vehicle in the tracks' frame: the nearest agents are predicted first.
            ego = Pose2D.of(inverse(located.to_fixed) @ located.vehicle)
            t1 = time.perf_counter()
            output = self.stage.predict(tracks, stamp, ego)
            paths = output.paths(self.stage.settings.step_s)
            t2 = time.perf_counter()
            self.predicted.publish_serialized(
                predicted_objects(
                    stamp_ns(head_in.stamp), frame_id, states, paths, self.object_params
                ),
                head_in.stamp,
            )
            head = output_header(head_in.stamp, frame_id)
            markers = self.markers_to_build(self.markers)
            if self.predictions is not None or markers is not None:
                # The rows only the debug table and the markers read.
                table = paths.table()
                if self.predictions is not None:
                    self.predictions.publish(table_msg(table, head))
                if markers is not None:
                    markers.publish_serialized(
                        marker_bytes(tracks, table, head, self.marker_style()), head.stamp
                    )
            self.count("frames_out")
            self.set_counter(AGENTS_DROPPED, self.stage.counters.agents_dropped)
            if self.stage.settings.speculation:
                self.speculation.frame_done()
            self.record_latency(
                {
                    **delivery,
                    "convert": (t1 - t0) * MS_PER_S,
                    "predict": (t2 - t1) * MS_PER_S,
                    "total": (time.perf_counter() - t0) * MS_PER_S,
                }
            )

    def _usable(self, received: TrackStates) -> TrackStates:
        """The tracks; each that is none is a counted drop, the rest are kept."""
        problems = row_problems(received.tracks, "tracked object")
        if not problems:
            return received
        for row in sorted(problems):
            self.drops.drop(BAD_OBJECT, problems[row])
        keep = np.ones(received.tracks.shape[0], bool)
        keep[sorted(problems)] = False
        return TrackStates(
            received.tracks[keep],
            received.uuids[keep],
            received.existence[keep],
            received.missed[keep],
        )

    def report_prediction(self) -> diag.Report:
        return diag.prediction_report(self.stage)


def main(args: list[str] | None = None) -> int:
    return run_node(PredictionNode, args)
