"""Streaming sectors give the whole-scan result; the near field is a bounded corridor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from dynshape_perception.errors import ConfigError
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.ground import fit_ground_plane
from dynshape_perception.perception.pipeline import Pipeline, PipelineParams
from dynshape_perception.perception.streaming import (
    NearField,
    RevolutionResult,
    StreamingSegmenter,
    process_whole_scan,
    subsample_far_field,
)
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.tools.sim.scenes import driving_scene, sensor_sectors

CENTRE_TOLERANCE_M = 0.05


def assert_same_obstacles(got: RevolutionResult, want: RevolutionResult) -> None:
    assert got.obstacles.shape[0] == want.obstacles.shape[0]
    a = np.c_[got.obstacles["x"], got.obstacles["y"]].astype(np.float64)
    b = np.c_[want.obstacles["x"], want.obstacles["y"]].astype(np.float64)
    cost = np.linalg.norm(a[:, None] - b[None, :], axis=2)
    rows, cols = linear_sum_assignment(cost)
    assert cost[rows, cols].max(initial=0.0) <= CENTRE_TOLERANCE_M
    # Sectors reorder the points: compare each point's score, matched by its coordinates.
    got_order = np.lexsort(got.points.T)
    want_order = np.lexsort(want.points.T)
    np.testing.assert_array_equal(got.points[got_order], want.points[want_order])
    np.testing.assert_allclose(got.scores[got_order], want.scores[want_order], rtol=1e-5, atol=1e-6)


def stream(seg: StreamingSegmenter, points: np.ndarray, sectors: int) -> RevolutionResult:
    for sector in sensor_sectors(points, sectors):
        seg.add_sector(sector)
    return seg.end_revolution()


@pytest.fixture(scope="module")
def generated() -> np.ndarray:
    return driving_scene(seed=3, fov_deg=360.0).points


@pytest.mark.parametrize("sectors", [4, 12])
def test_generated_scene_streams_to_the_whole_scan_result(
    engine: Engine, generated: np.ndarray, sectors: int
) -> None:
    seg = StreamingSegmenter(engine["segmenter"], ground_from="first_sectors")
    got = stream(seg, generated, sectors)
    assert got.segment_calls > 1
    want = process_whole_scan(engine["segmenter"], generated, got.ground)
    assert want.obstacles.shape[0] > 3
    assert_same_obstacles(got, want)


def test_the_previous_revolution_gives_the_plane_of_the_next(
    engine: Engine, generated: np.ndarray
) -> None:
    seg = StreamingSegmenter(engine["segmenter"], ground_from="previous")
    first = stream(seg, generated, 8)
    second = stream(seg, generated[::-1].copy(), 8)
    # The second revolution's plane is fitted on the whole first revolution.
    assert second.ground == fit_ground_plane(first.points[:, :3], seed=0)
    assert_same_obstacles(second, process_whole_scan(engine["segmenter"], generated, second.ground))


def test_kitti_scan_streams_to_the_pipeline_result(engine: Engine, kitti_bin: Path) -> None:
    points = read_kitti_bin(kitti_bin)
    seg = StreamingSegmenter(engine["segmenter"], ground_from="previous")
    stream(seg, points, 8)
    got = stream(seg, points, 8)
    pipeline = Pipeline(engine["segmenter"], lambda *a: [], engine["predictor"])
    (scores,) = engine["segmenter"]("forward", points, got.ground.as_array())
    obstacles = pipeline.detect(points, scores, got.ground)
    assert obstacles.shape[0] > 3
    want = RevolutionResult(points, scores, got.ground, obstacles, 1, 1)
    assert_same_obstacles(got, want)
    # The scan covers the front half only: empty sectors cost no call.
    assert got.sectors == 8 and got.segment_calls < 8


def test_first_revolution_waits_for_enough_points_to_fit_the_plane(
    engine: Engine, generated: np.ndarray
) -> None:
    seg = StreamingSegmenter(engine["segmenter"], min_ground_points=20_000)
    sectors = sensor_sectors(generated, 16)
    done = [seg.add_sector(s) for s in sectors]
    assert done[0] == 0 and sum(done) == generated.shape[0]
    first_fit = int(np.argmax(np.cumsum([s.shape[0] for s in sectors]) >= 20_000))
    assert all(d == 0 for d in done[:first_fit]) and done[first_fit] > 0


def test_near_field_is_the_nearest_points_of_the_corridor(generated: np.ndarray) -> None:
    near = NearField(ahead_m=20.0, half_width_m=3.0, max_points=500)
    index = near.select(generated)
    assert index.size == 500 and np.all(np.diff(index) > 0)
    inside = np.flatnonzero(near.mask(generated))
    assert inside.size > 500 and np.isin(index, inside).all()
    kept = np.hypot(generated[index, 0], generated[index, 1]).max()
    left = np.setdiff1d(inside, index)
    assert kept <= np.hypot(generated[left, 0], generated[left, 1]).min()
    x, y = generated[index, 0], generated[index, 1]
    assert (x >= 0).all() and (x < 20).all() and (np.abs(y) < 3).all()
    with pytest.raises(ConfigError, match="max_points"):
        NearField(max_points=0)


def test_far_field_subsampling_keeps_the_corridor_whole(generated: np.ndarray) -> None:
    near = NearField()
    kept = subsample_far_field(generated, near, 0.25, seed=1)
    assert near.mask(kept).sum() == near.mask(generated).sum()
    far_before = (~near.mask(generated)).sum()
    assert (~near.mask(kept)).sum() == round(0.25 * far_before)
    assert subsample_far_field(generated, near, 1.0) is generated


def test_near_field_leaves_the_road_out_when_given_the_plane(kitti_bin: Path) -> None:
    points = read_kitti_bin(kitti_bin)
    ground = fit_ground_plane(points[:, :3])
    near = NearField(max_points=100_000, ground_band_m=0.15)
    with_road = near.select(points)
    without = near.select(points, ground)
    assert 0 < without.size < with_road.size
    assert (np.abs(ground.height(points[without])) > 0.15).all()
    assert np.isin(without, with_road).all()


def test_an_empty_revolution_gives_the_empty_whole_scan_result(engine: Engine) -> None:
    seg = StreamingSegmenter(engine["segmenter"], ground_from="first_sectors")
    seg.add_sector(np.zeros((0, 4), np.float32))
    got = seg.end_revolution()
    want = process_whole_scan(engine["segmenter"], np.zeros((0, 4), np.float32), got.ground)
    assert got.segment_calls == 0
    assert got.scores.shape == want.scores.shape == (0,)
    assert got.obstacles.shape == want.obstacles.shape == (0,)


def test_a_negative_ground_seed_is_a_config_error(engine: Engine) -> None:
    with pytest.raises(ConfigError, match="ground_seed"):
        StreamingSegmenter(engine["segmenter"], ground_seed=-1)
    with pytest.raises(ConfigError, match="ground_seed"):
        PipelineParams(ground_seed=-1)
    with pytest.raises(ConfigError, match="subsample_seed"):
        PipelineParams(subsample_seed=-2)
    with pytest.raises(ConfigError, match="min_history_steps"):
        PipelineParams(min_history_steps=0)
