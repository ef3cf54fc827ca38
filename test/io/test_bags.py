"""BagReader and BagWriter on compressed, mis-described and unwritable bags."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from rosbags.interfaces import (
    Connection,
    ConnectionExtRosbag2,
    MessageDefinition,
    MessageDefinitionFormat,
)
from rosbags.rosbag2 import CompressionFormat, CompressionMode, Writer

from dynshape_perception.errors import DataError, MessageError
from dynshape_perception.io import bag_storage, bags, msgtypes
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
    conn = writer.add_connection("/odom", bags.ODOMETRY, typestore=msgtypes.typestore())
    for k in range(MESSAGES):
        ns = T0 + k * 50_000_000
        msg = bags.odometry_message(ns, float(k), 0.0, 0.0, 1.0, 0.0)
        writer.write(conn, ns, msgtypes.typestore().serialize_cdr(msg, bags.ODOMETRY))
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
    return Connection(1, topic, msgtype, msgdef, digest, 1, ConnectionExtRosbag2("cdr", []), None)


def test_unknown_types_and_wrong_hashes_are_unreadable_topics_not_a_failed_bag() -> None:
    none = MessageDefinition(MessageDefinitionFormat.NONE, "")
    radar = MessageDefinition(MessageDefinitionFormat.MSG, "float32 range_m\n")
    store, unreadable = msgtypes.bag_typestore(
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


def _chunks(data: Path) -> list[tuple[int, int]]:
    """(record offset, CRC) of every chunk of an mcap file."""
    with data.open("rb") as handle:
        return [(c.offset, c.crc) for c in bag_storage.mcap_chunks(data, handle)]


def _flip(data: Path, at: int, count: int = 64) -> None:
    raw = bytearray(data.read_bytes())
    raw[at : at + count] = bytes(b ^ 0xFF for b in raw[at : at + count])
    data.write_bytes(bytes(raw))


def test_the_writer_seals_every_mcap_chunk_with_its_crc(tmp_path: Path) -> None:
    bag = tmp_path / "bag"
    sources.write_crowd(bag, "mcap", seed=1, frames=5, agents=2)
    chunks = _chunks(bag / "bag.mcap")
    assert chunks and all(crc != 0 for _, crc in chunks)
    with bags.BagReader(bag) as reader:
        check = reader.verify()
        assert sum(1 for _ in reader.messages()) == 10
    assert (check.chunks_checked, check.chunks_unchecked) == (len(chunks), 0)
    assert f"{len(chunks)} mcap chunk(s) matched their CRC" in check.summary()


def test_a_chunk_without_a_crc_is_reported_unchecked(tmp_path: Path) -> None:
    bag = _compressed(tmp_path / "bag", "mcap", CompressionMode.STORAGE)
    with bags.BagReader(bag) as reader:
        check = reader.verify()
    assert check.chunks_checked == 0 and check.chunks_unchecked > 0
    assert "carry no CRC to check" in check.summary()


@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
def test_flipped_bytes_inside_a_chunk_are_named_with_the_chunk_offset(
    tmp_path: Path, where: float
) -> None:
    bag = tmp_path / "bag"
    sources.write_crowd(bag, "mcap", seed=1, frames=40, agents=8)
    data = bag / "bag.mcap"
    offset = _chunks(data)[0][0]
    body = offset + 9 + 8 * 3 + 4 + 4 + 8
    size = int.from_bytes(data.read_bytes()[body - 8 : body], "little")
    _flip(data, body + int(where * (size - 64)))
    message = f"bag {bag} is corrupt or truncated: {data} is damaged: the chunk at byte offset "
    message += f"{offset} does not match its CRC"
    with bags.BagReader(bag) as reader:
        with pytest.raises(DataError, match=re.escape(message)):
            reader.verify()
        # Read without the check first, the damage is named all the same.
        with pytest.raises(DataError, match=re.escape(message)):
            sum(1 for _ in reader.messages())


def test_sqlite3_bags_get_the_check_sqlite3_has(tmp_path: Path) -> None:
    bag = tmp_path / "bag"
    sources.write_crowd(bag, "sqlite3", seed=1, frames=5, agents=2)
    with bags.BagReader(bag) as reader:
        check = reader.verify()
    assert check.sqlite3_files == 1 and "sqlite3 keeps no checksums" in check.summary()
    db = bag / "bag.db3"
    raw = db.read_bytes()
    page = 4096
    checked = 0
    # Every scrambled page the bag still opens with is caught by the check.
    for start in range(0, len(raw), page):
        damaged = bytearray(raw)
        damaged[start : start + page] = bytes((i * 7 + 13) % 256 for i in range(page))
        db.write_bytes(bytes(damaged))
        try:
            reader = bags.BagReader(bag).__enter__()
        except DataError:
            continue
        with reader, pytest.raises(DataError, match=re.escape(f"corrupt or truncated: {db}")):
            reader.verify()
        checked += 1
    assert checked, "every damaged page already failed at opening"
