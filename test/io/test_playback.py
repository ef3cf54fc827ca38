"""The DDS player's timetable (ROS-free): header stamps, loops, rate, names and skips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rosbags.typesys.stores.ros2_jazzy import nav_msgs__msg__Odometry as Odometry

from dynshape_perception.errors import ConfigError
from dynshape_perception.io import bags, msgtypes
from dynshape_perception.io.playback import (
    header_stamp,
    plan_tracks,
    shift_stamp,
    starts_with_header,
    timetable,
)
from dynshape_perception.io.topics import parse_remaps
from dynshape_perception.perception.records import OBSTACLE_DTYPE

T0 = 1_700_000_000 * 1_000_000_000
STEP = 100_000_000


def _bag(path: Path) -> Path:
    with bags.BagWriter(path, "mcap") as writer:
        for k in range(4):
            ns = T0 + k * STEP
            cloud = bags.points_message(np.zeros((3, 4), np.float32), ns, "lidar")
            writer.write("/velodyne", ns, cloud)
            writer.write(
                "/odom", ns + STEP // 2, bags.odometry_message(ns + STEP // 2, 0, 0, 0, 0, 0)
            )
            writer.write("/clock", ns, bags.clock_message(ns))
            writer.write(
                "/detections",
                ns,
                bags.detections_message(np.zeros(0, OBSTACLE_DTYPE), ns, "x"),
            )
    return path


def test_stamps_are_read_and_shifted_in_place() -> None:
    raw = msgtypes.typestore().serialize_cdr(
        bags.odometry_message(T0 + 123, 1.0, 2.0, 0.5, 0.0, 0.0), bags.ODOMETRY
    )
    assert header_stamp(raw) == T0 + 123
    moved = shift_stamp(raw, 2 * 1_000_000_000 + 999_999_900)
    assert header_stamp(moved) == T0 + 123 + 2_999_999_900
    msg = msgtypes.typestore().deserialize_cdr(moved, bags.ODOMETRY)
    assert isinstance(msg, Odometry)
    assert (msg.pose.pose.position.x, msg.child_frame_id) == (1.0, "base_link")
    assert starts_with_header(bags.POINTCLOUD2) and not starts_with_header(bags.CLOCK)


def test_plan_and_timetable_with_loop(tmp_path: Path) -> None:
    bag = _bag(tmp_path / "bag")
    with bags.BagReader(bag) as reader:
        tracks, skipped = plan_tracks(
            reader.topics(),
            None,
            parse_remaps(["/velodyne:=/points"]),
            lambda t: not t.startswith("vision_msgs/"),
            reader.definition_differs,
        )
        assert {t.topic: t.name for t in tracks} == {"/velodyne": "/points", "/odom": "/odom"}
        assert not any(reader.definition_differs(t.name) for t in reader.topics())
        _, refused = plan_tracks(reader.topics(), None, {}, lambda t: True, lambda n: n == "/odom")
        assert {s.topic: s.reason for s in refused}["/odom"] == (
            "recorded definition differs from the installed one"
        )
        reasons = {s.topic: s.reason for s in skipped}
        assert reasons["/clock"] == "the player publishes /clock itself"
        assert reasons["/detections"] == "message type not installed in this ROS 2"
        items = list(timetable(reader, tracks, rate=2.0, loop=False))
        assert [i.track.name for i in items[:3]] == ["/points", "/odom", "/points"]
        assert items[-1].due_s == (3 * STEP + STEP // 2) * 1e-9 / 2.0
        looped = []
        for item in timetable(reader, tracks, start_offset_s=0.15, loop=True):
            looped.append(item)
            if len(looped) == 10:
                break
    first = [i for i in looped if i.track.name == "/points"]
    stamps = [header_stamp(i.raw) for i in first]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps), "loops keep time moving"
    assert all(i.bag_ns == header_stamp(i.raw) for i in first)
    assert looped[0].bag_ns >= T0 + 150_000_000


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rate": 0.0}, "rate"),
        ({"rate": float("nan")}, "rate"),
        ({"rate": -1.0}, "rate"),
        ({"rate": float("inf")}, "rate"),
        ({"start_offset_s": float("nan")}, "start offset"),
        ({"start_offset_s": -3.0}, "start offset"),
        ({"start_offset_s": float("inf")}, "start offset"),
    ],
)
def test_timetable_refuses_rates_and_offsets_it_cannot_keep(
    tmp_path: Path, options: dict[str, float], match: str
) -> None:
    with bags.BagReader(_bag(tmp_path / "bag")) as reader:
        tracks, _ = plan_tracks(reader.topics(), None, {}, lambda t: True, lambda n: False)
        with pytest.raises(ConfigError, match=match):
            next(timetable(reader, tracks, **options))  # type: ignore[arg-type]


def test_an_offset_past_the_end_plays_nothing(tmp_path: Path) -> None:
    with bags.BagReader(_bag(tmp_path / "bag")) as reader:
        tracks, _ = plan_tracks(reader.topics(), None, {}, lambda t: True, lambda n: False)
        assert list(timetable(reader, tracks, start_offset_s=1e300)) == []
