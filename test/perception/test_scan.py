"""A scan into the vehicle frame: no-returns, minimum range, mount, ego crop, ROI."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynshape_perception.config import Roi
from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.scan import SURROUND_ROI, Box, ScanParams, prepare_scan
from dynshape_perception.perception.transforms import planar

EGO = Box((-1.0, 4.0), (-1.0, 1.0), (-0.5, 2.0))


def test_each_step_removes_and_counts_its_points() -> None:
    points = np.array(
        [
            [0.0, 0.0, 0.0, 0.0],  # no return
            [0.2, 0.1, 0.0, 0.5],  # too near the sensor
            [0.0, -1.0, -1.0, 0.5],  # on the vehicle (mounted: base (1.0, 0.0, 0.8))
            [-30.0, 0.0, -1.0, 0.5],  # behind the vehicle: kept, the ROI is all around
            [0.0, 80.0, -1.0, 0.5],  # outside the ROI
            [10.0, 0.0, 0.0, 0.9],
        ],
        np.float32,
    )
    mount = planar(0.0, 0.0, math.pi / 2, z=1.8)
    scan = prepare_scan(points, mount, ScanParams(SURROUND_ROI, EGO, min_range_m=0.5))
    assert scan.removed == {
        "points_no_return_removed": 1,
        "points_too_near_removed": 1,
        "points_ego_removed": 1,
        "points_outside_roi": 1,
    }
    np.testing.assert_allclose(
        scan.points, [[0.0, -30.0, 0.8, 0.5], [0.0, 10.0, 1.8, 0.9]], atol=1e-5
    )
    assert scan.points.dtype == np.float32


def test_without_crops_only_no_returns_go() -> None:
    points = np.zeros((3, 4), np.float32)
    points[1, :3] = [1.0, 2.0, 0.0]
    scan = prepare_scan(points, np.eye(4), ScanParams(Roi((-5, 5), (-5, 5), (-5, 5))))
    assert scan.points.shape == (1, 4) and scan.removed["points_no_return_removed"] == 2
    assert sum(scan.removed.values()) == 2


@pytest.mark.parametrize(
    "make",
    [
        lambda: ScanParams(min_range_m=-1.0),
        lambda: ScanParams(min_range_m=math.nan),
        lambda: Box((1.0, 1.0), (-1.0, 1.0), (0.0, 1.0)),
        lambda: Box((0.0, math.inf), (-1.0, 1.0), (0.0, 1.0)),
    ],
)
def test_bad_crop_settings_are_refused(make: object) -> None:
    with pytest.raises(ConfigError):
        make()  # type: ignore[operator]


def test_the_minimum_range_is_decided_in_float64_at_the_bound() -> None:
    rng = np.random.default_rng(4)
    directions = rng.normal(size=(2000, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    bound = 0.5
    radii = np.float32(bound) + np.arange(-1000, 1000, dtype=np.float32) * np.float32(6e-8)
    xyz = (directions * radii[:, None]).astype(np.float32)
    far = rng.uniform((-40.0, -40.0, -2.0), (40.0, 40.0, 2.0), size=(500, 3))
    xyz = np.concatenate([xyz, far.astype(np.float32)])
    points = np.concatenate([xyz, np.zeros((xyz.shape[0], 1), np.float32)], axis=1)
    scan = prepare_scan(points, np.eye(4), ScanParams(min_range_m=bound))
    exact = np.einsum("ij,ij->i", xyz, xyz, dtype=np.float64) < bound**2
    assert scan.removed["points_too_near_removed"] == int(exact.sum())
    kept = {tuple(p) for p in scan.points[:, :3].tolist()}
    assert kept == {tuple(p) for p in xyz[~exact].tolist()}
