"""Where an input lies: TF first, odometry as fallback, a standing vehicle without either."""

from __future__ import annotations

import math
from typing import TypedDict

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError, TransformError
from dynshape_perception.perception.localization import (
    ODOMETRY,
    STATIC,
    TF,
    FrameParams,
    Localizer,
    Mount,
)
from dynshape_perception.perception.transforms import Matrix, TransformTree, planar

MOUNT = planar(1.0, 0.0, math.pi / 2, z=1.8)
FALLBACK = planar(0.5, 0.0, 0.0, z=1.0)


def _odometry(x: float) -> tuple[Matrix, str]:
    return planar(x, 0.0, 0.0), "odom"


def _localizer(tree: TransformTree, odometry_active: bool = False) -> Localizer:
    return Localizer(
        tree,
        FrameParams(fallback_mount=Mount(x_m=0.5, z_m=1.0)),
        lambda s: _odometry(10.0 * s),
        lambda: odometry_active,
    )


def test_tf_gives_the_mount_and_the_fixed_frame() -> None:
    tree = TransformTree()
    tree.set("base_link", "lidar", 0.0, MOUNT, static=True)
    tree.set("odom", "base_link", 1.0, planar(5.0, 0.0, 0.0), static=False)
    tree.set("odom", "base_link", 2.0, planar(7.0, 0.0, 0.0), static=False)
    loc = _localizer(tree, odometry_active=True)
    np.testing.assert_allclose(loc.mount("lidar", 1.5), MOUNT)
    assert loc.mount_source == TF
    located = loc.locate("lidar", 1.5)
    assert located is not None and (located.source, located.fixed_frame) == (TF, "odom")
    np.testing.assert_allclose(located.vehicle, planar(6.0, 0.0, 0.0))
    np.testing.assert_allclose(located.to_fixed, planar(6.0, 0.0, 0.0) @ MOUNT)
    base = loc.locate("base_link", 1.5)
    assert base is not None and np.allclose(base.to_fixed, base.vehicle)
    # Past the newest /tf (which often follows its scan): that pose, within the tolerance.
    late = loc.locate("base_link", 2.3)
    assert late is not None and np.allclose(late.vehicle, planar(7.0, 0.0, 0.0))
    with pytest.raises(TransformError, match="max_extrapolation_s"):
        loc.locate("base_link", 2.6)
    assert tree.latest("odom", "lidar")[1] == 2.0


def test_odometry_when_no_tf_carries_the_fixed_frame() -> None:
    tree = TransformTree()
    loc = _localizer(tree, odometry_active=True)
    located = loc.locate("lidar", 0.5)
    assert located is not None and (located.source, located.fixed_frame) == (ODOMETRY, "odom")
    # No TF mount either: the fallback mount parameters place the lidar.
    np.testing.assert_allclose(located.to_fixed, planar(5.0, 0.0, 0.0) @ FALLBACK)
    assert loc.mount_source == "parameters"
    in_odom = loc.locate("odom", 0.5)
    assert in_odom is not None and np.allclose(in_odom.to_fixed, np.eye(4))


def test_a_standing_vehicle_without_tf_or_odometry() -> None:
    loc = _localizer(TransformTree())
    located = loc.locate("lidar", 3.0)
    assert located is not None and located.source == STATIC and located.fixed_frame == "lidar"
    assert np.allclose(located.to_fixed, np.eye(4))


def test_missing_odometry_pose_is_none() -> None:
    loc = Localizer(TransformTree(), FrameParams(), lambda s: None, lambda: True)
    assert loc.locate("base_link", 1.0) is None


class FrameNames(TypedDict, total=False):
    base_frame: str
    fixed_frame: str


@pytest.mark.parametrize(
    "kwargs", [{"base_frame": ""}, {"fixed_frame": "/odom"}, {"base_frame": "odom"}]
)
def test_bad_frame_names(kwargs: FrameNames) -> None:
    with pytest.raises(ConfigError):
        FrameParams(**kwargs)
