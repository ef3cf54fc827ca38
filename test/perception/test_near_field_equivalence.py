"""NearField.select and subsample_far_field give, index for index and byte for byte, what the
sorting algorithm frozen here gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.ground import GroundPlane, fit_ground_plane
from dynshape_perception.perception.scan import ScanParams, prepare_scan
from dynshape_perception.perception.streaming import NearField, subsample_far_field
from dynshape_perception.tools.sim.scenes import driving_scene


def reference_select(near: NearField, points: np.ndarray, ground: GroundPlane | None) -> np.ndarray:
    index = np.flatnonzero(near.mask(points))
    if ground is not None and near.ground_band_m > 0.0 and index.size:
        heights = ground.height(np.take(points, index, axis=0))
        index = index[np.abs(heights) > near.ground_band_m]
    if index.size > near.max_points:
        dist = np.hypot(points[index, 0], points[index, 1])
        index = np.sort(index[np.argpartition(dist, near.max_points - 1)[: near.max_points]])
    return index


def reference_subsample(points: np.ndarray, near: NearField, keep: float, seed: int) -> np.ndarray:
    near_mask = near.mask(points)
    far = np.flatnonzero(~near_mask)
    rng = np.random.default_rng(seed)
    kept = rng.choice(far, size=round(keep * far.size), replace=False)
    subsampled: np.ndarray = points[np.sort(np.concatenate([np.flatnonzero(near_mask), kept]))]
    return subsampled


FIELDS = [
    NearField(),
    NearField(max_points=512, ground_band_m=0.0),
    NearField(ahead_m=40.0, half_width_m=8.0, behind_m=5.0, max_points=1),
    NearField(ahead_m=60.0, half_width_m=60.0, behind_m=60.0, max_points=20000),
]


def _assert_same(points: np.ndarray, ground: GroundPlane) -> int:
    """Asserts both agree with the reference; the corridor points left to the cap."""
    capped = 0
    for near in FIELDS:
        for plane in (ground, None):
            got = near.select(points, plane)
            expected = reference_select(near, points, plane)
            assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()
            capped += int(near.mask(points).sum()) - got.size
        for keep, seed in ((0.5, 3), (0.1, 0), (0.999, 7), (1e-6, 1)):
            got = subsample_far_field(points, near, keep, seed)
            expected = reference_subsample(points, near, keep, seed)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            assert got.tobytes() == expected.tobytes()
    return capped


def test_the_kitti_scan_selects_as_the_reference(kitti_bin: Path) -> None:
    raw = read_kitti_bin(kitti_bin, allow_empty=False)
    points = prepare_scan(raw, np.eye(4), ScanParams()).points
    assert _assert_same(points, fit_ground_plane(points[:, :3])) > 1000


@pytest.mark.parametrize("seed", range(2))
def test_generated_scenes_select_as_the_reference(seed: int) -> None:
    scene = driving_scene(seed=seed, fov_deg=360.0)
    points = scene.points.astype(np.float32)
    # Rings of equal range: the cap cuts through ties.
    ring = np.linspace(0.0, np.pi / 2, 400, endpoint=False)
    ties = np.c_[10 * np.cos(ring), 10 * np.sin(ring) - 5, np.zeros((400, 2))].astype(np.float32)
    points = np.concatenate([points, ties, ties])
    assert _assert_same(points, fit_ground_plane(points[:, :3], seed=seed)) > 100
