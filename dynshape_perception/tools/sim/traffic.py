"""A seeded urban scene with ground truth: cars, cyclists and pedestrians crossing and occluding."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np

from dynshape_perception.config import check_seed
from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.records import LABEL_CAR, LABEL_PEDESTRIAN, OBSTACLE_DTYPE
from dynshape_perception.tools.sim import lidar
from dynshape_perception.tools.sim.lidar import SENSOR_HEIGHT_M

CLASSES = ("car", "cyclist", "pedestrian")
CAR, CYCLIST, PEDESTRIAN = range(3)
SIZE_M = {CAR: (4.4, 1.8, 1.5), CYCLIST: (1.8, 0.6, 1.7), PEDESTRIAN: (0.6, 0.6, 1.75)}
SIZE_SPREAD_M = {CAR: (0.3, 0.1, 0.1), CYCLIST: (0.1, 0.05, 0.05), PEDESTRIAN: (0.05, 0.05, 0.1)}
# Surfaces the lidar sees: a cyclist reflects as a pedestrian does.
SURFACE_LABEL = {CAR: LABEL_CAR, CYCLIST: LABEL_PEDESTRIAN, PEDESTRIAN: LABEL_PEDESTRIAN}

# Street layout, world metres: the ego drives along +x in the lane y = 0 towards a cross
# street at CROSS_X_M; pedestrians cross at CROSSWALK_X_M, cars park in rows on the right.
LANE_Y_M = 3.5
BIKE_LANE_Y_M = (-3.9, 4.6)
PARKED_Y_M = -6.0
SIDEWALK_Y_M = 8.5
CROSS_X_M = 42.0
CROSSWALK_X_M = 33.0
PARKED_SPANS_M = ((6.0, 29.0), (48.0, 70.0))
PARKED_GAP_M = (1.2, 3.5)
CAR_SPEED_MPS = (6.0, 10.0)
CYCLIST_SPEED_MPS = (3.5, 5.5)
WALK_SPEED_MPS = (1.1, 1.6)
# Pedestrians crossing towards each other pass this far apart (centres, along the street):
# closer than the clustering keeps apart, so their returns merge for a few scans.
PASSING_OFFSET_M = 0.9
FAR_M = 90.0
MIN_GAP_M = 0.1
START_TRIES = 64

FOV_DEG = 180.0
MAX_RANGE_M = 80.0
RANGE_NOISE_M = 0.02
DROPOUT = 0.02
TRUTH_DTYPE = np.dtype(
    [
        ("id", "<u4"),
        ("cls", "<u1"),
        ("x", "<f8"),
        ("y", "<f8"),
        ("yaw", "<f8"),
        ("length", "<f4"),
        ("width", "<f4"),
        ("height", "<f4"),
        ("vx", "<f4"),
        ("vy", "<f4"),
        ("num_points", "<u4"),
    ]
)


@dataclass(frozen=True)
class TrafficConfig:
    """What to generate: ``frames`` scans ``period_s`` apart; the rest sets the density."""

    seed: int = 0
    frames: int = 100
    period_s: float = 0.1
    ego_speed_mps: float = 3.0
    crossing_pairs: int = 3
    sidewalk_walkers: int = 6
    moving_cars: int = 5
    cyclists: int = 3
    azimuth_step_deg: float = 0.2
    sensor_height_m: float = SENSOR_HEIGHT_M

    def __post_init__(self) -> None:
        if self.frames < 1 or not (math.isfinite(self.period_s) and self.period_s > 0.0):
            raise ConfigError("frames must be >= 1 and period_s > 0")
        if not (math.isfinite(self.ego_speed_mps) and 0.0 <= self.ego_speed_mps <= 15.0):
            raise ConfigError(f"ego_speed_mps must be in [0, 15], got {self.ego_speed_mps}")
        for name in ("crossing_pairs", "sidewalk_walkers", "moving_cars", "cyclists"):
            if not 0 <= getattr(self, name) <= 32:
                raise ConfigError(f"{name} must be in [0, 32], got {getattr(self, name)}")
        if not 0.05 <= self.azimuth_step_deg <= 1.0:
            raise ConfigError(f"azimuth_step_deg must be in [0.05, 1], got {self.azimuth_step_deg}")
        check_seed("seed", self.seed)

    @property
    def duration_s(self) -> float:
        return self.frames * self.period_s


@dataclass(frozen=True)
class Actor:
    """One road user: its class, size and a straight path at constant speed, from ``t0_s``."""

    id: int
    cls: int
    size: tuple[float, float, float]
    start: tuple[float, float]
    velocity: tuple[float, float]
    t0_s: float = 0.0
    yaw: float | None = None

    def at(self, t_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Centres ``[F, 2]``, headings ``[F]`` and whether it exists at each time."""
        dt = np.asarray(t_s, dtype=np.float64) - self.t0_s
        xy = np.asarray(self.start)[None, :] + dt[:, None] * np.asarray(self.velocity)[None, :]
        vx, vy = self.velocity
        yaw = self.yaw if self.yaw is not None else math.atan2(vy, vx)
        return xy, np.full(dt.shape, yaw), dt >= 0.0


