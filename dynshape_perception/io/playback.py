"""The DDS player's timetable without ROS: which messages go out, under which name, and when."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynshape_perception.errors import ConfigError, MessageError
from dynshape_perception.io import bags, msgtypes
from dynshape_perception.io.qos import TopicQos, topic_qos
from dynshape_perception.io.topics import Skipped, absolute_name

CLOCK_TOPIC = "/clock"
HEADER = "std_msgs/msg/Header"
# CDR encapsulation: the second byte is 1 for little-endian payloads, 0 for big-endian.
_ENCAPSULATION = 4
_STAMP = struct.Struct("<iI")
_STAMP_BE = struct.Struct(">iI")


@dataclass(frozen=True)
class Track:
    """One bag topic the player publishes, and the name it goes out under."""

    topic: str
    name: str
    msgtype: str
    count: int
    stamped: bool
    qos: TopicQos = field(default_factory=TopicQos)


@dataclass(frozen=True)
class PlayItem:
    track: Track
    raw: bytes
    bag_ns: int
    due_s: float


def starts_with_header(msgtype: str) -> bool:
    """Whether the type's first field is a std_msgs/Header (its stamp can be patched)."""
    store = msgtypes.typestore()
    if msgtype not in store.fielddefs:
        return False
    _, fields = store.fielddefs[msgtype]
    return bool(fields) and fields[0][1][1] == HEADER


def header_stamp(raw: bytes | memoryview) -> int:
    """The header stamp (ns) of a CDR message that starts with a std_msgs/Header."""
    little = bytes(raw[1:2]) == b"\x01"
    sec, nanosec = (_STAMP if little else _STAMP_BE).unpack_from(raw, _ENCAPSULATION)
    return int(sec) * 1_000_000_000 + int(nanosec)


def shift_stamp(raw: bytes | memoryview, shift_ns: int) -> bytes:
    """The message with its header stamp moved by ``shift_ns`` (loops keep time monotonic)."""
    data = bytearray(raw)
    if shift_ns:
        total = header_stamp(raw) + shift_ns
        sec, nanosec = divmod(total, 1_000_000_000)
        fmt = _STAMP if data[1] == 1 else _STAMP_BE
        fmt.pack_into(data, _ENCAPSULATION, sec, nanosec)
    return bytes(data)


def plan_tracks(
    topics: Sequence[bags.TopicInfo],
    select: Sequence[str] | None,
    remaps: Mapping[str, str],
    publishable: Callable[[str], bool],
    differs: Callable[[str], bool] = lambda _topic: False,
    offers: Callable[[str], Sequence[Any]] = lambda _topic: (),
    qos_overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[list[Track], list[Skipped]]:
    """Every selected topic whose type this ROS installation has; the rest with a reason.

    ``differs(topic)`` tells a recorded definition that does not match the installed type
    (another distro's), whose bytes subscribers could not decode. ``offers(topic)``: the
    recorded QoS offers each track is published with, unless ``qos_overrides`` names it.
    """
    overrides = qos_overrides or {}
    unknown = set(overrides) - {absolute_name(t.name) for t in topics}
    if unknown:
        raise ConfigError(f"QoS overrides name topics the bag does not hold: {sorted(unknown)}")
    chosen = {absolute_name(t) for t in select} if select else None
    tracks: list[Track] = []
    skipped: list[Skipped] = []
    for info in topics:
        topic = absolute_name(info.name)
        name = remaps.get(topic, topic)
        if chosen is not None and topic not in chosen:
            skipped.append(Skipped(info.name, info.msgtype, "not among --topics"))
        elif name == CLOCK_TOPIC:
            skipped.append(Skipped(info.name, info.msgtype, "the player publishes /clock itself"))
        elif info.unreadable:
            skipped.append(Skipped(info.name, info.msgtype, info.unreadable))
        elif not publishable(info.msgtype):
            skipped.append(
                Skipped(info.name, info.msgtype, "message type not installed in this ROS 2")
            )
        elif info.count == 0:
            skipped.append(Skipped(info.name, info.msgtype, "holds no messages"))
        elif differs(info.name):
            skipped.append(
                Skipped(
                    info.name, info.msgtype, "recorded definition differs from the installed one"
                )
            )
        else:
            qos = topic_qos(info.name, offers(info.name), overrides)
            tracks.append(
                Track(
                    info.name,
                    name,
                    info.msgtype,
                    info.count,
                    starts_with_header(info.msgtype),
                    qos,
                )
            )
    return tracks, skipped


def check_play_timing(start_offset_s: float, rate: float) -> None:
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"the replay rate must be a finite number > 0, got {rate!r}")
    if not (math.isfinite(start_offset_s) and start_offset_s >= 0):
        raise ConfigError(
            f"the start offset must be a finite number >= 0 s, got {start_offset_s!r}"
        )


def timetable(
    reader: bags.BagReader,
    tracks: Sequence[Track],
    start_offset_s: float = 0.0,
    rate: float = 1.0,
    loop: bool = False,
    undecodable: dict[str, int] | None = None,
) -> Iterator[PlayItem]:
    """Messages in log-time order with their due time; loops shift time and header stamps.

    Messages that do not decode as their type are left out and counted in ``undecodable``.
    """
    check_play_timing(start_offset_s, rate)
    by_topic = {t.topic: t for t in tracks}
    start_ns = reader.start_at(start_offset_s)
    span_ns = max(reader.end_ns - start_ns, 0) + 1
    passes = 0
    while True:
        shift = passes * span_ns
        sent = 0
        for message in reader.messages(list(by_topic), start_ns=start_ns):
            track = by_topic[message.topic]
            try:
                reader.deserialize(message)
            except MessageError:
                if undecodable is not None:
                    undecodable[track.topic] = undecodable.get(track.topic, 0) + 1
                continue
            raw = shift_stamp(message.raw, shift) if track.stamped else bytes(message.raw)
            bag_ns = message.log_ns + shift
            yield PlayItem(track, raw, bag_ns, (bag_ns - start_ns) * 1e-9 / rate)
            sent += 1
        passes += 1
        if not loop or sent == 0:
            return
