"""Synthetic driving scans, pedestrian tracks and scan sectors: geometry, counts, determinism."""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import pytest

from dynshape_perception.config import Roi
from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    OBSTACLE_DTYPE,
)
from dynshape_perception.tools.sim.lidar import SENSOR_HEIGHT_M
from dynshape_perception.tools.sim.scenes import (
    Crowd,
    DrivingScene,
    crowd_scene,
    driving_scene,
    pedestrian_scene,
    sensor_sectors,
)

# Range noise of the generator is 0.02 m; a box surface point is within a few sigma of it.
SURFACE_TOL_M = 0.1


@pytest.fixture(scope="module")
def scene() -> DrivingScene:
    return driving_scene(seed=0)


def _box_frame(scene: DrivingScene) -> tuple[np.ndarray, np.ndarray]:
    """Obstacle points in their box's frame ``[Q, 3]`` and that box's half sizes ``[Q, 3]``."""
    obstacle = scene.is_obstacle
    boxes = scene.boxes[scene.object_index[obstacle]]
    rel = scene.points[obstacle, :3].astype(np.float64) - np.c_[boxes["x"], boxes["y"], boxes["z"]]
    cos, sin = np.cos(boxes["yaw"]), np.sin(boxes["yaw"])
    local = np.c_[cos * rel[:, 0] + sin * rel[:, 1], -sin * rel[:, 0] + cos * rel[:, 1], rel[:, 2]]
    half = 0.5 * np.c_[boxes["length"], boxes["width"], boxes["height"]].astype(np.float64)
    return local, half


def test_scene_layout(scene: DrivingScene) -> None:
    points = scene.points
    assert points.dtype == np.float32 and points.ndim == 2 and points.shape[1] == 4
    assert 20_000 < points.shape[0] < 150_000
    assert scene.is_obstacle.shape == scene.object_index.shape == (points.shape[0],)
    np.testing.assert_array_equal(scene.is_obstacle, scene.object_index >= 0)
    assert scene.boxes.dtype == OBSTACLE_DTYPE
    assert scene.boxes.shape == (19,)
    assert np.isfinite(points).all()
    assert 0.0 <= points[:, 3].min() and points[:, 3].max() <= 1.0
    assert scene.boxes["num_points"].sum() == scene.is_obstacle.sum()
    assert np.all(scene.boxes["length"] >= scene.boxes["width"])


def test_boxes_have_realistic_sizes(scene: DrivingScene) -> None:
    boxes = scene.boxes
    cars = boxes[boxes["label"] == LABEL_CAR]
    assert cars.size == 8
    assert np.all(np.abs(cars["length"] - 4.2) < 1.0) and np.all(np.abs(cars["width"] - 1.8) < 0.4)
    assert np.all(np.abs(cars["height"] - 1.5) < 0.4)
    people = boxes[boxes["label"] == LABEL_PEDESTRIAN]
    assert people.size == 5 and np.all(np.abs(people["height"] - 1.7) < 0.4)
    poles = boxes[boxes["label"] == LABEL_POLE]
    assert poles.size == 6 and np.all(poles["height"] > 2.5) and np.all(poles["length"] < 0.5)


def test_ground_is_below_the_sensor_with_a_small_slope(scene: DrivingScene) -> None:
    a, b, c, d = scene.ground_plane
    assert np.isclose(np.linalg.norm([a, b, c]), 1.0) and c > 0.999
    assert abs(d / c - SENSOR_HEIGHT_M) < 1e-9
    ground = scene.points[~scene.is_obstacle, :3].astype(np.float64)
    height = ground @ np.array([a, b, c]) + d
    assert np.abs(height).max() < 0.2
    # Boxes stand on the ground.
    box_base = scene.boxes["z"] - scene.boxes["height"] / 2
    base_height = a * scene.boxes["x"] + b * scene.boxes["y"] + c * box_base + d
    assert np.abs(base_height).max() < 1e-3


