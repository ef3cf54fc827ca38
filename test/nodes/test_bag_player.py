"""The DDS bag player's options, and its frame limit, checked before anything is published."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rclpy
from rclpy.context import Context
from rclpy.node import Node

from dynshape_perception.errors import ConfigError
from dynshape_perception.io import bags
from dynshape_perception.nodes.bag_player import BagPlayer, PlayOptions, tracks_for

pytestmark = pytest.mark.ros

T0 = 1_700_000_000_000_000_000


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"rate": float("inf")}, "rate"),
        ({"rate": 0.0}, "rate"),
        ({"start_offset_s": float("nan")}, "start offset"),
        ({"start_offset_s": -3.0}, "start offset"),
        ({"clock_hz": float("inf")}, "clock rate"),
        ({"wait_for_subscribers_s": float("inf")}, "wait_for_subscribers_s"),
        ({"drain_s": -1.0}, "drain_s"),
        ({"drain_s": float("nan")}, "drain_s"),
        ({"max_frames": 0}, "max_frames"),
        ({"max_frames": -2}, "max_frames"),
    ],
)
def test_play_options_are_checked(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        PlayOptions(**change)


@pytest.fixture
def node() -> Iterator[Node]:
    ctx = Context()
    rclpy.init(args=[], context=ctx)
    made = Node("player_test", context=ctx)
    yield made
    made.destroy_node()
    rclpy.shutdown(context=ctx)


def test_a_frame_limit_needs_its_driver_topic_among_those_played(
    tmp_path: Path, node: Node
) -> None:
    """Frames are counted on the driver topic: a bag without it would play on forever."""
    bag = tmp_path / "odom_only"
    with bags.BagWriter(bag, "mcap") as writer:
        for k in range(3):
            ns = T0 + k * 100_000_000
            writer.write("/odom", ns, bags.odometry_message(ns, 0, 0, 0, 0, 0))
    options = PlayOptions(max_frames=1, loop=True)
    with bags.BagReader(bag) as reader:
        tracks, _ = tracks_for(reader, options)
        with pytest.raises(ConfigError, match="driver topic"):
            BagPlayer(node).play(reader, tracks, options, driver="/points")


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_the_player_skips_topics_it_cannot_decode_and_plays_the_rest(
    service_event_bag: Path, storage: str, node: Node
) -> None:
    with bags.BagReader(service_event_bag) as reader:
        tracks, skipped = tracks_for(reader, PlayOptions())
        assert [t.name for t in tracks] == ["/points"]
        assert [(s.topic, s.reason.split(":")[0]) for s in skipped] == [
            ("/planner/get_parameters/_service_event", "service event topic")
        ]
        published = BagPlayer(node).play(reader, tracks, PlayOptions(rate=100.0))
    assert published == {"/points": 3}
