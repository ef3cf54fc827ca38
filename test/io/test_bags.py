"""BagReader and BagWriter on compressed, mis-described and unwritable bags."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from rosbags.interfaces import Connection, MessageDefinition, MessageDefinitionFormat
from rosbags.rosbag2 import CompressionFormat, CompressionMode, Writer

from dynshape_perception.errors import DataError, MessageError
from dynshape_perception.io import bags
from dynshape_perception.tools.replay import sources

T0 = 1_700_000_000 * 1_000_000_000
MESSAGES = 40
SERVICE_EVENT_TOPIC = "/planner/get_parameters/_service_event"
SERVICE_EVENT_TYPE = "rcl_interfaces/srv/GetParameters_Event"


def _compressed(path: Path, storage: str, mode: CompressionMode) -> Path:
    """A bag written by rosbags with zstd compression (the package writes none)."""
    writer = Writer(path, version=bags.BAG_VERSION, storage_plugin=bags.STORAGES[storage])
    writer.set_compression(mode, CompressionFormat.ZSTD)
    writer.open()
    conn = writer.add_connection("/odom", bags.ODOMETRY, typestore=bags.typestore())
    for k in range(MESSAGES):
        ns = T0 + k * 50_000_000
        msg = bags.odometry_message(ns, float(k), 0.0, 0.0, 1.0, 0.0)
        writer.write(conn, ns, bags.typestore().serialize_cdr(msg, bags.ODOMETRY))
    writer.close()
    return path


def _read_all(bag: Path) -> int:
    with bags.BagReader(bag) as reader:
        return sum(1 for _ in reader.messages())


def _damage_frame(data: Path, magic: bytes = b"\x28\xb5\x2f\xfd") -> None:
    """Overwrite the header byte after the first zstd frame magic: the frame cannot decode."""
    raw = bytearray(data.read_bytes())
    at = raw.find(magic)
    assert at >= 0, "no zstd frame found"
    raw[at + 4 : at + 12] = b"\xff" * 8
    data.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("storage", "mode"),
    [
        ("mcap", CompressionMode.FILE),
        ("sqlite3", CompressionMode.FILE),
        ("mcap", CompressionMode.STORAGE),
        ("mcap", CompressionMode.MESSAGE),
        ("sqlite3", CompressionMode.MESSAGE),
    ],
)
def test_corrupt_zstd_data_is_a_data_error(
    tmp_path: Path, storage: str, mode: CompressionMode
) -> None:
    bag = _compressed(tmp_path / "bag", storage, mode)
    assert _read_all(bag) == MESSAGES
    _damage_frame(next(f for f in bag.iterdir() if f.name != "metadata.yaml"))
    with pytest.raises(DataError, match=re.escape(str(bag))):
        _read_all(bag)


def _zero_topic_counts(bag: Path) -> None:
    meta = bag / "metadata.yaml"
    text = meta.read_text()
    fixed = re.sub(r"(\n  - message_count:) \d+", r"\1 0", text)
    assert fixed != text
    meta.write_text(fixed)


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_counts_come_from_the_storage_when_metadata_says_zero(tmp_path: Path, storage: str) -> None:
    good = tmp_path / "good"
    sources.write_crowd(good, storage, seed=1, frames=5, agents=2)
    with bags.BagReader(good) as reader:
        expected = (reader.topics(), reader.start_ns, reader.end_ns)
    assert all(t.count == 5 for t in expected[0])
    bag = tmp_path / "zeroed"
    sources.write_crowd(bag, storage, seed=1, frames=5, agents=2)
    _zero_topic_counts(bag)
    with bags.BagReader(bag) as reader:
        assert (reader.topics(), reader.start_ns, reader.end_ns) == expected
        assert sum(1 for _ in reader.messages()) == 10


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_start_past_the_end_reads_nothing(tmp_path: Path, storage: str) -> None:
    bag = tmp_path / "bag"
    sources.write_crowd(bag, storage, seed=1, frames=5, agents=2)
    with bags.BagReader(bag) as reader:
        last = max(m.log_ns for m in reader.messages())
        assert reader.end_ns == last + 1
        assert [m.log_ns for m in reader.messages(start_ns=last)] == [last, last]
        for start in (last + 1, 2**63, 10**300):
            assert list(reader.messages(start_ns=start)) == []


def test_writer_under_a_file_or_unwritable_folder_is_a_data_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker / "bag", Path("/proc/nope/bag")):
        with pytest.raises(DataError, match="cannot create bag"), bags.BagWriter(out):
            pass


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_topic_whose_schema_does_not_parse_is_listed_and_the_rest_reads(
    service_event_bag: Path, storage: str
) -> None:
    """A service event's schema (request --- response) costs its own topic, not the bag."""
    with bags.BagReader(service_event_bag) as reader:
        topics = {t.name: t for t in reader.topics()}
        event = topics[SERVICE_EVENT_TOPIC]
        assert (event.msgtype, event.count) == (SERVICE_EVENT_TYPE, 3)
        assert event.unreadable.startswith("service event topic: its recorded definition")
        assert "cannot be parsed" in event.unreadable
        assert topics["/points"].unreadable == "" and topics["/points"].count == 3
        clouds = [reader.deserialize(m) for m in reader.messages(["/points"])]
        assert [c.width for c in clouds] == [6000] * 3
        raw = next(reader.messages([SERVICE_EVENT_TOPIC]))
        with pytest.raises(MessageError, match="service event topic"):
            reader.deserialize(raw)
        assert not reader.definition_differs("/points")


def _connection(topic: str, msgtype: str, msgdef: MessageDefinition, digest: str = "") -> Any:
    return Connection(1, topic, msgtype, msgdef, digest, 1, None, None)


def test_unknown_types_and_wrong_hashes_are_unreadable_topics_not_a_failed_bag() -> None:
    none = MessageDefinition(MessageDefinitionFormat.NONE, "")
    radar = MessageDefinition(MessageDefinitionFormat.MSG, "float32 range_m\n")
    store, unreadable = bags.bag_typestore(
        [
            _connection("/odom", bags.ODOMETRY, none),
            _connection("/radar", "acme_msgs/msg/Radar", radar),
            _connection("/echo", "acme_msgs/msg/Echo", radar, digest="RIHS01_" + "0" * 64),
            _connection("/sonar", "acme_msgs/msg/Sonar", none),
        ]
    )
    assert bags.ODOMETRY in store.fielddefs and "acme_msgs/msg/Radar" in store.fielddefs
    assert set(unreadable) == {"/echo", "/sonar"}
    assert "type hash" in unreadable["/echo"]
    assert unreadable["/sonar"].startswith("unknown type acme_msgs/msg/Sonar")