def test_obstacle_points_lie_on_sensor_facing_faces(scene: DrivingScene) -> None:
    local, half = _box_frame(scene)
    assert np.all(np.abs(local) <= half + SURFACE_TOL_M)
    near_face = half - np.abs(local) < SURFACE_TOL_M
    assert near_face.any(axis=1).all()
    # Some face the point lies on has an outward normal that looks back at the sensor.
    obstacle = scene.is_obstacle
    boxes = scene.boxes[scene.object_index[obstacle]]
    sensor_rel = -np.c_[boxes["x"], boxes["y"], boxes["z"]].astype(np.float64)
    cos, sin = np.cos(boxes["yaw"]), np.sin(boxes["yaw"])
    sensor_local = np.c_[
        cos * sensor_rel[:, 0] + sin * sensor_rel[:, 1],
        -sin * sensor_rel[:, 0] + cos * sensor_rel[:, 1],
        sensor_rel[:, 2],
    ]
    facing = np.sign(local) * (sensor_local - local) > 0.0
    assert (near_face & facing).any(axis=1).all()


def test_near_cars_show_an_l_shape(scene: DrivingScene) -> None:
    local, half = _box_frame(scene)
    index = scene.object_index[scene.is_obstacle]
    on_end = np.abs(np.abs(local[:, 0]) - half[:, 0]) < SURFACE_TOL_M
    on_side = np.abs(np.abs(local[:, 1]) - half[:, 1]) < SURFACE_TOL_M
    l_shaped = 0
    for k in np.flatnonzero(
        (scene.boxes["label"] == LABEL_CAR) & (scene.boxes["num_points"] > 500)
    ):
        mine = index == k
        ends, sides = on_end[mine].mean(), on_side[mine].mean()
        l_shaped += bool(ends > 0.1 and sides > 0.1)
    assert l_shaped >= 1


def test_objects_do_not_overlap(scene: DrivingScene) -> None:
    boxes = scene.boxes
    radius = 0.5 * np.hypot(boxes["length"], boxes["width"])
    dist = np.hypot(boxes["x"][:, None] - boxes["x"], boxes["y"][:, None] - boxes["y"])
    clearance = dist - radius[:, None] - radius[None, :]
    np.fill_diagonal(clearance, np.inf)
    assert clearance.min() >= 1.0 - 1e-4


def test_most_content_is_in_the_roi_but_not_all(scene: DrivingScene) -> None:
    roi = Roi()
    x, y = scene.points[:, 0], scene.points[:, 1]
    inside = (x >= roi.x_m[0]) & (x < roi.x_m[1]) & (y >= roi.y_m[0]) & (y < roi.y_m[1])
    assert 0.7 < inside.mean() < 1.0
    in_box_roi = (scene.boxes["x"] < roi.x_m[1]) & (np.abs(scene.boxes["y"]) < roi.y_m[1])
    assert in_box_roi.mean() > 0.5


def test_ground_density_falls_with_range(scene: DrivingScene) -> None:
    ground = scene.points[~scene.is_obstacle]
    rng = np.hypot(ground[:, 0], ground[:, 1])
    near = ((rng > 5) & (rng < 15)).sum() / (15**2 - 5**2)
    far = ((rng > 30) & (rng < 40)).sum() / (40**2 - 30**2)
    assert near > 5.0 * far


def test_scene_is_deterministic_for_a_seed() -> None:
    first, second = driving_scene(seed=7), driving_scene(seed=7)
    np.testing.assert_array_equal(first.points, second.points)
    np.testing.assert_array_equal(first.boxes, second.boxes)
    other = driving_scene(seed=8)
    assert other.points.shape != first.points.shape or not np.array_equal(
        other.points, first.points
    )


@pytest.mark.parametrize("count", [0, 5_000, 150_000])
def test_exact_point_count(count: int) -> None:
    scene = driving_scene(seed=1, num_points=count)
    assert scene.points.shape == (count, 4)
    assert scene.is_obstacle.shape == (count,)
    assert scene.boxes["num_points"].sum() == scene.is_obstacle.sum()
    if count:
        assert 0.05 < scene.is_obstacle.mean() < 0.6


def test_empty_street_and_bad_counts() -> None:
    empty_street = driving_scene(seed=2, num_cars=0, num_poles=0, num_pedestrians=0)
    assert empty_street.boxes.size == 0 and not empty_street.is_obstacle.any()
    with pytest.raises(ConfigError, match="num_cars"):
        driving_scene(num_cars=-1)
    with pytest.raises(ConfigError, match="num_points"):
        driving_scene(num_points=-5)
    with pytest.raises(ConfigError, match="cannot place"):
        driving_scene(num_cars=400)


