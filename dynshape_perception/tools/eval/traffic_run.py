"""Generated traffic replayed through the nodes' tiers in process; its outputs beside the truth."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.config import default_config
from dynshape_perception.errors import DataError
from dynshape_perception.io import bags
from dynshape_perception.io.objects import (
    DETECTED_OBJECTS,
    TRACKED_OBJECTS,
    obstacles_from_detected_objects,
    tracks_from_tracked_objects,
)
from dynshape_perception.io.pointcloud2 import cloud_to_table
from dynshape_perception.perception.clustering import ClusterParams
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.perception.transforms import planar
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.tools.eval.tracking import (
    Boxes,
    ScoredFrame,
    class_of_labels,
    score_detection,
    score_tracking,
)
from dynshape_perception.tools.replay.inprocess import InProcessReplay, ReplayOptions
from dynshape_perception.tools.replay.rundir import OUTPUT_BAG, RunRecorder
from dynshape_perception.tools.replay.settings import ReplaySettings
from dynshape_perception.tools.replay.sources import (
    BASE_FRAME,
    LIDAR_FRAME,
    ODOM_FRAME,
    ODOM_TOPIC,
    POINTS_TOPIC,
    START_NS,
    TF_TOPIC,
    write_mount,
)
from dynshape_perception.tools.sim.traffic import (
    TrafficConfig,
    boxes_in_sensor,
    traffic_frames,
)

# The outputs as the nodes publish them, and the debug tables where the message types are absent.
TRACKS_TOPICS = ("/tracked_objects", "/tracks")
DETECTIONS_TOPICS = ("/detected_objects", "/obstacles")
# Only truth with at least as many returns as a cluster needs is scored; hidden truth and
# truth outside the clustering's ROI are tolerated (a track on one is neither hit nor false).
MIN_SCORED_POINTS = ClusterParams().min_points


@dataclass(frozen=True)
class TruthFrame:
    stamp_ns: int
    pose: tuple[float, float, float]
    truth: np.ndarray


def _ns(t_s: float) -> int:
    return START_NS + round(t_s * 1e9)


def write_traffic_bag(out: Path, config: TrafficConfig, storage: str = "mcap") -> list[TruthFrame]:
    """The scene as a bag (points, lidar mount, odometry and /tf at each scan), and its truth."""
    truths = []
    with bags.BagWriter(out, storage) as writer:
        write_mount(writer, _ns(0.0), config.sensor_height_m)
        for frame in traffic_frames(config):
            ns = _ns(frame.stamp_s)
            x, y, yaw = frame.pose
            speed = config.ego_speed_mps
            writer.write(
                ODOM_TOPIC, ns, bags.odometry_message(ns, x, y, yaw, speed, 0.0, ODOM_FRAME)
            )
            moved = bags.transform_message(ODOM_FRAME, BASE_FRAME, ns, planar(x, y, yaw))
            writer.write(TF_TOPIC, ns, bags.tf_message([moved]))
            writer.write(POINTS_TOPIC, ns, bags.points_message(frame.points, ns, LIDAR_FRAME))
            truths.append(TruthFrame(ns, frame.pose, frame.truth))
        end = _ns(config.duration_s)
        x, y, yaw = config.ego_speed_mps * config.duration_s, 0.0, 0.0
        writer.write(
            ODOM_TOPIC,
            end,
            bags.odometry_message(end, x, y, yaw, config.ego_speed_mps, 0.0, ODOM_FRAME),
        )
    return truths


def _read_outputs(
    run_dir: Path,
) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], dict[int, np.ndarray]]:
    """Per scan (the log time of its input): tracks (rows, int ids from their UUIDs) and
    detections, from the published messages where recorded, else from the debug tables."""
    tracks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    detections: dict[int, np.ndarray] = {}
    uuids: dict[bytes, int] = {}
    with bags.BagReader(run_dir / OUTPUT_BAG) as reader:
        names = {t.name for t in reader.topics()}
        track_topic = next(t for t in TRACKS_TOPICS if t in names)
        det_topic = next(t for t in DETECTIONS_TOPICS if t in names)
        for message in reader.messages([track_topic, det_topic]):
            if message.msgtype == TRACKED_OBJECTS:
                states = tracks_from_tracked_objects(bytes(message.raw))
                ids = [uuids.setdefault(bytes(u), len(uuids) + 1) for u in states.uuids]
                tracks[message.log_ns] = (states.tracks, np.array(ids, dtype=np.int64))
            elif message.msgtype == DETECTED_OBJECTS:
                detections[message.log_ns] = obstacles_from_detected_objects(bytes(message.raw))
            elif message.topic == det_topic:
                msg = reader.deserialize(message)
                detections[message.log_ns] = cloud_to_table(msg, OBSTACLE_DTYPE)
            else:
                rows = cloud_to_table(reader.deserialize(message), TRACK_DTYPE)
                tracks[message.log_ns] = (rows, rows["id"].astype(np.int64))
    return tracks, detections


def truth_boxes(frame: TruthFrame, sensor_height_m: float) -> tuple[Boxes, Boxes]:
    """The truth in the fixed frame and in the vehicle frame (x, y as the sensor's)."""
    truth = frame.truth
    local = boxes_in_sensor(truth, frame.pose, sensor_height_m)
    roi = default_config().roi
    in_roi = (
        (local["x"] >= roi.x_m[0])
        & (local["x"] < roi.x_m[1])
        & (local["y"] >= roi.y_m[0])
        & (local["y"] < roi.y_m[1])
    )
    scored = in_roi & (truth["num_points"] >= MIN_SCORED_POINTS)
    range_m = np.hypot(local["x"], local["y"]).astype(np.float64)
    common = dict(
        ids=truth["id"].astype(np.int64),
        cls=truth["cls"].astype(np.int64),
        length=truth["length"].astype(np.float64),
        width=truth["width"].astype(np.float64),
        range_m=range_m,
        scored=scored,
    )
    fixed = Boxes(xy=np.c_[truth["x"], truth["y"]], yaw=truth["yaw"].astype(np.float64), **common)
    vehicle = Boxes(
        xy=np.c_[local["x"], local["y"]].astype(np.float64),
        yaw=local["yaw"].astype(np.float64),
        **common,
    )
    return fixed, vehicle


def output_boxes(rows: np.ndarray, ids: np.ndarray, origin: tuple[float, float]) -> Boxes:
    """Output rows as boxes, their range from ``origin`` (the sensor, in the rows' frame)."""
    xy = np.c_[rows["x"], rows["y"]].astype(np.float64)
    return Boxes(
        ids=ids,
        cls=class_of_labels(rows["label"]),
        xy=xy,
        length=rows["length"].astype(np.float64),
        width=rows["width"].astype(np.float64),
        yaw=rows["yaw"].astype(np.float64),
        range_m=np.hypot(xy[:, 0] - origin[0], xy[:, 1] - origin[1]),
        scored=np.ones(rows.shape[0], dtype=bool),
    )


@dataclass(frozen=True)
class SceneRun:
    """One scene's frames for each score, and what the replay reported."""

    tracking: list[ScoredFrame]
    detection: list[ScoredFrame]
    summary: dict[str, Any]


def run_scene(engine: Engine, settings: ReplaySettings, config: TrafficConfig) -> SceneRun:
    """Generate the scene, replay it through the tiers, and pair every scan with its truth."""
    with tempfile.TemporaryDirectory(prefix="dynshape-traffic-") as scratch:
        bag = Path(scratch) / "traffic"
        truths = write_traffic_bag(bag, config)
        replay = InProcessReplay(engine, settings)
        with RunRecorder(Path(scratch) / "run") as recorder:
            result = replay.run(bag, ReplayOptions(progress=False), recorder)
            run_dir = recorder.finish(result.metrics.document(), "")
        tracks, detections = _read_outputs(run_dir)
    empty_rows = np.zeros(
        0,
        dtype=[
            ("x", "<f4"),
            ("y", "<f4"),
            ("length", "<f4"),
            ("width", "<f4"),
            ("yaw", "<f4"),
            ("label", "<u4"),
        ],
    )
    tracking, detection = [], []
    for frame in truths:
        fixed, vehicle = truth_boxes(frame, config.sensor_height_m)
        rows, ids = tracks.get(frame.stamp_ns, (empty_rows, np.zeros(0, np.int64)))
        tracking.append(ScoredFrame(fixed, output_boxes(rows, ids, frame.pose[:2])))
        found = detections.get(frame.stamp_ns, empty_rows)
        det_ids = np.arange(found.shape[0], dtype=np.int64)
        detection.append(ScoredFrame(vehicle, output_boxes(found, det_ids, (0.0, 0.0))))
    summary = result.summary()
    return SceneRun(tracking, detection, summary)


def evaluate_traffic(
    engine: Engine, settings: ReplaySettings, configs: Sequence[TrafficConfig]
) -> dict[str, Any]:
    """Tracking and detection scores of the pipeline over generated scenes."""
    if not configs:
        raise DataError("no scenes to evaluate")
    runs = [run_scene(engine, settings, c) for c in configs]
    frames = sum(len(r.tracking) for r in runs)
    dropped = sum(int(r.summary.get("dropped_frames", 0)) for r in runs)
    return {
        "scenes": [
            {
                "seed": c.seed,
                "frames": c.frames,
                "period_s": c.period_s,
                "ego_speed_mps": c.ego_speed_mps,
            }
            for c in configs
        ],
        "frames": frames,
        "dropped_frames": dropped,
        "tracking": score_tracking([r.tracking for r in runs]),
        "detection": score_detection([r.detection for r in runs]),
    }
