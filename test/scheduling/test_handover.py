"""The near field clusters after a running plane fit (bounded), with the same obstacles."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.models import segmenter
from dynshape_perception.models.registry import committed_weights
from dynshape_perception.perception.ground import GroundPlane
from dynshape_perception.perception.pipeline import Pipeline
from dynshape_perception.perception.streaming import NearField
from dynshape_perception.perception.tracking import reference_affinity
from dynshape_perception.scheduling.lidar_tiers import (
    FullCloud,
    NearResult,
    PlaneFits,
    Segmentation,
    Undegraded,
)
from dynshape_perception.scheduling.tiers import Tier
from dynshape_perception.tools.sim.scenes import driving_scene

JOIN_S = 10.0


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


def segmentation(
    near: NearField, pipeline_type: type[Pipeline] = Pipeline, fits: PlaneFits | None = None
) -> Segmentation:
    model = _segmenter()
    pipeline = pipeline_type(model, _associate, _predict)
    return Segmentation(model, model, pipeline, near, Undegraded(), (4096,), fits)


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


def _held(fits: PlaneFits) -> tuple[threading.Event, threading.Thread]:
    """A plane fit held open on a thread of its own until ``release`` is set."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        with fits.fitting():
            started.set()
            release.wait(JOIN_S)

    holder = threading.Thread(target=hold)
    holder.start()
    assert started.wait(JOIN_S)
    return release, holder


def _waits_out_the_fit(held: PlaneFits, waiting: PlaneFits) -> None:
    """A wait on ``waiting`` (of up to a minute) lasts while a fit of ``held`` runs, and ends
    with it."""
    release, holder = _held(held)
    waiter = threading.Thread(target=waiting.await_none, args=(60.0,))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()
    release.set()
    waiter.join(JOIN_S)
    holder.join(JOIN_S)
    assert not waiter.is_alive()


def test_a_wait_lasts_while_a_plane_fit_runs(points: np.ndarray) -> None:
    seg = segmentation(NearField())
    seg.fits.await_none(60.0)
    _waits_out_the_fit(seg.fits, seg.fits)


def _ends_while_the_fit_runs(held: PlaneFits, waiting: PlaneFits, wait_s: float) -> None:
    """A wait on ``waiting`` of at most ``wait_s`` ends while a fit of ``held`` still runs."""
    release, holder = _held(held)
    waiter = threading.Thread(target=waiting.await_none, args=(wait_s,))
    waiter.start()
    waiter.join(JOIN_S)
    assert not waiter.is_alive()
    release.set()
    holder.join(JOIN_S)


def test_a_wait_ends_at_its_bound_if_the_fit_does_not(points: np.ndarray) -> None:
    seg = segmentation(NearField())
    _ends_while_the_fit_runs(seg.fits, seg.fits, 0.05)


def test_segmentations_that_share_their_fits_wait_for_each_others(points: np.ndarray) -> None:
    fits = PlaneFits()
    first, second = segmentation(NearField(), fits=fits), segmentation(NearField(), fits=fits)
    alone = segmentation(NearField())
    with first.fits.fitting():
        assert second.fits.running == 1 and alone.fits.running == 0
    # A segmentation with fits of its own does not wait for theirs.
    _ends_while_the_fit_runs(first.fits, alone.fits, 60.0)
    _waits_out_the_fit(first.fits, second.fits)
    assert fits.running == 0


def test_the_fit_phase_ends_with_the_fit_even_when_it_fails(points: np.ndarray) -> None:
    seg = segmentation(NearField())
    cloud = _full_cloud(seg, points)
    assert cloud.obstacles.shape[0] > 0 and seg.fits.running == 0
    failing = segmentation(NearField(), FaultInjectedFitPipeline)
    with pytest.raises(ConfigError, match="fault injected"):
        _full_cloud(failing, points)
    assert failing.fits.running == 0


def test_waiting_near_fields_find_the_same_obstacles(points: np.ndarray) -> None:
    seg = segmentation(NearField(handover_wait_ms=10.0))
    seg.plane = seg.pipeline.fit_ground(points)
    alone = seg.near_field(points)()
    release, holder = _held(seg.fits)
    got: list[NearResult] = []
    worker = threading.Thread(target=lambda: got.append(seg.near_field(points)()))
    worker.start()
    worker.join(JOIN_S)
    release.set()
    holder.join(JOIN_S)
    assert not worker.is_alive() and got
    assert alone.obstacles.shape[0] > 0
    assert got[0].obstacles.tobytes() == alone.obstacles.tobytes()
    never = segmentation(NearField(handover_wait_ms=0.0))
    never.plane = seg.plane
    assert never.near_field(points)().obstacles.tobytes() == alone.obstacles.tobytes()


def test_a_near_field_waits_only_within_half_its_deadline() -> None:
    seg = segmentation(NearField(handover_wait_ms=3.0))
    half_s = seg.executor.config.deadline_ms(Tier.COLLISION) / 1000.0 / 2.0
    assert half_s > 0.003
    now = time.perf_counter()
    # Made just now (a made time ahead of the clock stands for one that no clock tick can
    # age): the whole wait. Made half a deadline ago or earlier: none.
    assert seg.handover_wait_s(seg.near, now + 60.0) == pytest.approx(0.003)
    assert seg.handover_wait_s(seg.near, now - half_s) == 0.0
    assert seg.handover_wait_s(seg.near, now - 60.0) == 0.0
    # Made a millisecond before half its deadline: at most that millisecond.
    assert 0.0 <= seg.handover_wait_s(seg.near, now - half_s + 0.001) <= 0.001
    assert seg.handover_wait_s(NearField(handover_wait_ms=0.0), now + 60.0) == 0.0


def test_a_near_field_clusters_in_the_corridor_and_with_the_settings_it_has_now(
    points: np.ndarray,
) -> None:
    narrow = NearField(half_width_m=1.5)
    seg = segmentation(narrow)
    seg.plane = seg.pipeline.fit_ground(points)
    assert seg.near_field(points)().obstacles.shape[0] == 0
    assert seg.near_cluster(narrow) is seg.near_cluster(narrow)
    seg.near = replace(narrow, half_width_m=3.0)
    assert seg.near_cluster(seg.near).roi == seg.near.roi()
    wide = seg.near_field(points)().obstacles
    assert wide.shape[0] > 0 and np.all(np.abs(wide["y"]) < 3.0)
    coarse = replace(seg.pipeline.params.cluster, min_points=10_000)
    seg.pipeline.params = replace(seg.pipeline.params, cluster=coarse)
    assert seg.near_cluster(seg.near).min_points == 10_000
    assert seg.near_cluster(seg.near).roi == seg.near.roi()
    assert seg.near_field(points)().obstacles.shape[0] == 0