def test_pedestrian_tracks_shape_and_speed() -> None:
    dt_s = 0.4
    tracks = pedestrian_scene(seed=3, num_agents=20, num_steps=30, dt_s=dt_s)
    assert tracks.shape == (20, 30, 2) and tracks.dtype == np.float32
    speed = np.linalg.norm(np.diff(tracks, axis=1), axis=2) / dt_s
    assert speed.max() <= 2.0 + 1e-3
    assert 0.8 < np.median(speed) < 1.8
    assert (speed < 0.1).any(), "some agent stops"
    heading = np.unwrap(np.arctan2(*np.diff(tracks, axis=1)[..., ::-1].transpose(2, 0, 1)), axis=1)
    moving = speed > 0.5
    turned = [np.ptp(heading[a, moving[a]]) for a in range(20) if moving[a].sum() > 5]
    assert max(turned) > np.deg2rad(40), "some agent turns"
    np.testing.assert_array_equal(tracks, pedestrian_scene(seed=3, num_agents=20, num_steps=30))


def test_group_walks_together() -> None:
    tracks = pedestrian_scene(seed=5, num_agents=2, num_steps=25, group_share=0.5)
    gap = np.linalg.norm(tracks[0] - tracks[1], axis=1)
    assert np.all((gap > 0.3) & (gap < 1.5))
    assert np.linalg.norm(tracks[0, -1] - tracks[0, 0]) > 3.0


def test_pedestrian_edge_cases() -> None:
    assert pedestrian_scene(num_agents=0, num_steps=4).shape == (0, 4, 2)
    assert pedestrian_scene(num_agents=1, num_steps=1).shape == (1, 1, 2)
    with pytest.raises(ConfigError):
        pedestrian_scene(num_steps=0)
    with pytest.raises(ConfigError):
        pedestrian_scene(turn_share=0.7, stop_share=0.7)


def test_sectors_follow_the_spin() -> None:
    angles = np.deg2rad(np.array([170.0, 80.0, 10.0, -10.0, -80.0, -170.0, 0.0]))
    points = np.c_[np.cos(angles), np.sin(angles), np.arange(7.0)].astype(np.float32)
    sectors = sensor_sectors(points, 4)
    assert len(sectors) == 4
    # Clockwise from behind: left side first, then front (left to right), then right side.
    np.testing.assert_array_equal(np.concatenate(sectors)[:, 2], [0, 1, 2, 6, 3, 4, 5])
    assert [s.shape[0] for s in sectors] == [1, 2, 3, 1]
    ccw = sensor_sectors(points, 4, clockwise=False)
    np.testing.assert_array_equal(np.concatenate(ccw)[:, 2], [5, 4, 3, 6, 2, 1, 0])


def test_sectors_of_a_scan_partition_it(scene: DrivingScene) -> None:
    sectors = sensor_sectors(scene.points, 16)
    assert len(sectors) == 16
    merged = np.concatenate(sectors)
    assert merged.shape == scene.points.shape
    np.testing.assert_array_equal(
        merged[np.lexsort(merged.T)], scene.points[np.lexsort(scene.points.T)]
    )
    # A 180 deg scan fills the 8 sectors in front of the sensor only.
    assert sum(s.shape[0] > 0 for s in sectors) == 8
    assert all(s.shape[1] == 4 for s in sectors)


def test_sectors_reject_bad_input() -> None:
    assert [s.shape for s in sensor_sectors(np.zeros((0, 4)), 3)] == [(0, 4)] * 3
    with pytest.raises(ConfigError):
        sensor_sectors(np.zeros((5, 4)), 0)
    with pytest.raises(ShapeError):
        sensor_sectors(np.zeros(5), 2)


class SceneSizes(TypedDict, total=False):
    range_noise_m: float
    ground_noise_m: float
    max_slope: float
    sensor_height_m: float
    azimuth_step_deg: float


@pytest.mark.parametrize(
    "change",
    [
        {"range_noise_m": float("nan")},
        {"ground_noise_m": float("nan")},
        {"range_noise_m": -0.1},
        {"max_slope": float("nan")},
        {"sensor_height_m": float("inf")},
        {"azimuth_step_deg": float("inf")},
    ],
)
def test_non_finite_or_negative_scene_sizes_are_config_errors(change: SceneSizes) -> None:
    with pytest.raises(ConfigError, match=next(iter(change))):
        driving_scene(seed=1, **change)


def test_bad_pedestrian_areas_and_steps_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="area_m"):
        pedestrian_scene(area_m=float("nan"))
    with pytest.raises(ConfigError, match="dt_s"):
        pedestrian_scene(dt_s=float("inf"))


