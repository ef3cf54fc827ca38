"""Bags for replay testing: a generated drive, the real KITTI scan, ETH/UCY and generated crowds."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dynshape_perception.config import check_seed
from dynshape_perception.errors import ConfigError, DataError
from dynshape_perception.io import bags
from dynshape_perception.io.datasets import ETH_UCY_STEP_S, read_eth_ucy, read_kitti_bin
from dynshape_perception.perception.ground import DEFAULT_SENSOR_HEIGHT_M
from dynshape_perception.perception.records import LABEL_PEDESTRIAN, OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.perception.transforms import planar
from dynshape_perception.tools.sim.drive import DriveConfig, drive_frames, ego_pose
from dynshape_perception.tools.sim.scenes import (
    PEDESTRIAN_SIZE_M,
    pedestrian_scene,
    sensor_sectors,
)

# Topic names written by make-bag; replay maps them to its inputs by their base name.
POINTS_TOPIC = "/points"
ODOM_TOPIC = "/odom"
OBSTACLES_TOPIC = "/obstacles"
TRUTH_TOPIC = "/ground_truth"
DETECTIONS_TOPIC = "/detections"
TF_TOPIC = bags.TF_TOPIC
TF_STATIC_TOPIC = bags.TF_STATIC_TOPIC
LIDAR_FRAME = "lidar"
BASE_FRAME = "base_link"
ODOM_FRAME = "odom"
WORLD_FRAME = "world"
# Every generated bag starts at the same instant (2023-11-14T22:13:20Z): bags are byte-identical.
START_NS = 1_700_000_000 * 1_000_000_000
ODOM_PER_FRAME = 2
LIDAR_PERIOD_S = 0.1
ETH_UCY_FPS = 25.0
CROWD_AREA_M = 20.0
# An ETH/UCY stream longer than this (11 days at 2.5 Hz) comes from an outlier frame number.
MAX_ETH_UCY_STEPS = 2_000_000
# Track ids travel as uint32.
MAX_TRACK_ID = 2**32 - 1


@dataclass
class BagSummary:
    """What a bag holds, for the make-bag report."""

    path: Path
    storage: str
    source: str
    messages: dict[str, int]
    frames: int
    duration_s: float
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"{self.path} ({self.storage}): {self.source}, {self.frames} frames, "
            f"{self.duration_s:.1f} s"
        ]
        out += [f"  {topic:<16} {count:>6} messages" for topic, count in self.messages.items()]
        out += [f"  {name}: {lo} to {hi}" for name, (lo, hi) in self.ranges.items()]
        out += [f"  {note}" for note in self.notes]
        return out


def _ns(t_s: float) -> int:
    return START_NS + round(t_s * 1e9)


def _span(values: list[int]) -> tuple[int, int]:
    return (min(values), max(values)) if values else (0, 0)


def occlusion_gaps(visible: dict[int, list[bool]], min_frames: int) -> int:
    """Objects seen, then hidden for at least ``min_frames`` scans, then seen again."""
    count = 0
    for seq in visible.values():
        text = "".join("1" if v else "0" for v in seq).strip("0")
        if "0" * min_frames in text:
            count += 1
    return count


def write_mount(writer: bags.BagWriter, ns: int, height_m: float) -> None:
    """/tf_static: the lidar ``height_m`` above base_link (on the ground, under the lidar)."""
    mount = bags.transform_message(BASE_FRAME, LIDAR_FRAME, ns, planar(z=height_m))
    writer.write(TF_STATIC_TOPIC, ns, bags.tf_message([mount]))


def _write_ego(writer: bags.BagWriter, config: DriveConfig, t_s: float) -> None:
    """Odometry and /tf (odom -> base_link) of the ego at ``t_s``."""
    ns = _ns(t_s)
    x, y, yaw, speed, yaw_rate = ego_pose(config, t_s)
    writer.write(
        ODOM_TOPIC,
        ns,
        bags.odometry_message(ns, x, y, yaw, speed, yaw_rate, ODOM_FRAME, BASE_FRAME),
    )
    moved = bags.transform_message(ODOM_FRAME, BASE_FRAME, ns, planar(x, y, yaw))
    writer.write(TF_TOPIC, ns, bags.tf_message([moved]))


def write_generated(
    out: Path,
    storage: str,
    config: DriveConfig,
    vision_msgs: bool = False,
    hidden_frames: int = 6,
    progress: Callable[[int], None] | None = None,
    sectors: int = 1,
) -> BagSummary:
    """The generated drive: points, the lidar mount on /tf_static, odometry and /tf at twice
    the scan rate, and the ground truth (odometry frame, base_link on the ground).

    With ``sectors`` > 1 each scan goes out as that many azimuth sectors in the order a
    spinning lidar emits them (those with points), stamped through the scan period.
    """
    if sectors < 1:
        raise ConfigError(f"sectors must be >= 1, got {sectors}")
    points, objects, agents = [], [], []
    visible: dict[int, list[bool]] = {}
    odom_dt = config.period_s / ODOM_PER_FRAME
    # Scans are stamped between odometry samples, so replay must interpolate the pose.
    scan_offset_s = odom_dt / 2.0
    with bags.BagWriter(out, storage) as writer:
        write_mount(writer, _ns(0.0), config.sensor_height_m)
        for frame in drive_frames(config):
            t = frame.stamp_s + scan_offset_s
            for j in range(ODOM_PER_FRAME):
                _write_ego(writer, config, frame.stamp_s + j * odom_dt)
            parts = sensor_sectors(frame.points, sectors) if sectors > 1 else [frame.points]
            for k, part in enumerate(parts):
                if sectors > 1 and not part.shape[0]:
                    continue
                t_part = t + k * config.period_s / sectors
                writer.write(
                    POINTS_TOPIC, _ns(t_part), bags.points_message(part, _ns(t_part), LIDAR_FRAME)
                )
            truth = frame.truth.copy()
            truth["z"] += config.sensor_height_m
            writer.write(TRUTH_TOPIC, _ns(t), bags.table_message(truth, _ns(t), ODOM_FRAME))
            if vision_msgs:
                writer.write(
                    DETECTIONS_TOPIC,
                    _ns(t),
                    bags.detections_message(frame.visible, _ns(t), LIDAR_FRAME),
                )
            points.append(int(frame.points.shape[0]))
            objects.append(int(frame.truth.shape[0]))
            truth = frame.truth
            moving = (truth["label"] == LABEL_PEDESTRIAN) | (np.hypot(truth["vx"], truth["vy"]) > 0)
            agents.append(int(np.count_nonzero(moving)))
            for oid, n in zip(truth["id"].tolist(), truth["num_points"].tolist(), strict=True):
                visible.setdefault(oid, []).append(n > 0)
            if progress is not None:
                progress(1)
        t_end = config.frames * config.period_s
        _write_ego(writer, config, t_end)
    gaps = occlusion_gaps(visible, hidden_frames)
    return BagSummary(
        path=out,
        storage=storage,
        source=f"generated drive, seed {config.seed}",
        messages=dict(writer.counts),
        frames=config.frames,
        duration_s=t_end,
        ranges={"points": _span(points), "objects": _span(objects), "agents": _span(agents)},
        notes=[
            f"{gaps} object(s) hidden for >= {hidden_frames} scans and seen again "
            "(occlusions that break tracks)"
        ],
    )


def write_kitti(out: Path, storage: str, scan: Path, frames: int) -> BagSummary:
    """The real KITTI scan, repeated ``frames`` times at 10 Hz from a standing vehicle, with
    the lidar mount on /tf_static and odometry (no /tf: replay falls back to it)."""
    if frames < 1:
        raise ConfigError(f"frames must be >= 1, got {frames}")
    points = read_kitti_bin(scan, allow_empty=False)
    with bags.BagWriter(out, storage) as writer:
        write_mount(writer, _ns(0.0), DEFAULT_SENSOR_HEIGHT_M)
        for k in range(frames):
            t = _ns(k * LIDAR_PERIOD_S)
            writer.write(
                ODOM_TOPIC, t, bags.odometry_message(t, 0.0, 0.0, 0.0, 0.0, 0.0, ODOM_FRAME)
            )
            writer.write(POINTS_TOPIC, t, bags.points_message(points, t, LIDAR_FRAME))
    return BagSummary(
        path=out,
        storage=storage,
        source=f"KITTI scan {scan.name}",
        messages=dict(writer.counts),
        frames=frames,
        duration_s=(frames - 1) * LIDAR_PERIOD_S,
        ranges={"points": (points.shape[0], points.shape[0])},
        notes=[
            "the vehicle stands still: the same real scan is replayed at 10 Hz",
            f"the lidar {DEFAULT_SENSOR_HEIGHT_M} m above base_link on /tf_static",
        ],
    )


def pedestrian_rows(xy: np.ndarray, heading: np.ndarray) -> np.ndarray:
    """Detection rows of pedestrians standing at ``xy [n, 2]`` facing ``heading [n]``."""
    rows = np.zeros(xy.shape[0], dtype=OBSTACLE_DTYPE)
    rows["x"], rows["y"] = xy[:, 0], xy[:, 1]
    length, width, height = PEDESTRIAN_SIZE_M
    rows["z"], rows["length"], rows["width"], rows["height"] = height / 2.0, length, width, height
    rows["yaw"], rows["score"], rows["label"] = heading, 1.0, LABEL_PEDESTRIAN
    return rows


def _write_detection_stream(
    writer: bags.BagWriter,
    stamps_s: np.ndarray,
    tracks: dict[int, tuple[np.ndarray, np.ndarray]],
    step_s: float,
    vision_msgs: bool,
) -> list[int]:
    """Obstacles and ground truth at every stamp from per-id (step index, xy) tracks."""
    per_step: dict[int, list[tuple[int, float, float, float, float, int]]] = {}
    for pid, (steps, xy) in sorted(tracks.items()):
        velocity = np.gradient(xy, step_s, axis=0) if len(steps) > 1 else np.zeros_like(xy)
        for i, (s, (x, y), (vx, vy)) in enumerate(zip(steps, xy, velocity, strict=True)):
            per_step.setdefault(int(s), []).append((pid, x, y, vx, vy, i))
    counts = []
    for s, t_s in enumerate(stamps_s):
        rows = sorted(per_step.get(s, []))
        xy = np.array([[r[1], r[2]] for r in rows], dtype=np.float64).reshape(-1, 2)
        vel = np.array([[r[3], r[4]] for r in rows], dtype=np.float64).reshape(-1, 2)
        heading = np.arctan2(vel[:, 1], vel[:, 0])
        obstacles = pedestrian_rows(xy, heading)
        truth = np.zeros(len(rows), dtype=TRACK_DTYPE)
        for name in OBSTACLE_DTYPE.names or ():
            truth[name] = obstacles[name]
        truth["num_points"] = 1
        truth["id"] = [r[0] for r in rows]
        truth["vx"], truth["vy"] = vel[:, 0], vel[:, 1]
        truth["age"] = [r[5] for r in rows]
        ns = _ns(float(t_s))
        writer.write(OBSTACLES_TOPIC, ns, bags.table_message(obstacles, ns, WORLD_FRAME))
        writer.write(TRUTH_TOPIC, ns, bags.table_message(truth, ns, WORLD_FRAME))
        if vision_msgs:
            writer.write(DETECTIONS_TOPIC, ns, bags.detections_message(obstacles, ns, WORLD_FRAME))
        counts.append(len(rows))
    return counts


def write_eth_ucy(
    out: Path, storage: str, path: Path, frames: int | None, vision_msgs: bool = False
) -> BagSummary:
    """A real ETH/UCY scene as a 2.5 Hz pedestrian detection stream in its world frame."""
    scene = read_eth_ucy(path)
    if scene.rows.shape[0] == 0:
        raise DataError(f"{path} holds no pedestrian rows")
    annotated = np.unique(scene.frames)
    step = int(np.median(np.diff(annotated))) if annotated.size > 1 else 1
    first = int(annotated[0])
    count = int((annotated[-1] - first) // step + 1)
    if frames is not None:
        count = min(count, frames)
    # Bounds both the steps to allocate and the stamps, which must fit int64 nanoseconds.
    if (
        count > MAX_ETH_UCY_STEPS
        or (count - 1) * step > MAX_ETH_UCY_STEPS * ETH_UCY_STEP_S * ETH_UCY_FPS
    ):
        raise DataError(
            f"{path} spans frames {first} to {int(annotated[-1])} in {count} steps of {step} "
            f"frames, more than {MAX_ETH_UCY_STEPS} steps of {ETH_UCY_STEP_S} s: an outlier "
            "frame number? Limit it with --frames"
        )
    if int(scene.ped_ids.max()) > MAX_TRACK_ID:
        raise DataError(f"{path} holds pedestrian ids above {MAX_TRACK_ID}")
    stamps = np.arange(count) * step / ETH_UCY_FPS
    tracks = {}
    for pid, (frame_numbers, xy) in scene.tracks().items():
        offset = frame_numbers - first
        on_grid = (offset % step == 0) & (offset // step < count)
        if on_grid.any():
            tracks[pid] = ((offset[on_grid] // step), xy[on_grid])
    with bags.BagWriter(out, storage) as writer:
        counts = _write_detection_stream(writer, stamps, tracks, step / ETH_UCY_FPS, vision_msgs)
    notes = [f"annotation step {step} frames = {step / ETH_UCY_FPS:.2f} s"]
    if scene.skipped_rows:
        notes.append(f"{scene.skipped_rows} malformed row(s) skipped")
    if not math.isclose(step / ETH_UCY_FPS, ETH_UCY_STEP_S):
        notes.append(f"note: the protocol step is {ETH_UCY_STEP_S} s")
    return BagSummary(
        path=out,
        storage=storage,
        source=f"ETH/UCY {path.name}",
        messages=dict(writer.counts),
        frames=count,
        duration_s=float(stamps[-1]) if count else 0.0,
        ranges={"agents": _span(counts)},
        notes=notes,
    )


def write_crowd(
    out: Path, storage: str, seed: int, frames: int, agents: int, vision_msgs: bool = False
) -> BagSummary:
    """A generated 2.5 Hz pedestrian detection stream: agents enter and leave the view."""
    if frames < 1 or agents < 0:
        raise ConfigError(f"need frames >= 1 and agents >= 0, got {frames}, {agents}")
    check_seed("seed", seed)
    rng = np.random.default_rng(seed)
    paths = pedestrian_scene(
        seed=seed, num_agents=agents, num_steps=frames, dt_s=ETH_UCY_STEP_S, area_m=CROWD_AREA_M
    )
    enter = rng.integers(0, max(frames // 2, 1), agents)
    stay = rng.integers(min(8, frames), frames + 1, agents)
    tracks = {}
    for a in range(agents):
        steps = np.arange(enter[a], min(enter[a] + stay[a], frames))
        tracks[a + 1] = (steps, paths[a, steps].astype(np.float64))
    stamps = np.arange(frames) * ETH_UCY_STEP_S
    with bags.BagWriter(out, storage) as writer:
        counts = _write_detection_stream(writer, stamps, tracks, ETH_UCY_STEP_S, vision_msgs)
    return BagSummary(
        path=out,
        storage=storage,
        source=f"generated crowd, seed {seed}",
        messages=dict(writer.counts),
        frames=frames,
        duration_s=float(stamps[-1]),
        ranges={"agents": _span(counts)},
    )