@dataclass(frozen=True)
class TrafficFrame:
    """One scan: points (sensor frame, x forward), the ego pose, and every actor's truth.

    ``truth`` (TRUTH_DTYPE, world frame) holds the actors that exist at this time, with the
    returns each gave (0: hidden, out of view or out of range).
    """

    index: int
    stamp_s: float
    points: np.ndarray
    pose: tuple[float, float, float]
    truth: np.ndarray


def ego_pose(config: TrafficConfig, t_s: float) -> tuple[float, float, float]:
    return config.ego_speed_mps * t_s, 0.0, 0.0


def _size(rng: np.random.Generator, cls: int) -> tuple[float, float, float]:
    drawn = rng.normal(SIZE_M[cls], SIZE_SPREAD_M[cls])
    low = np.asarray(SIZE_M[cls]) - 2.0 * np.asarray(SIZE_SPREAD_M[cls])
    length, width, height = np.maximum(drawn, low).tolist()
    return float(length), float(width), float(height)


def _half_extent(actor: Actor) -> tuple[float, float]:
    """Half extents along x and y of the footprint's bounding rectangle."""
    yaw = actor.yaw if actor.yaw is not None else math.atan2(actor.velocity[1], actor.velocity[0])
    c, s = abs(math.cos(yaw)), abs(math.sin(yaw))
    length, width = actor.size[0] / 2.0, actor.size[1] / 2.0
    return c * length + s * width, s * length + c * width


def _clear(actor: Actor, placed: list[Actor], times: np.ndarray) -> bool:
    """Whether ``actor`` keeps clear of every placed one at every scan (footprints' bounding
    rectangles, MIN_GAP_M apart on one axis at least)."""
    xy, _, alive = actor.at(times)
    hx, hy = _half_extent(actor)
    for other in placed:
        oxy, _, oalive = other.at(times)
        both = alive & oalive
        if not both.any():
            continue
        ox, oy = _half_extent(other)
        apart_x = np.abs(xy[both, 0] - oxy[both, 0]) >= hx + ox + MIN_GAP_M
        apart_y = np.abs(xy[both, 1] - oxy[both, 1]) >= hy + oy + MIN_GAP_M
        if not (apart_x | apart_y).all():
            return False
    return True


class _Cast:
    def __init__(self, config: TrafficConfig, rng: np.random.Generator) -> None:
        self.config = config
        self.rng = rng
        self.times = np.arange(config.frames) * config.period_s
        self.actors: list[Actor] = []

    def add(self, make: Callable[[int], Actor], tries: int = START_TRIES) -> None:
        """Place the first of ``tries`` draws of ``make(id)`` that keeps clear of the rest."""
        for _ in range(tries):
            actor = make(len(self.actors) + 1)
            if _clear(actor, self.actors, self.times):
                self.actors.append(actor)
                return

    def start_time(self) -> float:
        return float(self.rng.uniform(-0.3, 0.8) * self.config.duration_s)


