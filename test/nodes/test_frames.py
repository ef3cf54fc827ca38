"""tf2_ros' buffer under the core's localizer: lookups as 4x4 matrices, failures as errors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from rclpy.time import Time
from tf2_ros import Buffer

from dynshape_perception.errors import TransformError
from dynshape_perception.nodes.frames import Tf2Lookup
from dynshape_perception.nodes.messages import time_msg, transform_msg
from dynshape_perception.perception.localization import TF, FrameParams, Localizer
from dynshape_perception.perception.transforms import planar

pytestmark = pytest.mark.ros

NS = 5_000_000_000


def test_tf2_lookups_feed_the_localizer() -> None:
    buffer = Buffer()
    mount = planar(1.2, 0.0, math.pi / 2, z=1.8)
    buffer.set_transform_static(transform_msg("base_link", "lidar", mount, time_msg(0)), "test")
    for k in range(3):
        buffer.set_transform(
            transform_msg("odom", "base_link", planar(2.0 * k), time_msg(NS + k * 100_000_000)),
            "test",
        )
    tf = Tf2Lookup(buffer)
    np.testing.assert_allclose(tf.lookup("base_link", "lidar", 5.05), mount, atol=1e-9)
    assert tf.connected("odom", "lidar") and not tf.connected("map", "lidar")
    with pytest.raises(TransformError, match="'lidar' -> 'odom'"):
        tf.lookup("odom", "lidar", 9.0)
    located = Localizer(tf, FrameParams()).locate("lidar", 5.15)
    assert located is not None and located.source == TF and located.fixed_frame == "odom"
    np.testing.assert_allclose(located.to_fixed, planar(3.0) @ mount, atol=1e-9)


def test_connected_is_what_tf2_can_transform_says() -> None:
    """The look in tf2's frame table before can_transform changes no answer: two trees, a
    frame of neither, and each frame with itself."""
    buffer = Buffer()
    buffer.set_transform_static(
        transform_msg("base_link", "lidar", planar(1.0, 0.0, 0.0), time_msg(0)), "test"
    )
    buffer.set_transform(transform_msg("odom", "base_link", planar(2.0), time_msg(NS)), "test")
    buffer.set_transform(transform_msg("map", "beacon", planar(3.0), time_msg(NS)), "test")
    tf = Tf2Lookup(buffer)
    frames = ("odom", "base_link", "lidar", "map", "beacon", "nowhere")
    answers = {(t, s): tf.connected(t, s) for t, s in itertools.product(frames, repeat=2)}
    assert answers == {
        (t, s): bool(buffer.can_transform(t, s, Time()))
        for t, s in itertools.product(frames, repeat=2)
    }
    assert answers["odom", "lidar"] and not answers["map", "lidar"]
    assert not answers["nowhere", "odom"] and not answers["odom", "nowhere"]
