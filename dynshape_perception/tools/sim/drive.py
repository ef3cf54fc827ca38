"""A seeded generated drive: ray-cast lidar scans, odometry and ground truth, frame by frame."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from dynshape_perception.config import check_seed
from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    OBSTACLE_DTYPE,
    TRACK_DTYPE,
)
from dynshape_perception.tools.sim import lidar
from dynshape_perception.tools.sim.lidar import SENSOR_HEIGHT_M, UPSAMPLE_JITTER_M
from dynshape_perception.tools.sim.scenes import (
    CAR_SIZE_M,
    CAR_SIZE_SPREAD_M,
    PEDESTRIAN_SIZE_M,
    PEDESTRIAN_SIZE_SPREAD_M,
    POLE_HEIGHT_M,
    POLE_WIDTH_M,
    SIDEWALK_Y_M,
    pedestrian_scene,
)

# Street layout (metres, in the frame where each segment starts): the ego lane is y = 0.
LANE_Y_M = 3.5
PARKED_Y_M = 7.0
EGO_CORRIDOR_M = 1.75
ROW_SPREAD_M = 0.3
PLACE_MARGIN_M = 8.0
MIN_RANGE_M = 3.0
MIN_GAP_M = 0.8
PLACEMENT_TRIES = 256
# Same-direction traffic on the right lane, oncoming on the left.
SAME_SPEED_MPS = (3.0, 10.0)
ONCOMING_SPEED_MPS = (5.0, 12.0)
MOVING_CAR_SHARE = 0.25
PARKED_SHARE = 0.6
# The occluder: a truck pacing the ego on the right lane hides a sector of the sidewalk;
# objects that cross that sector vanish for many frames, which breaks their tracks.
TRUCK_SIZE_M = (11.0, 2.5, 3.2)
TRUCK_AHEAD_M = (8.0, 14.0)
# Lane keeping: a slow sideways weave, so that odometry carries yaw.
WEAVE_M = 0.3
WEAVE_PERIOD_S = 6.0

AZIMUTH_PROBE_DEG = 0.5
RANGE_NOISE_M = 0.02
GROUND_NOISE_M = 0.02
DROPOUT = 0.02
MAX_RANGE_M = 80.0
FOV_DEG = 180.0
MARKING_Y_M = (-LANE_Y_M / 2.0, LANE_Y_M / 2.0)


@dataclass(frozen=True)
class DriveConfig:
    """What to generate; counts are spread over their ranges (stratified, seeded order).

    Point counts vary per frame over ``points_range``; object and agent counts per segment
    of ``segment_frames`` frames, each segment a new stretch of street ahead of the ego.
    """

    seed: int = 0
    frames: int = 60
    period_s: float = 0.1
    segment_frames: int = 20
    points_range: tuple[int, int] = (5_000, 150_000)
    objects_range: tuple[int, int] = (0, 80)
    agents_range: tuple[int, int] = (0, 64)
    ego_speed_mps: float = 6.0
    occluder: bool = True
    sensor_height_m: float = SENSOR_HEIGHT_M

    def __post_init__(self) -> None:
        if self.frames < 1 or self.segment_frames < 1 or not 0.0 < self.period_s < math.inf:
            raise ConfigError("frames and segment_frames must be >= 1 and period_s > 0")
        for name in ("points_range", "objects_range", "agents_range"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ConfigError(f"{name} must be 0 <= min <= max, got {(lo, hi)}")
        if self.points_range[0] < 1:
            raise ConfigError("points_range must start at >= 1 point")
        if self.agents_range[1] > self.objects_range[1]:
            raise ConfigError("agents are objects: agents_range cannot exceed objects_range")
        if not (math.isfinite(self.ego_speed_mps) and self.ego_speed_mps >= 0.0):
            raise ConfigError(f"ego_speed_mps must be finite and >= 0, got {self.ego_speed_mps}")
        check_seed("seed", self.seed)


@dataclass(frozen=True)
class DriveFrame:
    """One scan: points in the sensor frame, the ego pose, and the truth of its segment.

    ``truth`` (TRACK_DTYPE, odometry frame) holds every object of the segment with its true
    id and velocity; ``num_points`` is the returns it gave in this scan (0: hidden).
    ``visible`` (OBSTACLE_DTYPE, sensor frame) holds the objects with returns.
    """

    index: int
    stamp_s: float
    points: np.ndarray
    pose: tuple[float, float, float]
    truth: np.ndarray
    visible: np.ndarray


def ego_pose(config: DriveConfig, t_s: float) -> tuple[float, float, float, float, float]:
    """(x, y, yaw, speed, yaw rate) of the ego at time ``t_s`` on its weaving path."""
    omega = 2.0 * math.pi / WEAVE_PERIOD_S
    v = config.ego_speed_mps
    x = v * t_s
    y = WEAVE_M * math.sin(omega * t_s)
    dy = WEAVE_M * omega * math.cos(omega * t_s)
    ddy = -WEAVE_M * omega * omega * math.sin(omega * t_s)
    yaw = math.atan2(dy, v) if v > 0 else 0.0
    yaw_rate = v * ddy / (v * v + dy * dy) if v > 0 else 0.0
    return x, y, yaw, math.hypot(v, dy), yaw_rate


def stratified(rng: np.random.Generator, lo: float, hi: float, n: int, log: bool) -> np.ndarray:
    """``n`` values spread evenly over [lo, hi] (log-spaced if asked), in seeded random order."""
    if n == 1:
        values = np.array([math.sqrt(lo * hi) if log else (lo + hi) / 2.0])
    elif log:
        values = np.geomspace(max(lo, 1e-9), hi, n)
    else:
        values = np.linspace(lo, hi, n)
    return rng.permutation(values)


@dataclass
class _Segment:
    """Objects of one stretch of street: sizes, labels, ids and positions at every step."""

    ids: np.ndarray
    labels: np.ndarray
    sizes: np.ndarray
    xy: np.ndarray
    yaw: np.ndarray
    velocity: np.ndarray
    pacer: int


def _sizes(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    sizes = np.zeros((labels.size, 3))
    for label, mean, spread in (
        (LABEL_CAR, CAR_SIZE_M, CAR_SIZE_SPREAD_M),
        (LABEL_PEDESTRIAN, PEDESTRIAN_SIZE_M, PEDESTRIAN_SIZE_SPREAD_M),
    ):
        rows = labels == label
        drawn = rng.normal(mean, spread, size=(int(rows.sum()), 3))
        sizes[rows] = np.maximum(drawn, np.asarray(mean) - 2.0 * np.asarray(spread))
    poles = labels == LABEL_POLE
    width = rng.uniform(*POLE_WIDTH_M, size=int(poles.sum()))
    sizes[poles] = np.c_[width, width, rng.uniform(*POLE_HEIGHT_M, size=width.size)]
    return sizes


def _place(
    rng: np.random.Generator,
    kinds: list[str],
    half: np.ndarray,
    x_range: tuple[float, float],
    fixed: list[tuple[float, float, float, float]],
) -> np.ndarray:
    """Centres ``[K, 2]`` by rejection: axis-aligned extents ``half [K, 2]`` may not overlap
    (``MIN_GAP_M`` apart) nor reach into the ego corridor."""
    placed = list(fixed)
    centres = np.zeros((len(kinds), 2))
    y_max = 30.0 + PLACE_MARGIN_M
    for k in np.argsort(-half.prod(axis=1), kind="stable"):
        x = rng.uniform(*x_range, PLACEMENT_TRIES)
        side = rng.choice((-1.0, 1.0), PLACEMENT_TRIES)
        kind = kinds[k]
        if kind in ("parked", "lane"):
            row = PARKED_Y_M if kind == "parked" else LANE_Y_M
            y = side * row + rng.normal(0.0, ROW_SPREAD_M, PLACEMENT_TRIES)
        elif kind == "sidewalk":
            y = side * rng.uniform(*SIDEWALK_Y_M, PLACEMENT_TRIES)
        else:
            y = side * rng.uniform(EGO_CORRIDOR_M + 1.0, y_max, PLACEMENT_TRIES)
        ok = (np.abs(y) >= EGO_CORRIDOR_M + half[k, 1]) & (
            np.hypot(x - x_range[0], y) >= MIN_RANGE_M
        )
        if placed:
            o = np.asarray(placed)
            apart_x = np.abs(x[:, None] - o[None, :, 0]) >= half[k, 0] + o[None, :, 2] + MIN_GAP_M
            apart_y = np.abs(y[:, None] - o[None, :, 1]) >= half[k, 1] + o[None, :, 3] + MIN_GAP_M
            ok &= (apart_x | apart_y).all(axis=1)
        hits = np.flatnonzero(ok)
        if hits.size == 0:
            raise ConfigError(
                f"cannot place {len(kinds)} objects on the street ({kind} {k}); ask for fewer"
            )
        centres[k] = x[hits[0]], y[hits[0]]
        placed.append((x[hits[0]], y[hits[0]], half[k, 0], half[k, 1]))
    return centres


def _segment(
    config: DriveConfig,
    rng: np.random.Generator,
    start_x: float,
    steps: int,
    objects: int,
    agents: int,
    first_id: int,
    seed: int,
) -> _Segment:
    moving_cars = round(agents * MOVING_CAR_SHARE)
    pedestrians = agents - moving_cars
    static = objects - agents
    parked = round(static * PARKED_SHARE)
    poles = static - parked
    labels = np.r_[
        np.full(moving_cars + parked, LABEL_CAR),
        np.full(poles, LABEL_POLE),
        np.full(pedestrians, LABEL_PEDESTRIAN),
    ].astype(np.uint32)
    kinds = ["lane"] * moving_cars + ["parked"] * parked + ["sidewalk"] * poles
    kinds += ["sidewalk" if rng.random() < 0.6 else "free" for _ in range(pedestrians)]
    sizes = _sizes(rng, labels)
    sizes[:, :2] = np.sort(sizes[:, :2], axis=1)[:, ::-1]
    pacer = -1
    fixed: list[tuple[float, float, float, float]] = []
    pacer_ahead = 0.0
    if config.occluder and moving_cars > 0 and config.ego_speed_mps > 0:
        pacer = 0
        sizes[0] = TRUCK_SIZE_M
        pacer_ahead = float(rng.uniform(*TRUCK_AHEAD_M))
    # Cars stand along the street; anything else may face any way.
    radius = 0.5 * np.hypot(sizes[:, 0], sizes[:, 1])
    car = labels == LABEL_CAR
    half = np.c_[np.where(car, sizes[:, 0] / 2, radius), np.where(car, sizes[:, 1] / 2, radius)]
    travel = config.ego_speed_mps * steps * config.period_s
    x_range = (start_x, start_x + 60.0 + travel + PLACE_MARGIN_M)
    if pacer == 0:
        fixed.append((start_x + pacer_ahead, -LANE_Y_M, half[0, 0], half[0, 1]))
        rest = _place(rng, kinds[1:], half[1:], x_range, fixed)
        centres = np.r_[[[start_x + pacer_ahead, -LANE_Y_M]], rest]
    else:
        centres = _place(rng, kinds, half, x_range, fixed)

    k_n = labels.size
    xy = np.zeros((k_n, steps, 2))
    yaw = np.zeros((k_n, steps))
    velocity = np.zeros((k_n, steps, 2))
    dt = config.period_s
    for k in range(k_n):
        if kinds[k] == "lane":
            same = centres[k, 1] < 0
            if k == pacer:
                speed = config.ego_speed_mps
            else:
                speed = rng.uniform(*(SAME_SPEED_MPS if same else ONCOMING_SPEED_MPS))
            heading = 0.0 if same else math.pi
            vel = np.array([math.cos(heading), math.sin(heading)]) * speed
            xy[k] = centres[k] + vel * dt * np.arange(steps)[:, None]
            yaw[k], velocity[k] = heading, vel
        else:
            xy[k] = centres[k]
            yaw[k] = rng.uniform(-math.pi, math.pi) if labels[k] != LABEL_CAR else 0.0
    walkers = np.flatnonzero(labels == LABEL_PEDESTRIAN)
    if walkers.size:
        tracks = pedestrian_scene(seed=seed, num_agents=walkers.size, num_steps=steps + 1, dt_s=dt)
        path = tracks.astype(np.float64) - tracks[:, :1].astype(np.float64)
        xy[walkers] = centres[walkers, None, :] + path[:, :steps]
        step = np.diff(path, axis=1)
        velocity[walkers] = step[:, :steps] / dt
        moving = np.hypot(step[..., 0], step[..., 1])[:, :steps] > 1e-3
        walk_heading = np.arctan2(step[..., 1], step[..., 0])[:, :steps]
        yaw[walkers] = np.where(moving, walk_heading, yaw[walkers])
    ids = np.arange(first_id, first_id + k_n, dtype=np.uint32)
    return _Segment(ids, labels, sizes, xy, yaw, velocity, pacer)


def _scan(
    config: DriveConfig,
    rng: np.random.Generator,
    boxes: np.ndarray,
    labels: np.ndarray,
    pose: tuple[float, float, float],
    num_points: int,
) -> tuple[np.ndarray, np.ndarray]:
    """A scan of exactly ``num_points`` points (sensor frame) and the box each one hit."""
    ground = np.array([0.0, 0.0, 1.0, config.sensor_height_m])

    def cast(step_deg: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dirs, _ = lidar.ray_directions(FOV_DEG, step_deg)
        return dirs, *lidar.cast(dirs, boxes, ground, MAX_RANGE_M, (FOV_DEG, step_deg))

    probe, t_probe, _ = cast(AZIMUTH_PROBE_DEG)
    ratio = max(float(np.isfinite(t_probe).mean()) * (1.0 - DROPOUT), 1e-3)
    step_deg = AZIMUTH_PROBE_DEG * probe.shape[0] * ratio / max(num_points, 1) * 0.98
    step_deg = min(max(step_deg, 0.005), AZIMUTH_PROBE_DEG)
    dirs, t, hit = cast(step_deg)
    returns = np.isfinite(t) & (rng.random(t.size) >= DROPOUT)
    index = np.flatnonzero(returns)
    if index.size == 0:
        raise ConfigError("the generated scan returned no points")
    picked, duplicate = lidar.resample(rng, index.size, num_points)
    index = index[picked]
    rng_t = t[index] + rng.normal(0.0, RANGE_NOISE_M, index.size)
    xyz = dirs[index] * rng_t[:, None]
    hit = hit[index]
    ground = hit < 0
    xyz[ground, 2] += rng.normal(0.0, GROUND_NOISE_M, int(ground.sum()))
    xyz[duplicate] += rng.normal(0.0, UPSAMPLE_JITTER_M, (int(duplicate.sum()), 3))
    _, y0, yaw0 = pose
    world_y = y0 + math.sin(yaw0) * xyz[:, 0] + math.cos(yaw0) * xyz[:, 1]
    intensity = lidar.surface_intensity(rng, world_y, hit, labels, MARKING_Y_M)
    return np.c_[xyz, intensity].astype(np.float32), hit


def _boxes_in_sensor(
    segment: _Segment, step: int, pose: tuple[float, float, float], sensor_height_m: float
) -> np.ndarray:
    x0, y0, yaw0 = pose
    c, s = math.cos(yaw0), math.sin(yaw0)
    dx = segment.xy[:, step, 0] - x0
    dy = segment.xy[:, step, 1] - y0
    boxes = np.zeros(segment.ids.size, dtype=OBSTACLE_DTYPE)
    boxes["x"], boxes["y"] = c * dx + s * dy, -s * dx + c * dy
    boxes["length"], boxes["width"], boxes["height"] = segment.sizes.T
    boxes["z"] = -sensor_height_m + segment.sizes[:, 2] / 2.0
    boxes["yaw"] = np.angle(np.exp(1j * (segment.yaw[:, step] - yaw0)))
    boxes["label"], boxes["score"] = segment.labels, 1.0
    return boxes


def drive_frames(config: DriveConfig) -> Iterator[DriveFrame]:
    """The frames of the drive, generated lazily (a 150,000-point scan is ~2.4 MB)."""
    rng = np.random.default_rng(config.seed)
    segments = math.ceil(config.frames / config.segment_frames)
    points = stratified(rng, *config.points_range, config.frames, log=True).round().astype(int)
    objects = stratified(rng, *config.objects_range, segments, log=False).round().astype(int)
    lo_a, hi_a = config.agents_range
    share = hi_a / config.objects_range[1] if config.objects_range[1] else 0.0
    agents = np.clip(np.round(objects * share), lo_a, hi_a).astype(int)
    agents = np.minimum(agents, objects)
    next_id = 1
    segment: _Segment | None = None
    for k in range(config.frames):
        s, step = divmod(k, config.segment_frames)
        t = k * config.period_s
        if step == 0:
            steps = min(config.segment_frames, config.frames - k)
            seed = config.seed * 100_003 + s
            start_x = ego_pose(config, t)[0]
            segment = _segment(
                config, rng, start_x, steps, int(objects[s]), int(agents[s]), next_id, seed
            )
            if segment.pacer >= 0:
                ego_y = ego_pose(config, t)[1]
                segment.xy[segment.pacer, :, 1] = ego_y - LANE_Y_M
            next_id += segment.ids.size
        assert segment is not None
        x, y, yaw, _, _ = ego_pose(config, t)
        pose = (x, y, yaw)
        boxes = _boxes_in_sensor(segment, step, pose, config.sensor_height_m)
        cloud, hit = _scan(config, rng, boxes, segment.labels, pose, int(points[k]))
        returns = np.bincount(hit[hit >= 0], minlength=segment.ids.size)
        boxes["num_points"] = returns
        truth = np.zeros(segment.ids.size, dtype=TRACK_DTYPE)
        truth["x"], truth["y"] = segment.xy[:, step, 0], segment.xy[:, step, 1]
        truth["z"] = boxes["z"]
        truth["length"], truth["width"], truth["height"] = segment.sizes.T
        truth["yaw"] = segment.yaw[:, step]
        truth["score"], truth["label"], truth["num_points"] = 1.0, segment.labels, returns
        truth["id"] = segment.ids
        truth["vx"], truth["vy"] = segment.velocity[:, step, 0], segment.velocity[:, step, 1]
        truth["age"] = step
        yield DriveFrame(
            index=k,
            stamp_s=t,
            points=cloud,
            pose=pose,
            truth=truth,
            visible=boxes[returns > 0],
        )
