"""Replay topic planning: names, remaps, types, selection, and the reasons for skipping."""

from __future__ import annotations

import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.io.bags import DETECTION3D_ARRAY, ODOMETRY, POINTCLOUD2, TopicInfo
from dynshape_perception.io.topics import parse_remaps, plan_topics

TOPICS = [
    TopicInfo("/velodyne_points", POINTCLOUD2, 10),
    TopicInfo("/odom", ODOMETRY, 20),
    TopicInfo("/rosout", "rcl_interfaces/msg/Log", 3),
    TopicInfo("/detections", DETECTION3D_ARRAY, 10),
    TopicInfo("/obstacles", POINTCLOUD2, 10),
    TopicInfo("/ground_truth", ODOMETRY, 4),
]


def _reasons(plan: object) -> dict[str, str]:
    return {s.topic: s.reason for s in plan.skipped}  # type: ignore[attr-defined]


def test_plain_names_and_preferences() -> None:
    plan = plan_topics(TOPICS, None, {})
    assert plan.driver is not None and plan.driver.topic == "/obstacles"
    assert {role: u.topic for role, u in plan.used.items()} == {
        "obstacles": "/obstacles",
        "odom": "/odom",
    }
    reasons = _reasons(plan)
    assert reasons["/detections"] == "/obstacles feeds obstacles"
    assert "--remap /velodyne_points:=points" in reasons["/velodyne_points"]
    assert reasons["/rosout"] == "not an input type of the pipeline"
    assert "ground_truth takes sensor_msgs/msg/PointCloud2" in reasons["/ground_truth"]


def test_remap_makes_points_drive() -> None:
    plan = plan_topics(TOPICS, None, parse_remaps(["/velodyne_points:=points"]))
    assert plan.driver is not None and plan.driver.topic == "/velodyne_points"
    assert plan.driver.name == "/points"
    assert _reasons(plan)["/obstacles"] == "the points drive the pipeline; not needed"


def test_selection() -> None:
    plan = plan_topics(TOPICS, ["detections", "/odom"], {})
    assert plan.driver is not None and plan.driver.msgtype == DETECTION3D_ARRAY
    assert _reasons(plan)["/obstacles"] == "not among --topics"


def test_nothing_usable() -> None:
    plan = plan_topics([TopicInfo("/topic", "std_msgs/msg/String", 10)], None, {})
    assert plan.driver is None and plan.used == {}
    plan = plan_topics([TopicInfo("/points", POINTCLOUD2, 0)], None, {})
    assert plan.driver is None and _reasons(plan)["/points"] == "holds no messages"


@pytest.mark.parametrize("bad", ["points", "a:=", ":=b", "a=b"])
def test_bad_remap(bad: str) -> None:
    with pytest.raises(ConfigError, match="from:=to"):
        parse_remaps([bad])