def _parked(i: int, size: tuple[float, float, float], centre: tuple[float, float]) -> Actor:
    return Actor(i, CAR, size, centre, (0.0, 0.0), -1.0, 0.0)


def _crossing_pair(rng: np.random.Generator, meet_s: float, late: bool) -> list[Actor]:
    """Two pedestrians who cross the street from either side and pass each other mid-road at
    ``meet_s`` (ids are given when placed)."""
    speed = float(rng.uniform(*WALK_SPEED_MPS))
    x = CROSSWALK_X_M + float(rng.uniform(-1.5, 1.5))
    t0 = meet_s - SIDEWALK_Y_M / speed
    lag = 0.2 if late else -0.2
    return [
        Actor(
            0,
            PEDESTRIAN,
            _size(rng, PEDESTRIAN),
            (x - PASSING_OFFSET_M / 2, -SIDEWALK_Y_M),
            (0.0, speed),
            t0,
        ),
        Actor(
            0,
            PEDESTRIAN,
            _size(rng, PEDESTRIAN),
            (x + PASSING_OFFSET_M / 2, SIDEWALK_Y_M),
            (0.0, -speed),
            t0 + lag,
        ),
    ]


def actors(config: TrafficConfig) -> list[Actor]:
    """The scene's road users, placed by seeded draws that keep them from overlapping."""
    rng = np.random.default_rng(config.seed)
    cast = _Cast(config, rng)
    for lo, hi in PARKED_SPANS_M:
        x = lo + float(rng.uniform(0.0, 2.0))
        while True:
            size = _size(rng, CAR)
            if x + size[0] > hi:
                break
            centre = (x + size[0] / 2.0, PARKED_Y_M + float(rng.normal(0.0, 0.15)))
            cast.add(partial(_parked, size=size, centre=centre))
            x += size[0] + float(rng.uniform(*PARKED_GAP_M))
    ego_end = config.ego_speed_mps * config.duration_s
    slot = config.duration_s / max(config.crossing_pairs, 1)
    for k in range(config.crossing_pairs):
        for _ in range(START_TRIES):
            pair = _crossing_pair(rng, (k + float(rng.uniform(0.1, 0.9))) * slot, k % 2 == 1)
            if all(_clear(a, cast.actors, cast.times) for a in pair):
                for a in pair:
                    cast.actors.append(
                        Actor(len(cast.actors) + 1, a.cls, a.size, a.start, a.velocity, a.t0_s)
                    )
                break
    for k in range(config.sidewalk_walkers):
        side = SIDEWALK_Y_M if k % 2 else -SIDEWALK_Y_M

        def walker(i: int, side: float = side) -> Actor:
            speed = float(rng.uniform(*WALK_SPEED_MPS)) * float(rng.choice((-1.0, 1.0)))
            x = float(rng.uniform(0.0, ego_end + 45.0))
            y = side + float(rng.normal(0.0, 0.4))
            return Actor(i, PEDESTRIAN, _size(rng, PEDESTRIAN), (x, y), (speed, 0.0), -1.0)

        cast.add(walker)
    for k in range(config.moving_cars):
        kind = k % 3

        def car(i: int, kind: int = kind) -> Actor:
            speed = float(rng.uniform(*CAR_SPEED_MPS))
            t0 = cast.start_time()
            size = _size(rng, CAR)
            if kind == 0:
                return Actor(i, CAR, size, (FAR_M, LANE_Y_M), (-speed, 0.0), t0)
            lane = CROSS_X_M + (-1.75 if kind == 1 else 1.75)
            y0 = -40.0 if kind == 1 else 40.0
            return Actor(i, CAR, size, (lane, y0), (0.0, speed if kind == 1 else -speed), t0)

        cast.add(car)
    for k in range(config.cyclists):
        kind = k % 3

        def cyclist(i: int, kind: int = kind) -> Actor:
            speed = float(rng.uniform(*CYCLIST_SPEED_MPS))
            size = _size(rng, CYCLIST)
            if kind == 0:
                x0 = float(rng.uniform(4.0, 20.0))
                return Actor(i, CYCLIST, size, (x0, BIKE_LANE_Y_M[0]), (speed, 0.0), 0.0)
            if kind == 1:
                return Actor(
                    i, CYCLIST, size, (70.0, BIKE_LANE_Y_M[1]), (-speed, 0.0), cast.start_time()
                )
            return Actor(
                i, CYCLIST, size, (CROSS_X_M + 4.0, 30.0), (0.0, -speed), cast.start_time()
            )

        cast.add(cyclist)
    return cast.actors


