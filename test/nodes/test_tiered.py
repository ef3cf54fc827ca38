"""The nodes' tiered work without ROS: tier parameters, chunk sizes, the two jobs, diagnostics."""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any

import numpy as np
import pytest

from dynshape_perception import parameters
from dynshape_perception.errors import ConfigError
from dynshape_perception.nodes.base import descriptor
from dynshape_perception.perception.clustering import cluster_obstacles, rows_to_score
from dynshape_perception.perception.drops import DropCounter
from dynshape_perception.perception.ground import GroundPlane, fit_ground_plane
from dynshape_perception.perception.pipeline import Pipeline
from dynshape_perception.perception.streaming import NearField, subsample_far_field
from dynshape_perception.scheduling.executor import (
    ExecutorOptions,
    TieredExecutor,
    diagnostic_status,
)
from dynshape_perception.scheduling.lidar_tiers import (
    ChunkSizer,
    Segmentation,
    executor_values,
    since,
)
from dynshape_perception.scheduling.tiers import Tier, TierConfig
from dynshape_perception.testing.clocks import FakeClock
from dynshape_perception.tools.sim.scenes import driving_scene

pytestmark = pytest.mark.ros

EDGES = (2048, 4096, 8192)
OBSTACLE_HEIGHT_M = 0.3


