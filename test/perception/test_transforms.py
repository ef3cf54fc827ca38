"""4x4 transforms, checked quaternions, and the ROS-free transform tree of replays."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.errors import TransformError
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.transforms import (
    DegenerateQuaternion,
    TransformTree,
    interpolate,
    inverse,
    matrix,
    normalised_quaternion,
    planar,
    quaternion_of,
    transform_points,
    yaw_of,
    yaw_quaternion,
)


def test_a_scaled_quaternion_is_normalised() -> None:
    # The odometry of the hostile-input probe: twice-too-long (0, 0, 1.414, 1.414) is 90 deg.
    q = normalised_quaternion(0.0, 0.0, 1.414, 1.414)
    assert q == pytest.approx((0.0, 0.0, math.sqrt(0.5), math.sqrt(0.5)))
    m = matrix((0.0, 0.0, 0.0), (0.0, 0.0, 1.414, 1.414))
    assert transform_points(m, np.array([[10.0, 0.0, 0.0]]))[0] == pytest.approx([0.0, 10.0, 0.0])


@pytest.mark.parametrize(
    "q",
    [
        (0.0, 0.0, 0.0, 0.0),
        (0.0, 0.0, 1e-9, 0.0),
        (math.nan, 0.0, 0.0, 1.0),
        (0, 0, 0, math.inf),
        # The squared length overflows: read as all zeros it would be yaw 0.
        (0.0, 0.0, 1e200, 1e200),
    ],
)
def test_a_degenerate_quaternion_is_refused(q: tuple[float, ...]) -> None:
    with pytest.raises(DegenerateQuaternion):
        normalised_quaternion(*q)
    assert issubclass(DegenerateQuaternion, TransformError)


def test_matrix_quaternion_and_yaw_agree() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = rng.normal(size=4)
        m = matrix(rng.normal(size=3), q)
        assert np.allclose(m[:3, :3] @ m[:3, :3].T, np.eye(3))
        back = matrix(m[:3, 3], quaternion_of(m))
        np.testing.assert_allclose(back, m, atol=1e-9)
        np.testing.assert_allclose(inverse(m) @ m, np.eye(4), atol=1e-9)
    for yaw in (-3.0, -1.0, 0.0, 0.5, 3.1):
        assert yaw_of(planar(1.0, 2.0, yaw)) == pytest.approx(yaw)
        assert yaw_of(matrix((0, 0, 0), yaw_quaternion(yaw))) == pytest.approx(yaw)


def test_points_keep_their_other_columns_and_dtype() -> None:
    points = np.array([[1.0, 0.0, 0.0, 0.25], [0.0, 2.0, 1.0, 0.75]], np.float32)
    moved = transform_points(planar(10.0, 0.0, math.pi / 2, z=1.8), points)
    assert moved.dtype == np.float32
    np.testing.assert_allclose(moved, [[10.0, 1.0, 1.8, 0.25], [8.0, 0.0, 2.8, 0.75]], atol=1e-6)


def test_interpolation_takes_the_short_way() -> None:
    a, b = planar(0.0, 0.0, math.pi - 0.1), planar(10.0, 0.0, -math.pi + 0.1)
    mid = interpolate(a, b, 0.5)
    assert mid[0, 3] == pytest.approx(5.0) and abs(abs(yaw_of(mid)) - math.pi) < 1e-9


def test_tree_chains_static_and_dynamic_transforms() -> None:
    tree = TransformTree()
    mount = planar(1.0, 0.0, math.pi / 2, z=1.8)
    tree.set("base_link", "lidar", 0.0, mount, static=True)
    tree.set("odom", "base_link", 10.0, planar(0.0, 0.0, 0.0), static=False)
    tree.set("odom", "base_link", 11.0, planar(2.0, 0.0, 0.0), static=False)
    point = np.array([[5.0, 0.0, 0.0]])
    at = tree.lookup("odom", "lidar", 10.5)
    # 5 m along the lidar's x is 5 m left of base_link, which is 1 m along odom's x.
    np.testing.assert_allclose(transform_points(at, point)[0], [2.0, 5.0, 1.8], atol=1e-9)
    np.testing.assert_allclose(tree.lookup("lidar", "odom", 10.5) @ at, np.eye(4), atol=1e-9)
    assert tree.connected("odom", "lidar") and not tree.connected("odom", "map")
    with pytest.raises(TransformError, match=r"at 12\.0"):
        tree.lookup("odom", "lidar", 12.0)
    with pytest.raises(TransformError, match="not connected"):
        tree.lookup("map", "lidar", 10.5)


def test_tree_forgets_old_dynamic_transforms_and_refuses_bad_edges() -> None:
    tree = TransformTree(cache_s=1.0, tolerance_s=0.05)
    for k in range(30):
        tree.set("odom", "base_link", 0.1 * k, planar(float(k)), static=False)
    assert not tree.can_transform("odom", "base_link", 0.5)
    assert tree.can_transform("odom", "base_link", 2.93)  # within the tolerance past the end
    with pytest.raises(TransformError, match="two frames"):
        tree.set("odom", "odom", 0.0, np.eye(4), static=True)


def _product(m: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The general path: every point through the full matrix product."""
    out = points.copy()
    out[:, :3] = points[:, :3].astype(np.float64) @ m[:3, :3].T + m[:3, 3]
    return out


def _awkward_points(kitti_bin: Path) -> np.ndarray:
    """The KITTI scan, with signed zeros, tiny and huge coordinates added."""
    scan = read_kitti_bin(kitti_bin, allow_empty=False)
    rng = np.random.default_rng(3)
    odd = rng.choice([0.0, -0.0, 1e-30, -1e-30, 1e30, -3.0, 2.5], size=(500, 4))
    return np.concatenate([scan, odd.astype(np.float32)])


@pytest.mark.parametrize(
    "offset",
    [(0.0, 0.0, 1.73), (0.3, -0.2, 1.9), (-1e-30, 0.0, 0.0), (5e30, -2.0, 0.0), (0.0, -0.0, 1.0)],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_translation_gives_the_bytes_of_the_matrix_product(
    kitti_bin: Path, offset: tuple[float, float, float], dtype: type
) -> None:
    points: np.ndarray = _awkward_points(kitti_bin).astype(dtype)
    m = np.eye(4)
    m[:3, 3] = offset
    moved = transform_points(m, points)
    assert moved.dtype == points.dtype
    assert moved.tobytes() == _product(m, points).tobytes()
    assert not np.array_equal(moved, points)


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_translation_of_non_finite_points_gives_the_product_too(bad: float) -> None:
    # inf times a zero of the rotation is NaN in the product, in the other coordinates too.
    points: np.ndarray = np.array(
        [[1.0, 2.0, 3.0, 0.5], [bad, 0.0, 1.0, 0.5], [0.0, bad, -0.0, 0.5]]
    )
    m = np.eye(4)
    m[:3, 3] = (0.5, 0.0, 1.73)
    moved = transform_points(m, points.astype(np.float32))
    assert moved.tobytes() == _product(m, points.astype(np.float32)).tobytes()
    assert np.isnan(moved[1:, :3]).any()
