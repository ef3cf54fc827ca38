"""``prediction_node``: track table in, K hypotheses per agent (table) and RViz markers out."""

from __future__ import annotations

import time

import numpy as np
from sensor_msgs.msg import PointCloud2
from visualization_msgs.msg import MarkerArray

from dynshape_perception.config import default_config
from dynshape_perception.io.pointcloud2 import REASONS, cloud_to_table
from dynshape_perception.io.tables import PREDICTION_DTYPE, TRACK_DTYPE
from dynshape_perception.nodes.base import (
    INTERNAL_ERROR,
    ODOM_REASONS,
    OVER_BOUND,
    PROCESSING_ERROR,
    STALE_STAMP,
    FixedFrame,
    OdometryInput,
    PerceptionNode,
    output_header,
    run_node,
)
from dynshape_perception.nodes.messages import marker_array, stamp_s, table_msg
from dynshape_perception.perception.history import PREDICTOR_STEP_S
from dynshape_perception.perception.pipeline import prediction_table
from dynshape_perception.perception.track_histories import TrackHistories

MS_PER_S = 1000.0
AGENTS_DROPPED = "agents_dropped"


class PredictionNode(PerceptionNode):
    def __init__(self) -> None:
        super().__init__(
            "prediction_node",
            ("predictor",),
            (*REASONS, OVER_BOUND, STALE_STAMP, PROCESSING_ERROR, INTERNAL_ERROR, *ODOM_REASONS),
        )
        step_s = float(default_config().section("predictor").get("step_s", PREDICTOR_STEP_S))
        self.histories = TrackHistories(self.bounds, step_s)
        self.frame = FixedFrame(self, self.histories.reset)
        self.odometry = OdometryInput(self)
        self.counters[AGENTS_DROPPED] = 0
        self.predictions = self.create_publisher(PointCloud2, "predictions", self.output_qos)
        self.markers = self.create_publisher(MarkerArray, "markers", self.output_qos)
        self.create_subscription(PointCloud2, "tracks", self.on_tracks, self.input_qos)

    def on_tracks(self, msg: PointCloud2) -> None:
        with self.handling("tracks"):
            t0 = time.perf_counter()
            tracks = cloud_to_table(msg, TRACK_DTYPE)
            self.bounds.check("M", tracks.shape[0], "tracks")
            stamp = stamp_s(msg.header.stamp)
            located = self.frame.locate(self.odometry, stamp, msg.header.frame_id)
            if located is None or not self.frame.admit(msg.header.frame_id, stamp):
                return
            self.histories.update(tracks, stamp)
            ego = located[0]
            ids, batch, lengths = self.histories.batch(
                tracks, ego, int(self.values["prediction.min_history_steps"])
            )
            t1 = time.perf_counter()
            if ids.size:
                traj, probs = self.engine["predictor"]("forward", batch, lengths)
                predictions = prediction_table(ids, traj, probs)
            else:
                predictions = np.zeros(0, dtype=PREDICTION_DTYPE)
            t2 = time.perf_counter()
            head = output_header(msg.header.stamp, msg.header.frame_id)
            self.predictions.publish(table_msg(predictions, head))
            self.markers.publish(marker_array(tracks, predictions, head, self.marker_style()))
            self.count("frames_out")
            self.set_counter(AGENTS_DROPPED, self.histories.dropped_agents)
            self.record_latency(
                {
                    "histories": (t1 - t0) * MS_PER_S,
                    "predict": (t2 - t1) * MS_PER_S,
                    "total": (time.perf_counter() - t0) * MS_PER_S,
                }
            )


def main(args: list[str] | None = None) -> int:
    return run_node(PredictionNode, args)
