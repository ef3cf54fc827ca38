"""Seeded synthetic scenes: ray-cast lidar driving scans, pedestrian tracks, scan sectors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynshape_perception.config import Roi, default_config
from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    OBSTACLE_DTYPE,
)
from dynshape_perception.tools.sim import lidar
from dynshape_perception.tools.sim.lidar import SENSOR_HEIGHT_M, UPSAMPLE_JITTER_M

CAR_SIZE_M = (4.2, 1.8, 1.5)
CAR_SIZE_SPREAD_M = (0.3, 0.1, 0.1)
PEDESTRIAN_SIZE_M = (0.6, 0.6, 1.7)
PEDESTRIAN_SIZE_SPREAD_M = (0.05, 0.05, 0.1)
POLE_WIDTH_M = (0.15, 0.4)
POLE_HEIGHT_M = (3.0, 6.0)
# Street layout: lane centres and parking rows (cars), sidewalks (poles, pedestrians), metres.
CAR_ROWS_Y_M = (-7.0, -3.5, 3.5, 7.0)
SIDEWALK_Y_M = (9.0, 12.0)
LANE_MARKING_Y_M = (-5.25, 0.0, 5.25)
STREET_ALIGNED_SHARE = 0.6
STREET_YAW_SPREAD_RAD = 0.05
ROW_Y_SPREAD_M = 0.3

PLACEMENT_TRIES = 512
# Azimuth steps finer than this would mean more than ~2M rays for a half turn.
MIN_AZIMUTH_STEP_DEG = 0.005
# A second ray cast is done only when the first one misses the requested count by more.
RECAST_TOLERANCE = 0.1

PEDESTRIAN_SPEED_MPS = (1.3, 0.25)
PEDESTRIAN_MIN_CRUISE_MPS = 0.5
PEDESTRIAN_ACCEL_MPS2 = 1.0
HEADING_NOISE_RAD_PER_SQRT_S = 0.08
SPEED_NOISE_MPS_PER_SQRT_S = 0.05
TURN_RATE_RADPS = (0.2, 0.6)
TURN_ANGLE_RAD = (np.pi / 4, np.pi / 2)
STOP_DURATION_S = (1.2, 4.0)
GROUP_OFFSET_M = (0.5, 0.9)
GROUP_FOLLOW_NOISE = 0.02

_STRAIGHT, _TURN, _STOP_GO = 0, 1, 2


@dataclass(frozen=True)
class DrivingScene:
    """A ray-cast scan in the sensor frame (x forward, y left, z up, metres) and its truth.

    ``points`` float32 ``[P, 4]`` (x, y, z, intensity in [0, 1]); ``is_obstacle`` bool
    ``[P]``; ``object_index`` int32 ``[P]``, the row of ``boxes`` a point hit, -1 for ground;
    ``boxes`` OBSTACLE_DTYPE ground truth (yaw is the heading in (-pi, pi], ``num_points``
    the returns on it); ``ground_plane`` float64 ``[4]`` a, b, c, d with a unit normal,
    c > 0, so that height = a*x + b*y + c*z + d.
    """

    points: np.ndarray
    is_obstacle: np.ndarray
    object_index: np.ndarray
    boxes: np.ndarray
    ground_plane: np.ndarray
    seed: int


def _sample_sizes(
    rng: np.random.Generator, count: int, mean: tuple[float, ...], spread: tuple[float, ...]
) -> np.ndarray:
    sizes = rng.normal(mean, spread, size=(count, 3))
    return np.maximum(sizes, np.asarray(mean) - 2.0 * np.asarray(spread))


def _object_catalogue(
    rng: np.random.Generator, num_cars: int, num_poles: int, num_pedestrians: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sizes ``[K, 3]`` (length >= width, height) and labels ``[K]`` of the objects to place."""
    cars = _sample_sizes(rng, num_cars, CAR_SIZE_M, CAR_SIZE_SPREAD_M)
    pedestrians = _sample_sizes(rng, num_pedestrians, PEDESTRIAN_SIZE_M, PEDESTRIAN_SIZE_SPREAD_M)
    pole_width = rng.uniform(*POLE_WIDTH_M, size=num_poles)
    poles = np.c_[pole_width, pole_width, rng.uniform(*POLE_HEIGHT_M, size=num_poles)]
    sizes = np.concatenate([cars, poles, pedestrians]).reshape(-1, 3)
    sizes[:, :2] = np.sort(sizes[:, :2], axis=1)[:, ::-1]
    labels = np.repeat(
        np.array([LABEL_CAR, LABEL_POLE, LABEL_PEDESTRIAN], dtype=np.uint32),
        [num_cars, num_poles, num_pedestrians],
    )
    return sizes, labels


