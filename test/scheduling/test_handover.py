"""The near field clusters after a running plane fit (bounded), with the same obstacles."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.models import segmenter
from dynshape_perception.models.registry import committed_weights
from dynshape_perception.perception.ground import GroundPlane
from dynshape_perception.perception.pipeline import Pipeline
from dynshape_perception.perception.streaming import NearField
from dynshape_perception.perception.tracking import reference_affinity
from dynshape_perception.scheduling.lidar_tiers import FullCloud, NearResult, Segmentation
from dynshape_perception.scheduling.tiers import TierConfig
from dynshape_perception.tools.sim.scenes import driving_scene

JOIN_S = 10.0


class Lanes:
    """What the jobs read of the executor: its config, never degraded."""

    config = TierConfig()

    def far_field_keep_fraction(self) -> float:
        return 1.0


def _segmenter() -> Callable[..., list[np.ndarray]]:
    _, weights = committed_weights("segmenter")
    config = segmenter.SegmenterConfig()

    def forward(function: str, points: np.ndarray, plane: np.ndarray) -> list[np.ndarray]:
        return segmenter.reference(function, weights, [points, plane], config)

    return forward


def _associate(function: str, det: np.ndarray, trk: np.ndarray) -> list[np.ndarray]:
    return [reference_affinity(det, trk)]


def _predict(function: str, *arrays: np.ndarray) -> list[np.ndarray]:
    raise AssertionError("nothing is predicted here")


class FaultInjectedFitPipeline(Pipeline):
    """A pipeline whose plane fit fails, as a bad cloud may make it."""

    def fit_ground(self, points: np.ndarray) -> GroundPlane:
        raise ConfigError("fault injected into the plane fit")


def segmentation(near: NearField, pipeline_type: type[Pipeline] = Pipeline) -> Segmentation:
    model = _segmenter()
    pipeline = pipeline_type(model, _associate, _predict)
    return Segmentation(model, model, pipeline, near, Lanes(), (4096,))


@pytest.fixture(scope="module")
def points() -> np.ndarray:
    cloud: np.ndarray = driving_scene(seed=3, fov_deg=360.0).points
    return cloud


def _full_cloud(seg: Segmentation, points: np.ndarray) -> FullCloud:
    steps = seg.full_cloud(points, seed=1)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: FullCloud = done.value
            return result


def test_a_wait_lasts_while_a_plane_fit_runs(points: np.ndarray) -> None:
    seg = segmentation(NearField())
    seg.await_handover(60.0)
    seg._fit_phase(1)
    waiter = threading.Thread(target=seg.await_handover, args=(60.0,))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()
    seg._fit_phase(-1)
    waiter.join(JOIN_S)
    assert not waiter.is_alive()


def test_a_wait_ends_at_its_bound_if_the_fit_does_not(points: np.ndarray) -> None:
    seg = segmentation(NearField())
    seg._fit_phase(1)
    waiter = threading.Thread(target=seg.await_handover, args=(0.05,))
    waiter.start()
    waiter.join(JOIN_S)
    assert not waiter.is_alive()
    seg._fit_phase(-1)


def test_the_fit_phase_ends_with_the_fit_even_when_it_fails(points: np.ndarray) -> None:
    seg = segmentation(NearField())
    cloud = _full_cloud(seg, points)
    assert cloud.obstacles.shape[0] > 0 and seg.planes_fitting == 0
    failing = segmentation(NearField(), FaultInjectedFitPipeline)
    with pytest.raises(ConfigError, match="fault injected"):
        _full_cloud(failing, points)
    assert failing.planes_fitting == 0


def test_waiting_near_fields_find_the_same_obstacles(points: np.ndarray) -> None:
    seg = segmentation(NearField(handover_wait_ms=10.0))
    seg.plane = seg.pipeline.fit_ground(points)
    alone = seg.near_field(points)()
    seg._fit_phase(1)
    got: list[NearResult] = []
    worker = threading.Thread(target=lambda: got.append(seg.near_field(points)()))
    worker.start()
    worker.join(JOIN_S)
    seg._fit_phase(-1)
    assert not worker.is_alive() and got
    assert alone.obstacles.shape[0] > 0
    assert got[0].obstacles.tobytes() == alone.obstacles.tobytes()
    never = segmentation(NearField(handover_wait_ms=0.0))
    never.plane = seg.plane
    assert never.near_field(points)().obstacles.tobytes() == alone.obstacles.tobytes()