def test_sectors_refuse_points_without_an_azimuth() -> None:
    points = np.array([[1.0, 0.0, 0.0], [np.nan, 1.0, 0.0]], np.float32)
    with pytest.raises(InputValueError, match="no azimuth"):
        sensor_sectors(points, 4)
    with pytest.raises(ConfigError, match="start_azimuth_rad"):
        sensor_sectors(points[:1], 4, start_azimuth_rad=float("nan"))
    assert sum(len(s) for s in sensor_sectors(points[:1], np.int64(4))) == 1


def _speeds(tracks: np.ndarray, dt_s: float) -> np.ndarray:
    return np.linalg.norm(np.diff(tracks, axis=1), axis=2) / dt_s


def test_crowd_walks_at_its_desired_speed_and_is_seeded() -> None:
    slow = crowd_scene(seed=2, num_agents=30, num_steps=40, crowd=Crowd(speed_mps=0.7))
    fast = crowd_scene(seed=2, num_agents=30, num_steps=40, crowd=Crowd(speed_mps=1.6))
    assert slow.shape == (30, 40, 2) and slow.dtype == np.float32
    assert 0.5 < np.median(_speeds(slow, 0.4)) < 0.9
    assert 1.3 < np.median(_speeds(fast, 0.4)) < 1.9
    np.testing.assert_array_equal(
        slow, crowd_scene(seed=2, num_agents=30, num_steps=40, crowd=Crowd(speed_mps=0.7))
    )
    assert not np.array_equal(
        slow, crowd_scene(seed=3, num_agents=30, num_steps=40, crowd=Crowd(speed_mps=0.7))
    )


def test_crowd_standers_stay_and_stoppers_walk_on() -> None:
    standing = crowd_scene(seed=1, num_agents=10, num_steps=30, crowd=Crowd(stand_share=1.0))
    # Standing groups close up to their spacing, no further: a walker would cover 14 m.
    assert np.abs(standing - standing[:, :1]).max() < 1.0
    stoppers = Crowd(stop_share=1.0, stand_share=0.0, group_share=0.0, turn_share=0.0)
    speed = _speeds(crowd_scene(seed=1, num_agents=20, num_steps=60, crowd=stoppers), 0.4)
    halted = (speed < 0.1).any(axis=1)
    assert halted.mean() > 0.5, "stops shorter than the scene are seen"
    assert (speed[halted, -1] > 0.5).any(), "some walk on after their stop"


def test_crowd_turns_change_heading_and_walkers_keep_apart() -> None:
    walkers = Crowd(turn_share=1.0, stand_share=0.0, stop_share=0.0, group_share=0.0)
    tracks = crowd_scene(seed=4, num_agents=12, num_steps=50, crowd=walkers)
    step = np.diff(tracks, axis=1)
    heading = np.unwrap(np.arctan2(step[..., 1], step[..., 0]), axis=1)
    assert np.median(np.abs(heading[:, -1] - heading[:, 0])) > np.deg2rad(20)
    dense = crowd_scene(seed=5, num_agents=40, num_steps=30, crowd=Crowd(area_m=8.0))
    gaps = np.linalg.norm(dense[:, None] - dense[None], axis=-1) + np.eye(40)[..., None] * 1e3
    # Repulsion keeps bodies from passing through each other in a dense crowd.
    assert np.percentile(gaps.min(axis=1)[:, 5:], 1) > 0.2


def test_crowd_groups_walk_together() -> None:
    groups = Crowd(group_share=1.0, stand_share=0.0, stop_share=0.0, turn_share=0.0)
    tracks = crowd_scene(seed=6, num_agents=2, num_steps=40, crowd=groups)
    gap = np.linalg.norm(tracks[0] - tracks[1], axis=1)
    assert gap[10:].max() < 2.0
    assert np.linalg.norm(tracks[0, -1] - tracks[0, 0]) > 8.0


@pytest.mark.parametrize(
    "change",
    [
        {"area_m": 0.0},
        {"speed_mps": float("nan")},
        {"speed_spread_mps": -0.1},
        {"group_share": 1.5},
        {"stop_share": -0.1},
    ],
)
def test_bad_crowds_are_config_errors(change: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Crowd(**change)


def test_crowd_edge_cases() -> None:
    assert crowd_scene(num_agents=0, num_steps=3).shape == (0, 3, 2)
    assert crowd_scene(num_agents=1, num_steps=1).shape == (1, 1, 2)
    with pytest.raises(ConfigError, match="dt_s"):
        crowd_scene(dt_s=0.0)
