"""DDS replay offers each topic the QoS its bag recorded (``offered_qos_profiles``), as
``ros2 bag play`` does, with per-topic overrides; a replayed /tf_static reaches a late joiner."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rosbags.interfaces import Qos, QosDurability, QosHistory, QosReliability
from tf2_msgs.msg import TFMessage

from dynshape_perception.cli.main import main
from dynshape_perception.errors import ConfigError
from dynshape_perception.io import bags
from dynshape_perception.io.qos import (
    LATCHED_DEPTH,
    MIXED,
    OVERRIDE,
    RECORDED,
    adapt,
    load_overrides,
    parse_overrides,
)
from dynshape_perception.nodes.bag_player import BagPlayer, PlayOptions, tracks_for
from dynshape_perception.testing.processes import leased_context

pytestmark = pytest.mark.ros

LATE_JOIN_WAIT_S = 20.0


def offer(reliability: QosReliability, durability: QosDurability, depth: int = 1) -> Qos:
    recorded = bags.offered_qos("/x")
    return recorded._replace(
        history=QosHistory.KEEP_LAST, depth=depth, reliability=reliability, durability=durability
    )


RELIABLE, BEST_EFFORT = QosReliability.RELIABLE, QosReliability.BEST_EFFORT
VOLATILE, LATCHED = QosDurability.VOLATILE, QosDurability.TRANSIENT_LOCAL


def test_adapting_to_the_recorded_offers() -> None:
    same = adapt("/points", [offer(BEST_EFFORT, VOLATILE), offer(BEST_EFFORT, VOLATILE)])
    assert (same.reliability, same.durability, same.source) == ("best_effort", "volatile", RECORDED)
    latched = adapt("/map", [offer(RELIABLE, LATCHED, depth=500)])
    assert (latched.durability, latched.depth) == ("transient_local", 500)
    # Mixed publishers: what a subscriber matched with all of them could rely on.
    mixed = adapt("/odom", [offer(RELIABLE, LATCHED), offer(BEST_EFFORT, VOLATILE)])
    assert (mixed.reliability, mixed.durability, mixed.source) == ("best_effort", "volatile", MIXED)
    # Nothing recorded: reliable and volatile, /tf_static latched as tf2 listeners ask.
    assert adapt("/odom", []).durability == "volatile"
    static = adapt("/tf_static", [])
    assert (static.reliability, static.durability, static.depth) == (
        "reliable",
        "transient_local",
        LATCHED_DEPTH,
    )


@pytest.mark.parametrize(
    ("document", "match"),
    [
        ({"/tf": {"reliability": "sometimes"}}, "reliability must be one of"),
        ({"/tf": {"durability": "persistent"}}, "durability must be one of"),
        ({"/tf": {"history": "keep_some"}}, "history must be one of"),
        ({"/tf": {"depth": 0}}, "depth must be an integer >= 1"),
        ({"/tf": {"depth": True}}, "depth must be an integer >= 1"),
        ({"/tf": {"deadline": 3}}, "unknown QoS setting 'deadline'"),
        ({"/tf": "reliable"}, "expected a mapping of QoS settings"),
        (["/tf"], "expected a mapping of topic names"),
    ],
)
def test_bad_overrides_are_refused(document: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_overrides(document)


def test_override_files_that_do_not_parse_are_refused(tmp_path: Path) -> None:
    broken = tmp_path / "qos.yaml"
    broken.write_text("/tf: {reliability: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_overrides(broken)
    with pytest.raises(ConfigError, match="cannot read"):
        load_overrides(tmp_path / "missing.yaml")


@pytest.fixture
def node() -> Iterator[Node]:
    with leased_context() as ctx:
        made = Node("qos_player_test", context=ctx)
        yield made
        made.destroy_node()


def offered(node: Node, topic: str) -> tuple[ReliabilityPolicy, DurabilityPolicy]:
    (info,) = node.get_publishers_info_by_topic(topic)
    return info.qos_profile.reliability, info.qos_profile.durability


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_bags_recorded_by_rosbag2_keep_their_qos(
    shared_data: Path, storage: str, node: Node
) -> None:
    """ros2/rosbag2's talker bags: /topic reliable and volatile, /rosout transient local (the
    sqlite3 one records another distro's Log definition: /rosout is skipped there)."""
    options = PlayOptions(rate=100.0, remaps={"/rosout": "/replayed_rosout"})
    with bags.BagReader(shared_data / "rosbag2" / f"{storage}_talker") as reader:
        rosout = adapt("/rosout", reader.offered_qos("/rosout"))
        assert (rosout.reliability, rosout.durability, rosout.source) == (
            "reliable",
            "transient_local",
            RECORDED,
        )
        tracks, _ = tracks_for(reader, options)
        qos = {t.topic: (t.qos.reliability, t.qos.durability, t.qos.source) for t in tracks}
        assert qos["/topic"] == ("reliable", "volatile", RECORDED)
        if storage == "mcap":
            assert qos["/rosout"] == ("reliable", "transient_local", RECORDED)
        else:
            assert "/rosout" not in qos
        published = BagPlayer(node).play(reader, tracks, options)
    assert published["/topic"] == 10
    assert offered(node, "/topic") == (ReliabilityPolicy.RELIABLE, DurabilityPolicy.VOLATILE)
    if "/rosout" in qos:
        assert offered(node, "/replayed_rosout") == (
            ReliabilityPolicy.RELIABLE,
            DurabilityPolicy.TRANSIENT_LOCAL,
        )


