"""rosbag2 writing and reading without ROS: round trips, byte-identical bags, corrupt files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.errors import DataError
from dynshape_perception.io import bags, msgtypes
from dynshape_perception.io.classes import CLASSES
from dynshape_perception.io.objects import detections_to_obstacles
from dynshape_perception.io.pointcloud2 import cloud_to_points, cloud_to_table
from dynshape_perception.perception.records import OBSTACLE_DTYPE, PREDICTION_DTYPE, TRACK_DTYPE

T0 = 1_700_000_000 * 1_000_000_000


def _tables(rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, dtype, rows in (
        ("obstacles", OBSTACLE_DTYPE, 7),
        ("tracks", TRACK_DTYPE, 5),
        ("predictions", PREDICTION_DTYPE, 0),
    ):
        table = np.zeros(rows, dtype=dtype)
        for field in dtype.names or ():
            kind = dtype.fields[field][0].kind  # type: ignore[index]
            table[field] = rng.integers(0, 99, rows) if kind == "u" else rng.normal(size=rows)
        if "length" in (dtype.names or ()):
            for field in ("length", "width", "height"):
                table[field] = np.abs(table[field]) + 0.1
        out[name] = table
    # Labels the class map names (a detection's class id is the name).
    out["obstacles"]["label"] = rng.choice(sorted(CLASSES), 7)
    return out


def _write(path: Path, storage: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(1234, 4)).astype(np.float32)
    tables = _tables(rng)
    with bags.BagWriter(path, storage) as writer:
        for k in range(3):
            ns = T0 + k * 100_000_000
            writer.write("/points", ns, bags.points_message(points, ns, "lidar"))
            writer.write("/odom", ns, bags.odometry_message(ns, 1.0 + k, -2.0, 0.25, 3.0, 0.1))
            for name, table in tables.items():
                writer.write(f"/{name}", ns, bags.table_message(table, ns, "odom"))
            writer.write(
                "/detections", ns, bags.detections_message(tables["obstacles"], ns, "lidar")
            )
    return {"points": points, **tables}


def _digest(bag: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(bag.iterdir()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_round_trip(tmp_path: Path, storage: str) -> None:
    bag = tmp_path / "bag"
    written = _write(bag, storage)
    assert [p.name for p in tmp_path.iterdir()] == ["bag"], "no temporary folder is left"
    seen: dict[str, int] = {}
    with bags.BagReader(bag) as reader:
        topics = {t.name: (t.msgtype, t.count) for t in reader.topics()}
        assert topics["/points"] == (bags.POINTCLOUD2, 3)
        assert topics["/detections"] == (bags.DETECTION3D_ARRAY, 3)
        for message in reader.messages():
            msg = reader.deserialize(message)
            seen[message.topic] = seen.get(message.topic, 0) + 1
            assert bags.stamp_ns(msg.header.stamp) == message.log_ns
            if message.topic == "/points":
                assert np.array_equal(cloud_to_points(msg).xyzi, written["points"])
            elif message.topic == "/odom":
                ns, x, y, yaw = bags.odometry_pose(msg)
                assert (ns, y, msg.child_frame_id) == (message.log_ns, -2.0, "base_link")
                assert x == pytest.approx(1.0 + (ns - T0) / 100_000_000)
                assert yaw == pytest.approx(0.25)
            elif message.topic == "/detections":
                got = detections_to_obstacles(msg)
                want = written["obstacles"]
                assert isinstance(want, np.ndarray)
                for field in ("x", "y", "z", "length", "width", "height", "score", "label"):
                    np.testing.assert_allclose(got[field], want[field], rtol=1e-6)
                np.testing.assert_allclose(
                    np.angle(np.exp(1j * (got["yaw"] - want["yaw"]))), 0.0, atol=1e-6
                )
            else:
                dtype = {"/obstacles": OBSTACLE_DTYPE, "/tracks": TRACK_DTYPE}.get(
                    message.topic, PREDICTION_DTYPE
                )
                assert np.array_equal(cloud_to_table(msg, dtype), written[message.topic[1:]])
    assert seen == {t: 3 for t in topics}


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_same_content_gives_identical_bytes(tmp_path: Path, storage: str) -> None:
    _write(tmp_path / "a" / "bag", storage)
    _write(tmp_path / "b" / "bag", storage)
    _write(tmp_path / "c" / "bag", storage, seed=1)
    assert _digest(tmp_path / "a" / "bag") == _digest(tmp_path / "b" / "bag")
    assert _digest(tmp_path / "a" / "bag") != _digest(tmp_path / "c" / "bag")


def test_vision_msgs_definitions_are_embedded(tmp_path: Path) -> None:
    _write(tmp_path / "bag", "mcap")
    with bags.BagReader(tmp_path / "bag") as reader:
        conn = next(c for c in reader.reader.connections if c.topic == "/detections")
        assert "vision_msgs/Detection3D[] detections" in conn.msgdef.data
        assert conn.digest == msgtypes.typestore().hash_rihs01(bags.DETECTION3D_ARRAY)


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), bags.BagWriter(tmp_path / "bag") as writer:
        writer.write("/odom", T0, bags.odometry_message(T0, 0.0, 0.0, 0.0, 0.0, 0.0))
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_existing_bag_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "bag").mkdir()
    with pytest.raises(DataError, match="exists already"), bags.BagWriter(tmp_path / "bag"):
        pass


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
@pytest.mark.parametrize("damage", ["truncate", "zeros", "empty", "no_metadata", "bad_metadata"])
def test_corrupt_bags_raise_data_error_naming_the_file(
    tmp_path: Path, storage: str, damage: str
) -> None:
    bag = tmp_path / "bag"
    _write(bag, storage)
    data = next(f for f in bag.iterdir() if f.name != "metadata.yaml")
    raw = data.read_bytes()
    if damage == "truncate":
        data.write_bytes(raw[: len(raw) // 2])
    elif damage == "zeros":
        data.write_bytes(bytes(len(raw)))
    elif damage == "empty":
        data.write_bytes(b"")
    elif damage == "no_metadata":
        (bag / "metadata.yaml").unlink()
    else:
        (bag / "metadata.yaml").write_text("rosbag2_bagfile_information: [")
    with pytest.raises(DataError, match=str(bag)), bags.BagReader(bag) as reader:
        for message in reader.messages():
            reader.deserialize(message)


def test_missing_bag(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"), bags.BagReader(tmp_path / "nope"):
        pass
