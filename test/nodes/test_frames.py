"""tf2_ros' buffer under the core's localizer: lookups as 4x4 matrices, failures as errors."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from rclpy.time import Time
from tf2_ros import Buffer, TransformException

from dynshape_perception.errors import TransformError
from dynshape_perception.nodes.frames import StaticTree, Tf2Lookup
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


class CountingBuffer(Buffer):
    """tf2_ros' buffer, counting the lookups that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    def lookup_transform(self, *args: Any, **kwargs: Any) -> Any:
        self.lookups += 1
        return super().lookup_transform(*args, **kwargs)


def _give(buffer: Buffer, tree: StaticTree, parent: str, child: str, m: Any, ns: int) -> None:
    """A transform as TfInput gives one: to tf2's buffer, then to the tree."""
    msg = transform_msg(parent, child, m, time_msg(ns))
    if ns == 0:
        buffer.set_transform_static(msg, "test")
    else:
        buffer.set_transform(msg, "test")
    tree.add(parent, child, static=ns == 0)


def test_a_static_mount_is_looked_up_once_until_a_transform_on_it_changes() -> None:
    buffer, tree = CountingBuffer(), StaticTree()
    tf, plain = Tf2Lookup(buffer, tree), Tf2Lookup(buffer)
    _give(buffer, tree, "base_link", "mount", planar(1.0, 0.5, 0.3), 0)
    _give(buffer, tree, "mount", "lidar", planar(0.2, 0.0, 0.1, z=1.5), 0)
    _give(buffer, tree, "odom", "base_link", planar(2.0), NS)
    _give(buffer, tree, "odom", "base_link", planar(2.5), NS + 100_000_000)
    want = plain.lookup("base_link", "lidar", 5.0)
    buffer.lookups = 0
    for stamp in (5.0, 6.0, 0.0):
        got = tf.lookup("base_link", "lidar", stamp)
        np.testing.assert_array_equal(got, want)
        got[:] = 0.0  # a caller's copy: what is kept stays as it was
    assert buffer.lookups == 1
    # Another mount on /tf_static: looked up again, and kept again.
    _give(buffer, tree, "mount", "lidar", planar(0.4, 0.0, 0.2, z=1.5), 0)
    for _ in range(2):
        np.testing.assert_array_equal(
            tf.lookup("base_link", "lidar", 5.0), plain.lookup("base_link", "lidar", 5.0)
        )
    assert buffer.lookups == 1 + 3
    # The fixed frame comes from /tf: never kept, each stamp looked up.
    for stamp in (5.0, 5.05):
        np.testing.assert_array_equal(
            tf.lookup("odom", "lidar", stamp), plain.lookup("odom", "lidar", stamp)
        )
    assert buffer.lookups == 4 + 4


def test_a_mount_that_turns_dynamic_is_looked_up_each_time() -> None:
    buffer, tree = CountingBuffer(), StaticTree()
    tf = Tf2Lookup(buffer, tree)
    _give(buffer, tree, "base_link", "lidar", planar(1.0), 0)
    tf.lookup("base_link", "lidar", 5.0)
    _give(buffer, tree, "base_link", "lidar", planar(3.0), NS)
    assert not tree.static_chain("base_link", "lidar")
    buffer.lookups = 0
    tf.lookup("base_link", "lidar", 5.0)
    tf.lookup("base_link", "lidar", 5.0)
    assert buffer.lookups == 2


def test_a_kept_mount_still_refuses_a_stamp_tf2_refuses() -> None:
    buffer, tree = Buffer(), StaticTree()
    tf, plain = Tf2Lookup(buffer, tree), Tf2Lookup(buffer)
    _give(buffer, tree, "base_link", "lidar", planar(1.0), 0)
    tf.lookup("base_link", "lidar", 5.0)
    for stamp in (-1.0, math.nan, math.inf):
        raised = []
        for lookup in (plain, tf):
            with pytest.raises(Exception) as err:
                lookup.lookup("base_link", "lidar", stamp)
            raised.append(err.type)
        assert raised[0] is raised[1], stamp
    with pytest.raises(TransformError):
        tf.lookup("base_link", "lidar", -1.0)


def test_static_chains_are_those_of_tf_static_alone() -> None:
    tree = StaticTree()
    tree.add("/base_link", "mount", static=True)  # tf2 strips one leading '/'
    tree.add("mount", "lidar", static=True)
    tree.add("base_link", "camera", static=True)
    tree.add("odom", "base_link", static=False)
    tree.add("radar", "radar", static=True)  # tf2 refuses a frame to itself
    tree.add("", "sonar", static=True)  # and an unnamed one
    assert tree.static_chain("base_link", "lidar") and tree.static_chain("lidar", "camera")
    assert tree.static_chain("camera", "camera")
    assert not tree.static_chain("odom", "lidar")
    assert not tree.static_chain("radar", "base_link") and not tree.static_chain("", "sonar")
    version = tree.version
    tree.add("odom", "base_link", static=False)  # a frame already on /tf: nothing changes
    assert tree.version == version
    tree.add("lidar", "mount", static=True)  # a loop tf2 would refuse to follow ends too
    assert tree.version == version + 1
    assert not tree.static_chain("odom", "lidar")


def test_a_frame_no_transform_named_is_refused_before_tf2_is_asked() -> None:
    buffer = CountingBuffer()
    buffer.set_transform_static(
        transform_msg("base_link", "lidar", planar(1.0), time_msg(0)), "test"
    )
    tf = Tf2Lookup(buffer)
    for target, source in (("base_link", "radar"), ("map", "lidar"), ("map", "radar")):
        with pytest.raises(TransformError, match="does not exist"):
            tf.lookup(target, source, 5.0)
        with pytest.raises(TransformException):
            Buffer.lookup_transform(buffer, target, source, Time())
    assert buffer.lookups == 0
    # A frame to itself is the identity, named or not, as in tf2.
    np.testing.assert_array_equal(tf.lookup("radar", "radar", 5.0), np.eye(4))
    np.testing.assert_array_equal(tf.lookup("base_link", "lidar", 5.0), planar(1.0))