def _candidates(
    rng: np.random.Generator, label: int, area: tuple[float, float, float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """``PLACEMENT_TRIES`` candidate centres ``[T, 2]`` and headings ``[T]`` for one object."""
    x_lo, x_hi, y_lo, y_hi = area
    x = rng.uniform(x_lo, x_hi, PLACEMENT_TRIES)
    y = rng.uniform(y_lo, y_hi, PLACEMENT_TRIES)
    yaw = rng.uniform(-np.pi, np.pi, PLACEMENT_TRIES)
    on_street = rng.random(PLACEMENT_TRIES) < STREET_ALIGNED_SHARE
    if label == LABEL_CAR:
        rows = rng.choice(CAR_ROWS_Y_M, PLACEMENT_TRIES)
        street_yaw = np.where(rows > 0, 0.0, np.pi)
        street_yaw += rng.normal(0.0, STREET_YAW_SPREAD_RAD, PLACEMENT_TRIES)
        y = np.where(on_street, rows + rng.normal(0.0, ROW_Y_SPREAD_M, PLACEMENT_TRIES), y)
        yaw = np.where(on_street, street_yaw, yaw)
    else:
        side = rng.choice((-1.0, 1.0), PLACEMENT_TRIES)
        sidewalk_y = side * rng.uniform(*SIDEWALK_Y_M, PLACEMENT_TRIES)
        y = np.where(on_street, sidewalk_y, y)
    return np.c_[x, y], np.angle(np.exp(1j * yaw))


def _place_objects(
    rng: np.random.Generator,
    sizes: np.ndarray,
    labels: np.ndarray,
    area: tuple[float, float, float, float],
    min_gap_m: float,
    min_range_m: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping centres ``[K, 2]`` and headings ``[K]``, largest objects first."""
    radius = 0.5 * np.hypot(sizes[:, 0], sizes[:, 1])
    centres = np.zeros((sizes.shape[0], 2))
    yaws = np.zeros(sizes.shape[0])
    placed: list[int] = []
    for k in np.argsort(-radius, kind="stable"):
        xy, yaw = _candidates(rng, int(labels[k]), area)
        ok = np.hypot(xy[:, 0], xy[:, 1]) >= radius[k] + min_range_m
        if placed:
            dist = np.linalg.norm(xy[:, None, :] - centres[None, placed], axis=2)
            ok &= (dist >= radius[k] + radius[placed] + min_gap_m).all(axis=1)
        hits = np.flatnonzero(ok)
        if hits.size == 0:
            raise ConfigError(
                f"cannot place {sizes.shape[0]} objects {min_gap_m} m apart in x {area[:2]}, "
                f"y {area[2:]}; ask for fewer"
            )
        centres[k], yaws[k] = xy[hits[0]], yaw[hits[0]]
        placed.append(int(k))
    return centres, yaws


def _cast(
    rng: np.random.Generator,
    dirs: np.ndarray,
    boxes: np.ndarray,
    plane: np.ndarray,
    max_range_m: float,
    range_noise_m: float,
    ground_noise_m: float,
    dropout: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Points ``[P, 3]`` and hit object ``[P]`` (-1 ground) of the rays that return."""
    best, hit_object = lidar.cast(dirs, boxes, plane, max_range_m)
    returns = np.isfinite(best) & (rng.random(dirs.shape[0]) >= dropout)
    t = best[returns] + rng.normal(0.0, range_noise_m, int(returns.sum()))
    xyz = dirs[returns] * t[:, None]
    hit_object = hit_object[returns]
    ground = hit_object < 0
    xyz[ground, 2] += rng.normal(0.0, ground_noise_m, int(ground.sum()))
    return xyz, hit_object


def driving_scene(
    seed: int = 0,
    num_points: int | None = None,
    num_cars: int = 8,
    num_poles: int = 6,
    num_pedestrians: int = 5,
    *,
    roi: Roi | None = None,
    fov_deg: float = 180.0,
    azimuth_step_deg: float = 0.18,
    max_range_m: float = 80.0,
    sensor_height_m: float = SENSOR_HEIGHT_M,
    max_slope: float = 0.02,
    outside_margin_m: float = 8.0,
    min_gap_m: float = 1.0,
    min_range_m: float = 3.0,
    range_noise_m: float = 0.02,
    ground_noise_m: float = 0.02,
    dropout: float = 0.02,
) -> DrivingScene:
    """Ray-cast a spinning 64-beam lidar into a street with cars, poles and pedestrians.

    The sensor sits ``sensor_height_m`` above a ground plane of slope at most ``max_slope``
    and scans ``fov_deg`` centred on x. Objects stand on the ground ``min_gap_m`` apart
    (bounding circles), mostly in the ROI and partly up to ``outside_margin_m`` beyond it;
    only their sensor-facing faces return, and nearer objects shadow farther ones. The
    ground returns in rings whose density falls with range, up to ``max_range_m``, also
    outside the ROI. ``num_points`` sets the exact count: the azimuth step is rescaled to
    come close, then returns are subsampled, or duplicated with a small jitter.
    """
    counts = {"num_cars": num_cars, "num_poles": num_poles, "num_pedestrians": num_pedestrians}
    for name, value in counts.items():
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
    if num_points is not None and num_points < 0:
        raise ConfigError(f"num_points must be >= 0, got {num_points}")
    if not (0.0 < fov_deg <= 360.0 and azimuth_step_deg >= MIN_AZIMUTH_STEP_DEG):
        raise ConfigError(
            f"need 0 < fov_deg <= 360 and azimuth_step_deg >= {MIN_AZIMUTH_STEP_DEG}, "
            f"got {fov_deg}, {azimuth_step_deg}"
        )
    if not (0.0 <= dropout < 1.0 and max_range_m > 0.0 and sensor_height_m > 0.0):
        raise ConfigError(
            f"need 0 <= dropout < 1, max_range_m > 0, sensor_height_m > 0; "
            f"got {dropout}, {max_range_m}, {sensor_height_m}"
        )
    # NaN noise would put NaN in every point; infinite sizes give an empty or endless scan.
    lengths: dict[str, float] = {
        "azimuth_step_deg": azimuth_step_deg,
        "max_range_m": max_range_m,
        "sensor_height_m": sensor_height_m,
        "max_slope": max_slope,
        "outside_margin_m": outside_margin_m,
        "min_gap_m": min_gap_m,
        "min_range_m": min_range_m,
        "range_noise_m": range_noise_m,
        "ground_noise_m": ground_noise_m,
    }
    for name, length in lengths.items():
        if not (np.isfinite(length) and length >= 0.0):
            raise ConfigError(f"{name} must be a finite number >= 0, got {length!r}")
    roi = roi or default_config().roi
    rng = np.random.default_rng(seed)

    slope_x, slope_y = rng.uniform(-max_slope, max_slope, size=2)
    normal = np.array([-slope_x, -slope_y, 1.0])
    norm = float(np.linalg.norm(normal))
    plane = np.r_[normal, sensor_height_m] / norm

    sizes, labels = _object_catalogue(rng, num_cars, num_poles, num_pedestrians)
    area = (
        max(roi.x_m[0], 0.0),
        roi.x_m[1] + outside_margin_m,
        roi.y_m[0] - outside_margin_m,
        roi.y_m[1] + outside_margin_m,
    )
    centres, yaws = _place_objects(rng, sizes, labels, area, min_gap_m, min_range_m)
    boxes = np.zeros(sizes.shape[0], dtype=OBSTACLE_DTYPE)
    ground_z = -(plane[0] * centres[:, 0] + plane[1] * centres[:, 1] + plane[3]) / plane[2]
    boxes["x"], boxes["y"] = centres[:, 0], centres[:, 1]
    boxes["z"] = ground_z + sizes[:, 2] / 2.0
    boxes["length"], boxes["width"], boxes["height"] = sizes.T
    boxes["yaw"], boxes["label"], boxes["score"] = yaws, labels, 1.0

    def cast(step_deg: float) -> tuple[np.ndarray, np.ndarray]:
        dirs, _ = lidar.ray_directions(fov_deg, step_deg)
        return _cast(rng, dirs, boxes, plane, max_range_m, range_noise_m, ground_noise_m, dropout)

    xyz, hit_object = cast(azimuth_step_deg)
    if (
        num_points is not None
        and xyz.shape[0]
        and (abs(xyz.shape[0] - num_points) > RECAST_TOLERANCE * num_points)
    ):
        step = max(azimuth_step_deg * xyz.shape[0] / max(num_points, 1), MIN_AZIMUTH_STEP_DEG)
        xyz, hit_object = cast(step)
    if num_points is not None:
        if xyz.shape[0] == 0 and num_points > 0:
            raise ConfigError("the scene returned no points to resample; widen fov_deg")
        index, duplicate = lidar.resample(rng, xyz.shape[0], num_points)
        xyz, hit_object = xyz[index], hit_object[index]
        xyz[duplicate] += rng.normal(0.0, UPSAMPLE_JITTER_M, (int(duplicate.sum()), 3))

    intensity = lidar.surface_intensity(rng, xyz[:, 1], hit_object, labels, LANE_MARKING_Y_M)
    boxes["num_points"] = np.bincount(hit_object[hit_object >= 0], minlength=boxes.shape[0])
    points = np.c_[xyz, intensity].astype(np.float32)
    return DrivingScene(
        points=points,
        is_obstacle=hit_object >= 0,
        object_index=hit_object,
        boxes=boxes,
        ground_plane=plane,
        seed=seed,
    )


def pedestrian_scene(
    seed: int = 0,
    num_agents: int = 12,
    num_steps: int = 20,
    dt_s: float = 0.4,
    *,
    area_m: float = 20.0,
    group_share: float = 0.3,
    turn_share: float = 0.25,
    stop_share: float = 0.25,
    max_speed_mps: float = 2.0,
) -> np.ndarray:
    """Kinematic pedestrian tracks, float32 ``[A, S, 2]`` (x, y in metres), one row per step.

    Agents start anywhere in a square of side ``area_m`` and walk at about 1.3 m/s with
    heading and speed noise; ``turn_share`` of the leaders turn through 45-90 deg at some
    point, ``stop_share`` stop for 1.2-4 s and start again, and ``group_share`` of all
    agents walk beside a leader (same heading and speed, 0.5-0.9 m to its side). Speed
    changes by at most 1 m/s^2 and never exceeds ``max_speed_mps``.
    """
    if num_agents < 0 or num_steps < 1 or not (np.isfinite(dt_s) and dt_s > 0.0):
        raise ConfigError(
            f"need num_agents >= 0, num_steps >= 1, finite dt_s > 0; "
            f"got {num_agents}, {num_steps}, {dt_s}"
        )
    if not (np.isfinite(area_m) and area_m > 0.0):
        raise ConfigError(f"area_m must be a finite number > 0, got {area_m!r}")
    shares = (group_share, turn_share, stop_share)
    if not all(0.0 <= share <= 1.0 for share in shares) or turn_share + stop_share > 1.0:
        raise ConfigError(f"behaviour shares must be in [0, 1] with turn + stop <= 1, got {shares}")
    if not max_speed_mps > PEDESTRIAN_MIN_CRUISE_MPS:
        raise ConfigError(f"max_speed_mps must exceed {PEDESTRIAN_MIN_CRUISE_MPS}")
    rng = np.random.default_rng(seed)
    agents = np.arange(num_agents)

    num_followers = min(round(group_share * num_agents), max(num_agents - 1, 0))
    num_leaders = num_agents - num_followers
    leader_of = np.r_[agents[:num_leaders], rng.integers(0, max(num_leaders, 1), num_followers)]
    follower = agents >= num_leaders

    behaviour = rng.choice(
        (_STRAIGHT, _TURN, _STOP_GO),
        size=num_agents,
        p=(1.0 - turn_share - stop_share, turn_share, stop_share),
    )
    cruise = np.clip(
        rng.normal(*PEDESTRIAN_SPEED_MPS, num_agents), PEDESTRIAN_MIN_CRUISE_MPS, max_speed_mps
    )
    turn_rate = rng.uniform(*TURN_RATE_RADPS, num_agents) * rng.choice((-1.0, 1.0), num_agents)
    turn_start = rng.uniform(0.0, num_steps * dt_s, num_agents)
    turn_end = turn_start + rng.uniform(*TURN_ANGLE_RAD, num_agents) / np.abs(turn_rate)
    stop_start = rng.uniform(0.0, num_steps * dt_s, num_agents)
    stop_end = stop_start + rng.uniform(*STOP_DURATION_S, num_agents)

    heading = rng.uniform(-np.pi, np.pi, num_agents)
    position = rng.uniform(-area_m / 2.0, area_m / 2.0, (num_agents, 2))
    heading[follower] = heading[leader_of[follower]]
    side = rng.choice((-1.0, 1.0), num_agents) * rng.uniform(*GROUP_OFFSET_M, num_agents)
    lateral = np.c_[-np.sin(heading), np.cos(heading)] * side[:, None]
    position[follower] = position[leader_of[follower]] + lateral[follower]
    speed = cruise.copy()

    max_dv = PEDESTRIAN_ACCEL_MPS2 * dt_s
    tracks = np.empty((num_agents, num_steps, 2), dtype=np.float32)
    for step in range(num_steps):
        tracks[:, step] = position
        t = step * dt_s
        stopping = (behaviour == _STOP_GO) & (t >= stop_start) & (t < stop_end)
        target = np.where(stopping, 0.0, cruise)
        speed += np.clip(target - speed, -max_dv, max_dv)
        speed += rng.normal(0.0, SPEED_NOISE_MPS_PER_SQRT_S * np.sqrt(dt_s), num_agents)
        speed = np.clip(speed, 0.0, max_speed_mps)
        turning = (behaviour == _TURN) & (t >= turn_start) & (t < turn_end)
        heading += np.where(turning, turn_rate * dt_s, 0.0)
        heading += rng.normal(0.0, HEADING_NOISE_RAD_PER_SQRT_S * np.sqrt(dt_s), num_agents)
        # Walk beside the leader: copy its heading and speed, with a little noise.
        heading[follower] = heading[leader_of[follower]] + rng.normal(
            0.0, GROUP_FOLLOW_NOISE, num_followers
        )
        speed[follower] = np.clip(
            speed[leader_of[follower]] + rng.normal(0.0, GROUP_FOLLOW_NOISE, num_followers),
            0.0,
            max_speed_mps,
        )
        position = position + dt_s * speed[:, None] * np.c_[np.cos(heading), np.sin(heading)]
    return tracks


# Social force (Helbing and Molnar 1995): relaxation towards the desired velocity, exponential
# repulsion between pedestrians, weaker from behind, and a pull that keeps groups together.
CROWD_SUBSTEPS = 4
RELAXATION_S = 0.5
REPULSION_MPS2 = 2.0
REPULSION_RANGE_M = 0.35
BODY_RADIUS_M = 0.45
# Weight of a neighbour straight behind, against 1 straight ahead.
REPULSION_FROM_BEHIND = 0.35
# Members of a group repel each other this much less: they walk shoulder to shoulder.
GROUP_REPULSION_SHARE = 0.3
GROUP_SPACING_M = 0.6
GROUP_PULL_PER_S2 = 1.5
GROUP_SIZE = (2, 4)
GROUP_SCATTER_M = 0.6
# Walkers steer towards a point this far away, so they cross the scene.
GOAL_DISTANCE_M = 100.0
CROWD_MIN_SPEED_MPS = 0.3
SPEED_CAP_SHARE = 1.3
# The desired heading wanders as an Ornstein-Uhlenbeck process: noise and memory.
WOBBLE_RAD_PER_SQRT_S = 0.15
WOBBLE_MEMORY_S = 3.0
CROWD_TURN_RAD = (np.pi / 6, np.pi / 2)
CROWD_STOP_S = (1.0, 6.0)
# Group members keep their leader's desired speed to within this share.
GROUP_SPEED_SPREAD = 0.05
_DISTANCE_FLOOR_M = 1e-6


@dataclass(frozen=True)
class Crowd:
    """How the pedestrians of a ``crowd_scene`` behave; every share is of agents."""

    area_m: float = 20.0
    speed_mps: float = 1.2
    speed_spread_mps: float = 0.25
    # Agents in groups of 2 to 4 that walk, stop and turn together.
    group_share: float = 0.4
    # Agents (and whole groups) standing for the whole scene: waiting, talking.
    stand_share: float = 0.15
    # Walkers that stop once for 1 to 6 s, then walk on.
    stop_share: float = 0.2
    # Walkers that turn once, by 30 to 90 deg, and keep the new heading.
    turn_share: float = 0.3

    def __post_init__(self) -> None:
        sizes = (self.area_m, self.speed_mps)
        if not all(np.isfinite(v) and v > 0.0 for v in sizes):
            raise ConfigError(f"crowd area_m and speed_mps must be finite and > 0, got {sizes}")
        if not (np.isfinite(self.speed_spread_mps) and self.speed_spread_mps >= 0.0):
            raise ConfigError(f"speed_spread_mps must be >= 0, got {self.speed_spread_mps!r}")
        shares = (self.group_share, self.stand_share, self.stop_share, self.turn_share)
        if not all(0.0 <= share <= 1.0 for share in shares):
            raise ConfigError(f"crowd shares must lie in [0, 1], got {shares}")


def _crowd_groups(rng: np.random.Generator, count: int, share: float) -> np.ndarray:
    """The leader of each agent ``[A]``: itself, or the first member of its group."""
    leader = np.arange(count)
    agent = 0
    while agent < count:
        size = 1
        if agent + 1 < count and rng.random() < share:
            size = min(int(rng.integers(GROUP_SIZE[0], GROUP_SIZE[1] + 1)), count - agent)
        leader[agent : agent + size] = agent
        agent += size
    return leader


def _social_force(
    position: np.ndarray, velocity: np.ndarray, leader: np.ndarray, members: np.ndarray
) -> np.ndarray:
    """Repulsion between pedestrians and the pull of each group's centre, ``[A, 2]``."""
    count = position.shape[0]
    offset = position[:, None] - position[None]
    distance = np.linalg.norm(offset, axis=2) + np.eye(count) / _DISTANCE_FLOOR_M
    away = offset / distance[..., None]
    speed = np.linalg.norm(velocity, axis=1)
    facing = velocity / np.maximum(speed, _DISTANCE_FLOOR_M)[:, None]
    # cos of the angle between my walking direction and the direction to the other.
    ahead = -(away * facing[:, None]).sum(axis=2)
    weight = REPULSION_FROM_BEHIND + (1.0 - REPULSION_FROM_BEHIND) * (1.0 + ahead) / 2.0
    weight = np.where(leader[:, None] == leader[None], weight * GROUP_REPULSION_SHARE, weight)
    magnitude = REPULSION_MPS2 * np.exp((BODY_RADIUS_M - distance) / REPULSION_RANGE_M) * weight
    force = (magnitude[..., None] * away).sum(axis=1)
    centre = np.zeros((count, 2))
    np.add.at(centre, leader, position)
    to_centre = centre[leader] / members[leader][:, None] - position
    gap = np.linalg.norm(to_centre, axis=1)
    pull = np.where(members[leader] > 1, np.maximum(gap - GROUP_SPACING_M, 0.0), 0.0)
    inward = to_centre / np.maximum(gap, _DISTANCE_FLOOR_M)[:, None]
    return force + inward * (GROUP_PULL_PER_S2 * pull)[:, None]


@dataclass(frozen=True)
class SocialPlan:
    """What each agent of a social-force crowd wants, ``[A]`` each: its group's leader and the
    group's size, its desired speed, whether it stands, and its one turn and one stop (times
    in seconds, inf for none)."""

    leader: np.ndarray
    members: np.ndarray
    desired: np.ndarray
    standing: np.ndarray
    turn_at: np.ndarray
    turn_by: np.ndarray
    stop_at: np.ndarray
    stop_end: np.ndarray


def social_substep(
    rng: np.random.Generator,
    plan: SocialPlan,
    position: np.ndarray,
    velocity: np.ndarray,
    wobble: np.ndarray,
    heading: np.ndarray,
    t: float,
    h: float,
    cap: np.ndarray | float,
) -> tuple[np.ndarray, np.ndarray]:
    """One ``h``-second step of the velocities at time ``t``: the wandering heading, then the
    relaxation towards the desired velocity along ``heading`` (turned and halted as planned)
    plus the social force, capped at ``cap`` m/s. Returns (velocity, wobble); moving the
    bodies is the caller's, which may resolve contacts."""
    wobble = wobble + rng.normal(0.0, WOBBLE_RAD_PER_SQRT_S * np.sqrt(h), wobble.shape[0])
    wobble = wobble - wobble * h / WOBBLE_MEMORY_S
    angle = heading + np.where(t >= plan.turn_at, plan.turn_by, 0.0) + wobble
    halted = plan.standing | ((t >= plan.stop_at) & (t < plan.stop_end))
    target = np.c_[np.cos(angle), np.sin(angle)] * (plan.desired * ~halted)[:, None]
    force = (target - velocity) / RELAXATION_S
    force += _social_force(position, velocity, plan.leader, plan.members)
    velocity = velocity + h * force
    speed = np.linalg.norm(velocity, axis=1)
    return velocity * np.minimum(1.0, cap / np.maximum(speed, _DISTANCE_FLOOR_M))[:, None], wobble


def crowd_scene(
    seed: int = 0,
    num_agents: int = 40,
    num_steps: int = 60,
    dt_s: float = 0.4,
    crowd: Crowd | None = None,
) -> np.ndarray:
    """Social-force pedestrian tracks, float32 ``[A, S, 2]`` (x, y in metres), one row per step.

    Agents start anywhere in a square of side ``crowd.area_m`` (its density is
    ``num_agents / area_m**2``) and walk across it at their own desired speed, with a
    wandering heading; groups keep together, some agents stand, stop for a while or turn,
    and everyone gives way to everyone else. Integrated in ``CROWD_SUBSTEPS`` steps per
    ``dt_s``.
    """
    crowd = crowd or Crowd()
    if num_agents < 0 or num_steps < 1 or not (np.isfinite(dt_s) and dt_s > 0.0):
        raise ConfigError(
            f"need num_agents >= 0, num_steps >= 1, finite dt_s > 0; "
            f"got {num_agents}, {num_steps}, {dt_s}"
        )
    rng = np.random.default_rng(seed)
    count = num_agents
    leader = _crowd_groups(rng, count, crowd.group_share)
    members = np.bincount(leader, minlength=count).astype(np.float64)
    desired = np.maximum(
        rng.normal(crowd.speed_mps, crowd.speed_spread_mps, count), CROWD_MIN_SPEED_MPS
    )
    desired = desired[leader] * rng.uniform(1 - GROUP_SPEED_SPREAD, 1 + GROUP_SPEED_SPREAD, count)
    standing = (rng.random(count) < crowd.stand_share)[leader]
    in_group = leader != np.arange(count)
    position = rng.uniform(-crowd.area_m / 2.0, crowd.area_m / 2.0, (count, 2))
    position = position[leader] + in_group[:, None] * rng.normal(0.0, GROUP_SCATTER_M, (count, 2))
    heading = rng.uniform(-np.pi, np.pi, count)[leader]
    goal = position + GOAL_DISTANCE_M * np.c_[np.cos(heading), np.sin(heading)]
    span_s = num_steps * dt_s
    turns = rng.random(count) < crowd.turn_share
    turn_at = np.where(turns, rng.uniform(0.0, span_s, count), np.inf)[leader]
    turn_by = (rng.uniform(*CROWD_TURN_RAD, count) * rng.choice((-1.0, 1.0), count))[leader]
    stops = rng.random(count) < crowd.stop_share
    stop_at = np.where(stops, rng.uniform(0.0, span_s, count), np.inf)[leader]
    stop_end = stop_at + rng.uniform(*CROWD_STOP_S, count)[leader]
    plan = SocialPlan(leader, members, desired, standing, turn_at, turn_by, stop_at, stop_end)
    velocity = np.c_[np.cos(heading), np.sin(heading)] * (desired * ~standing)[:, None]
    wobble = np.zeros(count)
    h = dt_s / CROWD_SUBSTEPS
    cap = np.maximum(SPEED_CAP_SHARE * desired, CROWD_MIN_SPEED_MPS)
    tracks = np.empty((count, num_steps, 2), dtype=np.float32)
    for step in range(num_steps):
        tracks[:, step] = position
        for sub in range(CROWD_SUBSTEPS):
            toward = np.arctan2(goal[:, 1] - position[:, 1], goal[:, 0] - position[:, 0])
            velocity, wobble = social_substep(
                rng, plan, position, velocity, wobble, toward, step * dt_s + sub * h, h, cap
            )
            position = position + h * velocity
    return tracks


def sensor_sectors(
    points: np.ndarray,
    num_sectors: int | np.integer,
    start_azimuth_rad: float = np.pi,
    clockwise: bool = True,
) -> list[np.ndarray]:
    """Split a scan into ``num_sectors`` equal azimuth sectors, in the order a spinning lidar emits.

    The turn starts at ``start_azimuth_rad`` (behind the vehicle by default) and runs
    clockwise seen from above, as a Velodyne spins; points inside a sector come in firing
    order. Sectors a cropped scan does not reach are empty ``[0, C]`` arrays.
    """
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[1] < 2:
        raise ShapeError(f"points must be [P, >=2], got shape {points.shape}")
    if isinstance(num_sectors, bool) or not isinstance(num_sectors, (int, np.integer)):
        raise ConfigError(f"num_sectors must be an integer >= 1, got {num_sectors!r}")
    if num_sectors < 1:
        raise ConfigError(f"num_sectors must be an integer >= 1, got {num_sectors!r}")
    num_sectors = int(num_sectors)
    if not np.isfinite(start_azimuth_rad):
        raise ConfigError(f"start_azimuth_rad must be finite, got {start_azimuth_rad!r}")
    if not np.isfinite(points[:, :2]).all():
        # A NaN azimuth has no sector: it would land in one by accident of the int cast.
        raise InputValueError("points hold NaN or Inf in x or y: no azimuth to sort by")
    azimuth = np.arctan2(points[:, 1].astype(np.float64), points[:, 0].astype(np.float64))
    swept = start_azimuth_rad - azimuth if clockwise else azimuth - start_azimuth_rad
    phase = np.mod(swept, 2.0 * np.pi)
    sector = np.minimum((phase / (2.0 * np.pi) * num_sectors).astype(np.int64), num_sectors - 1)
    order = np.argsort(phase, kind="stable")
    bounds = np.searchsorted(sector[order], np.arange(1, num_sectors))
    return np.split(points[order], bounds)
