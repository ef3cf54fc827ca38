"""fit_ground_plane and GroundPlane.height give, bit for bit, what the algorithm frozen here
gives (a float64 copy cast at once, boolean-mask inliers, a centred copy per refit)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.ground import (
    MIN_PLANE_POINTS,
    GroundPlane,
    _column_means,
    _msac_costs,
    fit_ground_plane,
)
from dynshape_perception.perception.scan import ScanParams, prepare_scan
from dynshape_perception.tools.sim.scenes import driving_scene


def _reference_refit(xyz: np.ndarray) -> tuple[np.ndarray, float]:
    centroid = xyz.mean(axis=0)
    centred = xyz - centroid
    _, vectors = np.linalg.eigh(centred.T @ centred)
    normal = vectors[:, 0]
    if normal[2] < 0.0:
        normal = -normal
    return normal, float(-normal @ centroid)


def reference_fit(
    points: np.ndarray, seed: int = 0, max_sample_points: int = 4000, refit_rounds: int = 2
) -> tuple[float, ...]:
    threshold_m, max_tilt_deg = 0.2, 20.0
    xyz = points[:, :3].astype(np.float64)
    if not np.isfinite(xyz).all():
        xyz = xyz[np.isfinite(xyz).all(axis=1)]
    if xyz.shape[0] < MIN_PLANE_POINTS:
        return dataclasses.astuple(GroundPlane.default())
    rng = np.random.default_rng(seed)
    if xyz.shape[0] > max_sample_points:
        sample = xyz[rng.choice(xyz.shape[0], size=max_sample_points, replace=False)]
    else:
        sample = xyz
    triples = sample[rng.integers(0, sample.shape[0], size=(200, MIN_PLANE_POINTS))]
    normals = np.cross(triples[:, 1] - triples[:, 0], triples[:, 2] - triples[:, 0])
    norms = np.linalg.norm(normals, axis=1)
    usable = norms > 1.0e-9
    normals = normals[usable] / norms[usable, None]
    normals *= np.where(normals[:, 2] < 0.0, -1.0, 1.0)[:, None]
    offsets = -np.einsum("ik,ik->i", normals, triples[usable, 0])
    level = normals[:, 2] >= np.cos(np.deg2rad(max_tilt_deg))
    normals, offsets = normals[level], offsets[level]
    if normals.shape[0] == 0:
        return dataclasses.astuple(GroundPlane.default())
    best = int(np.argmin(_msac_costs(sample, normals, offsets, threshold_m**2)))
    normal, offset = normals[best], float(offsets[best])
    inliers = np.abs(xyz @ normal + offset) <= threshold_m
    for _ in range(refit_rounds):
        if inliers.sum() < MIN_PLANE_POINTS:
            break
        refit_normal, refit_offset = _reference_refit(xyz[inliers])
        if refit_normal[2] < np.cos(np.deg2rad(max_tilt_deg)):
            break
        normal, offset = refit_normal, refit_offset
        inliers = np.abs(xyz @ normal + offset) <= threshold_m
    plane = (float(normal[0]), float(normal[1]), float(normal[2]), offset)
    return (*plane, int(inliers.sum()), False)


def _assert_same(points: np.ndarray, **kwargs: int) -> GroundPlane:
    plane = fit_ground_plane(points, **kwargs)
    assert dataclasses.astuple(plane) == reference_fit(points, **kwargs)
    expected = points[:, :3].astype(np.float64) @ np.array([plane.a, plane.b, plane.c]) + plane.d
    assert plane.height(points).tobytes() == expected.tobytes()
    return plane


@pytest.fixture(scope="module")
def kitti_points(kitti_bin: Path) -> np.ndarray:
    raw = read_kitti_bin(kitti_bin, allow_empty=False)
    points: np.ndarray = prepare_scan(raw, np.eye(4), ScanParams()).points
    return points


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("refit_rounds", [0, 1, 2, 3])
def test_the_kitti_scan_fits_as_the_reference(
    kitti_points: np.ndarray, seed: int, refit_rounds: int
) -> None:
    plane = _assert_same(kitti_points, seed=seed, refit_rounds=refit_rounds)
    assert not plane.is_default and plane.num_inliers > 1000
    # Its first sector and a float64 copy, as the streaming path and callers give them.
    _assert_same(kitti_points[: kitti_points.shape[0] // 8], seed=seed, refit_rounds=refit_rounds)
    _assert_same(kitti_points[:, :3].astype(np.float64), seed=seed, max_sample_points=2000)


@pytest.mark.parametrize("seed", range(2))
def test_generated_scenes_fit_as_the_reference(seed: int) -> None:
    scene = driving_scene(seed=seed, fov_deg=360.0)
    assert not _assert_same(scene.points, seed=seed).is_default


def test_few_and_non_finite_points_fit_as_the_reference() -> None:
    rng = np.random.default_rng(5)
    points = np.c_[rng.uniform(-20, 20, (600, 2)), rng.normal(-1.7, 0.05, 600)]
    points[::7, 1] = np.nan
    points[::11, 2] = np.inf
    _assert_same(points.astype(np.float32))
    for n in (2, 3, 5, 40):
        _assert_same(points[:n])


@pytest.mark.parametrize("rows", [3, 4, 17, 5_198, 22_651])
def test_column_means_are_numpys_to_the_bit(rows: int) -> None:
    rng = np.random.default_rng(rows)
    for scale in (0.1, 10.0, 1.0e4):
        xyz = rng.normal(size=(rows, 3)) * scale + rng.normal(size=3) * 50.0
        assert _column_means(xyz).tobytes() == xyz.mean(axis=0).tobytes()