def _truth_rows(cast: list[Actor], t_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The truth of the actors that exist at ``t_s`` (num_points 0) and their surfaces."""
    rows = []
    for actor in cast:
        xy, yaw, alive = actor.at(np.array([t_s]))
        if alive[0]:
            rows.append(
                (actor.id, actor.cls, xy[0, 0], xy[0, 1], yaw[0], *actor.size, *actor.velocity, 0)
            )
    truth = np.array(rows, dtype=TRUTH_DTYPE)
    surface = np.array([SURFACE_LABEL[int(c)] for c in truth["cls"]], dtype=np.uint32)
    return truth, surface


def boxes_in_sensor(
    truth: np.ndarray, pose: tuple[float, float, float], sensor_height_m: float
) -> np.ndarray:
    """``truth`` rows as OBSTACLE_DTYPE boxes in the sensor frame (z from the sensor)."""
    x0, y0, yaw0 = pose
    c, s = math.cos(yaw0), math.sin(yaw0)
    dx, dy = truth["x"] - x0, truth["y"] - y0
    boxes = np.zeros(truth.size, dtype=OBSTACLE_DTYPE)
    boxes["x"], boxes["y"] = c * dx + s * dy, -s * dx + c * dy
    boxes["length"], boxes["width"], boxes["height"] = (
        truth["length"],
        truth["width"],
        truth["height"],
    )
    boxes["z"] = -sensor_height_m + truth["height"] / 2.0
    boxes["yaw"] = np.angle(np.exp(1j * (truth["yaw"] - yaw0)))
    boxes["score"] = 1.0
    boxes["num_points"] = truth["num_points"]
    return boxes


def traffic_frames(config: TrafficConfig) -> Iterator[TrafficFrame]:
    """The scans of the scene, generated lazily, with each actor's returns counted."""
    cast = actors(config)
    rng = np.random.default_rng([config.seed, 1])
    dirs, _ = lidar.ray_directions(FOV_DEG, config.azimuth_step_deg)
    ground = np.array([0.0, 0.0, 1.0, config.sensor_height_m])
    for k in range(config.frames):
        t = k * config.period_s
        pose = ego_pose(config, t)
        truth, surface = _truth_rows(cast, t)
        boxes = boxes_in_sensor(truth, pose, config.sensor_height_m)
        rng_t, hit = lidar.cast(
            dirs, boxes, ground, MAX_RANGE_M, (FOV_DEG, config.azimuth_step_deg)
        )
        returns = np.isfinite(rng_t) & (rng.random(rng_t.size) >= DROPOUT)
        index = np.flatnonzero(returns)
        if index.size == 0:
            raise ConfigError("the generated scan returned no points")
        ranges = rng_t[index] + rng.normal(0.0, RANGE_NOISE_M, index.size)
        xyz = dirs[index] * ranges[:, None]
        hits = hit[index]
        intensity = lidar.surface_intensity(rng, xyz[:, 1], hits, surface, (LANE_Y_M / 2.0,))
        truth["num_points"] = np.bincount(hits[hits >= 0], minlength=truth.size)
        yield TrafficFrame(k, t, np.c_[xyz, intensity].astype(np.float32), pose, truth)