def test_an_override_replaces_the_recorded_qos_of_its_topic(shared_data: Path, node: Node) -> None:
    overrides = parse_overrides({"topic": {"reliability": "best_effort", "depth": 3}})
    options = PlayOptions(rate=100.0, topics=("/topic",), qos_overrides=overrides)
    with bags.BagReader(shared_data / "rosbag2" / "mcap_talker") as reader:
        tracks, _ = tracks_for(reader, options)
        assert [(t.qos.reliability, t.qos.depth, t.qos.source) for t in tracks] == [
            ("best_effort", 3, OVERRIDE)
        ]
        BagPlayer(node).play(reader, tracks, options)
    assert offered(node, "/topic") == (ReliabilityPolicy.BEST_EFFORT, DurabilityPolicy.VOLATILE)
    unknown = PlayOptions(qos_overrides=parse_overrides({"/nowhere": {"depth": 1}}))
    with bags.BagReader(shared_data / "rosbag2" / "mcap_talker") as reader:
        with pytest.raises(ConfigError, match=r"does not hold.*'/nowhere'"):
            tracks_for(reader, unknown)


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_replayed_tf_static_reaches_a_late_joining_subscriber(
    tmp_path: Path, storage: str, node: Node
) -> None:
    bag = tmp_path / "drive"
    args = ["make-bag", "--source", "generated", "--out", str(bag), "--storage", storage]
    assert main([*args, "--frames", "2", "--points", "2000:3000"]) == 0
    options = PlayOptions(rate=100.0, topics=("/tf_static", "/odom"))
    with bags.BagReader(bag) as reader:
        assert [q.durability for q in reader.offered_qos("/tf_static")] == [LATCHED]
        tracks, _ = tracks_for(reader, options)
        assert {t.topic: t.qos.durability for t in tracks} == {
            "/tf_static": "transient_local",
            "/odom": "volatile",
        }
        BagPlayer(node).play(reader, tracks, options)
    # Subscribed only now, after the play: the latched transform still arrives.
    got: list[TFMessage] = []
    latched = QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=10,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
    )
    listener = Node("late_listener", context=node.context)
    try:
        listener.create_subscription(TFMessage, "/tf_static", got.append, latched)
        executor = SingleThreadedExecutor(context=node.context)
        executor.add_node(listener)
        deadline = time.monotonic() + LATE_JOIN_WAIT_S
        while not got and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.05)
        executor.shutdown()
    finally:
        listener.destroy_node()
    assert got, "the late subscriber got no /tf_static"
    frames = {(t.header.frame_id, t.child_frame_id) for t in got[0].transforms}
    assert frames == {("base_link", "lidar")}