class FakeSegmenter:
    """Scores a point 1 when it stands above the ground plane it is given; logs call sizes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.planes: list[np.ndarray] = []

    def __call__(self, function: str, points: np.ndarray, plane: np.ndarray) -> list[np.ndarray]:
        assert function == "forward"
        self.sizes.append(int(points.shape[0]))
        self.planes.append(plane)
        height = points[:, :3].astype(np.float64) @ plane[:3] + plane[3]
        scores = (height > OBSTACLE_HEIGHT_M).astype(np.float32)
        return [scores, np.zeros(1, np.float32)]


class FakeExecutor:
    def __init__(self, keep: float = 1.0, budget_ms: float = 5.0) -> None:
        self.keep = keep
        self.config = TierConfig(chunk_budget_ms=budget_ms)

    def far_field_keep_fraction(self) -> float:
        return self.keep


def _unused(*_: object) -> list[np.ndarray]:
    raise AssertionError("not called by segmentation")


@pytest.fixture(scope="module")
def scene() -> np.ndarray:
    """A street with obstacles in the corridor ahead."""
    return driving_scene(seed=1).points


@pytest.fixture(scope="module")
def clear_road() -> np.ndarray:
    """A street whose corridor ahead holds road only."""
    return driving_scene(seed=0).points


def _segmentation(
    executor: FakeExecutor, near: NearField | None = None
) -> tuple[Segmentation, FakeSegmenter, FakeSegmenter]:
    fast, main = FakeSegmenter(), FakeSegmenter()
    pipeline = Pipeline(_unused, _unused, _unused)
    seg = Segmentation(fast, main, pipeline, near or NearField(), executor, EDGES)
    return seg, fast, main


def _run(gen: Generator[None, None, Any]) -> tuple[int, Any]:
    yields = 0
    while True:
        try:
            next(gen)
            yields += 1
        except StopIteration as stop:
            return yields, stop.value


# -- parameters ----------------------------------------------------------------------------
def test_only_the_lidar_nodes_run_the_executor() -> None:
    assert [n for n in parameters.NODE_GROUPS if parameters.uses_executor(n)] == [
        "pointcloud_node",
        "perception_pipeline",
    ]
    for node in parameters.NODE_GROUPS:
        tiered = any(name.startswith("tiers.") for name in parameters.node_specs(node))
        assert tiered == parameters.uses_executor(node), node


def test_tier_parameters_are_the_core_config_live_and_the_options_read_only() -> None:
    specs = parameters.all_specs()
    tiers = {n: s for n, s in specs.items() if n.startswith("tiers.")}
    assert {n.removeprefix("tiers.") for n in tiers} == set(TierConfig().as_dict())
    assert not any(s.read_only for s in tiers.values())
    assert all(specs[n].read_only for n in specs if n.startswith("executor."))
    defaults = {n: s.default for n, s in specs.items()}
    assert parameters.tier_config(defaults) == TierConfig()
    keep = descriptor(specs["tiers.far_field_keep_fraction"]).floating_point_range[0]
    assert (keep.from_value, keep.to_value) == (0.01, 1.0)
    depth = descriptor(specs["tiers.max_queue_depth"]).integer_range[0]
    assert depth.from_value == 1
    assert not descriptor(specs["tiers.shed_expired"]).floating_point_range


def test_executor_options_take_zero_for_off() -> None:
    values: dict[str, parameters.Value] = {n: s.default for n, s in parameters.all_specs().items()}
    options = parameters.executor_options(values)
    assert options == ExecutorOptions(
        reserved_workers=1,
        shared_workers=1,
        reserved_rt_priority=10,
        shared_boost_rt_priority=5,
        switch_interval_ms=2.0,
        blas_threads=1,
        opencv_threads=1,
        allocator_keep_mb=512,
    )
    values.update(
        {
            "executor.reserved_rt_priority": 0,
            "executor.shared_boost_rt_priority": 0,
            "executor.switch_interval_ms": 0.0,
            "executor.blas_threads": 0,
            "executor.opencv_threads": 0,
            "executor.allocator_keep_mb": 0,
        }
    )
    off = parameters.executor_options(values)
    assert off.reserved_rt_priority is None and off.shared_boost_rt_priority is None
    assert off.switch_interval_ms is None and off.blas_threads is None
    assert off.opencv_threads is None and off.allocator_keep_mb is None


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"tiers.collision_deadline_ms": 500.0}, "must not decrease"),
        ({"tiers.degrade_exit_backlog_ms": 200.0}, "must not exceed"),
        ({"tiers.max_queue_depth": 2.5}, "must be int"),
        ({"executor.shared_boost_rt_priority": 20}, "below reserved_rt_priority"),
        ({"near_field.min_z_m": 4.0}, "min_z_m < max_z_m"),
    ],
)
def test_bad_tier_values_are_refused_with_a_reason(changes: dict[str, Any], match: str) -> None:
    specs = parameters.all_specs()
    values = {n: s.default for n, s in specs.items()}
    values.update(changes)
    with pytest.raises(ConfigError, match=match):
        parameters.validate(values, specs)


def test_near_field_parameters_reach_the_corridor() -> None:
    values: dict[str, parameters.Value] = {n: s.default for n, s in parameters.all_specs().items()}
    assert parameters.near_field(values) == NearField()
    values.update({"near_field.ahead_m": 30.0, "near_field.max_points": 1000})
    near = parameters.near_field(values)
    assert (near.ahead_m, near.max_points) == (30.0, 1000)


# -- chunk sizes ---------------------------------------------------------------------------
def test_chunk_sizer_starts_small_then_fits_the_budget() -> None:
    sizer = ChunkSizer(EDGES)
    assert sizer.points(5.0) == 2048
    sizer.record(2048, 2048 * 0.0005)  # 0.5 us a point: 8192 points take 4.1 ms
    assert sizer.points(5.0) == 8192
    assert sizer.points(2.5) == 4096
    assert sizer.points(0.1) == 2048
    # A slower call moves the estimate by the smoothing weight, not all the way.
    sizer.record(2048, 2048 * 0.0105)
    assert sizer.ms_per_point == pytest.approx(0.0005 + 0.2 * 0.01)
    assert sizer.points(5.0) == 2048
    with pytest.raises(ConfigError, match="bucket edges"):
        ChunkSizer(())


# -- the jobs ------------------------------------------------------------------------------
def test_near_field_segments_only_the_corridor_and_takes_the_last_plane(scene: np.ndarray) -> None:
    near = NearField(max_points=1000)
    seg, fast, main = _segmentation(FakeExecutor(), near)
    first = seg.near_field(scene)()
    assert first.default_plane and first.points == 1000 == fast.sizes[0]
    np.testing.assert_array_equal(fast.planes[0], GroundPlane.default().as_array())
    assert main.sizes == []
    _run(seg.full_cloud(scene, seed=0))
    assert seg.plane is not None and not seg.plane.is_default
    second = seg.near_field(scene)()
    assert not second.default_plane
    np.testing.assert_array_equal(fast.planes[1], seg.plane.as_array())
    corridor = scene[near.select(scene, seg.plane)]
    assert fast.sizes[1] == corridor.shape[0] and near.mask(corridor).all()
    assert second.obstacles.shape[0] > 0
    assert near.mask(np.column_stack([second.obstacles["x"], second.obstacles["y"]])).all()


def test_a_clear_corridor_gives_no_obstacles_without_a_call(clear_road: np.ndarray) -> None:
    seg, fast, _ = _segmentation(FakeExecutor())
    _run(seg.full_cloud(clear_road, seed=0))
    result = seg.near_field(clear_road)()
    assert result.points == 0 and result.obstacles.shape == (0,) and fast.sizes == []


def test_full_cloud_in_chunks_equals_one_call(scene: np.ndarray) -> None:
    """Chunked, and only over the rows that can join a cluster: the boxes of one call over
    every row all the same."""
    seg, _, main = _segmentation(FakeExecutor())
    yields, cloud = _run(seg.full_cloud(scene, seed=0))
    ground = fit_ground_plane(scene[:, :3], seed=0)
    wanted = rows_to_score(scene, seg.pipeline.params.cluster, ground)
    assert wanted is not None and 0 < wanted.size < scene.shape[0]
    assert main.sizes[0] == EDGES[0] and sum(main.sizes) == wanted.size
    assert all(size in EDGES for size in main.sizes[:-1])
    assert yields == 2 + len(main.sizes) == 2 + cloud.chunks
    assert not cloud.far_field_subsampled and cloud.points == scene.shape[0]
    scores = FakeSegmenter()("forward", scene, ground.as_array())[0]
    whole = cluster_obstacles(scene, scores, seg.pipeline.params.cluster, ground)
    np.testing.assert_array_equal(cloud.obstacles, whole[: seg.pipeline.bounds.N])
    assert cloud.obstacles.shape[0] > 0


def test_degraded_mode_subsamples_the_far_field_only(scene: np.ndarray) -> None:
    near = NearField()
    seg, _, main = _segmentation(FakeExecutor(keep=0.5), near)
    _, cloud = _run(seg.full_cloud(scene, seed=3))
    corridor = int(near.mask(scene).sum())
    far = scene.shape[0] - corridor
    assert cloud.far_field_subsampled
    kept = subsample_far_field(scene, near, 0.5, seed=3)
    assert cloud.points == kept.shape[0] == corridor + round(0.5 * far)
    wanted = rows_to_score(kept, seg.pipeline.params.cluster, seg.pipeline.fit_ground(kept))
    assert wanted is not None and sum(main.sizes) == wanted.size


# -- diagnostics ---------------------------------------------------------------------------
def test_a_period_reports_only_what_happened_in_it() -> None:
    clock = FakeClock(100.0)
    ex = TieredExecutor(clock=clock, start=False)

    def late() -> None:
        clock.now += 0.020

    ex.submit(late, Tier.COLLISION, arrival=ex.arrive("points"), name="near_field")
    assert ex.run_one("reserved")
    first = ex.snapshot()
    assert diagnostic_status(since(first, None))[0] == 2
    ex.submit(lambda: None, Tier.COLLISION, arrival=ex.arrive("points"), name="near_field")
    assert ex.run_one("reserved")
    second = ex.snapshot()
    period = since(second, first)
    assert period["tiers"]["1"]["misses"] == 0 and period["tiers"]["1"]["completed"] == 1
    assert diagnostic_status(period)[:2] == (0, "all deadlines met")
    cumulative = dict(diagnostic_status(second)[2])
    assert cumulative["tier1.collision.misses"] == "1"
    assert cumulative["tier1.collision.completed"] == "2"
    extra = executor_values(second, ex.config)
    assert extra["executor.far_field_keep_fraction"] == 1.0
    assert extra["executor.realtime_lanes"] == 0
    assert extra["executor.blas_threads"] == 0
    assert extra["executor.opencv_threads"] == 0


def test_drop_counter_counts_from_many_threads() -> None:
    drops = DropCounter(["a"], lambda _: None, throttle_s=60.0)

    def drop_many() -> None:
        for _ in range(2000):
            drops.drop("a", "x")

    threads = [threading.Thread(target=drop_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert drops.snapshot() == {"a": 16000} and drops.total == 16000
