"""rosbag2 bags without ROS: typestore, message <-> NumPy conversion, safe reading and writing."""

from __future__ import annotations

import heapq
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
from rosbags.interfaces import (
    Connection,
    ConnectionExtRosbag2,
    Qos,
    QosDurability,
    QosHistory,
    QosLiveliness,
    QosReliability,
    QosTime,
)
from rosbags.rosbag2 import Reader, StoragePlugin, Writer, WriterError
from rosbags.typesys import (
    Stores,
    get_typestore,
)
from rosbags.typesys.store import Typestore

from dynshape_perception.errors import DataError, DynshapeError, MessageError
from dynshape_perception.fsutil import StagedDir
from dynshape_perception.io.bag_storage import (
    READ_ERRORS,
    BagCheck,
    check_mcap_chunks,
    check_sqlite3,
    reason,
    seal_mcap_chunks,
)
from dynshape_perception.io.classes import name_of
from dynshape_perception.io.msgtypes import bag_typestore, typestore
from dynshape_perception.io.objects import yaw_of_quaternion
from dynshape_perception.io.pointcloud2 import CloudData, encode_cloud, points_to_cloud
from dynshape_perception.perception.transforms import Matrix, matrix, quaternion_of

if sys.version_info >= (3, 14):
    pass
else:
    pass

POINTCLOUD2 = "sensor_msgs/msg/PointCloud2"
ODOMETRY = "nav_msgs/msg/Odometry"
CLOCK = "rosgraph_msgs/msg/Clock"
DETECTION3D_ARRAY = "vision_msgs/msg/Detection3DArray"
TF_MESSAGE = "tf2_msgs/msg/TFMessage"
TF_TOPIC = "/tf"
TF_STATIC_TOPIC = "/tf_static"
STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
BAG_VERSION: Literal[9] = 9

_NS = 1_000_000_000
log = logging.getLogger(__name__)
# What the publishers of a written bag offered, as `ros2 bag record` keeps it: tf2's static
# broadcaster latches (transient local, keep last 1); the rest, reliable and volatile.
_ZERO = QosTime(0, 0)
OFFERED_DEPTH = 10


def offered_qos(topic: str) -> Qos:
    static = topic.rstrip("/").endswith(TF_STATIC_TOPIC)
    return Qos(
        history=QosHistory.KEEP_LAST,
        depth=1 if static else OFFERED_DEPTH,
        reliability=QosReliability.RELIABLE,
        durability=QosDurability.TRANSIENT_LOCAL if static else QosDurability.VOLATILE,
        deadline=_ZERO,
        lifespan=_ZERO,
        liveliness=QosLiveliness.AUTOMATIC,
        liveliness_lease_duration=_ZERO,
        avoid_ros_namespace_conventions=False,
    )


def stamp_ns(stamp: Any) -> int:
    """A builtin_interfaces/Time as integer nanoseconds."""
    return int(stamp.sec) * _NS + int(stamp.nanosec)


def time_msg(ns: int) -> Any:
    sec, nanosec = divmod(int(ns), _NS)
    return typestore().types["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec)


def header(ns: int, frame_id: str) -> Any:
    return typestore().types["std_msgs/msg/Header"](stamp=time_msg(ns), frame_id=frame_id)


def cloud_message(cloud: CloudData, ns: int, frame_id: str) -> Any:
    """A rosbags PointCloud2 from a cloud body of ``io.pointcloud2``."""
    types = typestore().types
    fields = [
        types["sensor_msgs/msg/PointField"](
            name=f.name, offset=f.offset, datatype=f.datatype, count=f.count
        )
        for f in cloud.fields
    ]
    return types[POINTCLOUD2](
        header=header(ns, frame_id),
        height=cloud.height,
        width=cloud.width,
        fields=fields,
        is_bigendian=cloud.is_bigendian,
        point_step=cloud.point_step,
        row_step=cloud.row_step,
        data=np.frombuffer(cloud.data, dtype=np.uint8),
        is_dense=cloud.is_dense,
    )


def table_message(table: np.ndarray, ns: int, frame_id: str) -> Any:
    """A structured array as a one-row-per-record PointCloud2 (the package's wire tables)."""
    return cloud_message(encode_cloud(table), ns, frame_id)


def points_message(points: np.ndarray, ns: int, frame_id: str) -> Any:
    """Lidar points float32 ``[P, 4]`` (x, y, z, intensity) as a PointCloud2."""
    return cloud_message(points_to_cloud(points), ns, frame_id)


def quaternion_yaw(q: Any) -> float:
    """The heading of a message quaternion (normalised; MessageError if degenerate)."""
    return yaw_of_quaternion(q)


def transform_message(parent: str, child: str, ns: int, m: Matrix) -> Any:
    """A geometry_msgs/TransformStamped of ``child`` in ``parent``."""
    types = typestore().types
    x, y, z = (float(v) for v in m[:3, 3])
    qx, qy, qz, qw = quaternion_of(m)
    return types["geometry_msgs/msg/TransformStamped"](
        header=header(ns, parent),
        child_frame_id=child,
        transform=types["geometry_msgs/msg/Transform"](
            translation=types["geometry_msgs/msg/Vector3"](x=x, y=y, z=z),
            rotation=types["geometry_msgs/msg/Quaternion"](x=qx, y=qy, z=qz, w=qw),
        ),
    )


def tf_message(transforms: Sequence[Any]) -> Any:
    return typestore().types[TF_MESSAGE](transforms=list(transforms))


def transforms_of(msg: Any) -> list[tuple[str, str, int, Matrix]]:
    """(parent, child, stamp ns, matrix) of each transform of a TFMessage."""
    out = []
    for t in msg.transforms:
        tr, rot = t.transform.translation, t.transform.rotation
        try:
            m = matrix((tr.x, tr.y, tr.z), (rot.x, rot.y, rot.z, rot.w))
        except DynshapeError as err:
            raise MessageError(f"transform {t.child_frame_id!r}: {err}") from err
        out.append((str(t.header.frame_id), str(t.child_frame_id), stamp_ns(t.header.stamp), m))
    return out


def odometry_message(
    ns: int,
    x: float,
    y: float,
    yaw: float,
    speed_mps: float,
    yaw_rate: float,
    frame_id: str = "odom",
    child_frame_id: str = "base_link",
) -> Any:
    types = typestore().types
    pose = types["geometry_msgs/msg/Pose"](
        position=types["geometry_msgs/msg/Point"](x=float(x), y=float(y), z=0.0),
        orientation=types["geometry_msgs/msg/Quaternion"](
            x=0.0, y=0.0, z=math.sin(yaw / 2.0), w=math.cos(yaw / 2.0)
        ),
    )
    twist = types["geometry_msgs/msg/Twist"](
        linear=types["geometry_msgs/msg/Vector3"](x=float(speed_mps), y=0.0, z=0.0),
        angular=types["geometry_msgs/msg/Vector3"](x=0.0, y=0.0, z=float(yaw_rate)),
    )
    covariance = np.zeros(36, dtype=np.float64)
    return types[ODOMETRY](
        header=header(ns, frame_id),
        child_frame_id=child_frame_id,
        pose=types["geometry_msgs/msg/PoseWithCovariance"](pose=pose, covariance=covariance),
        twist=types["geometry_msgs/msg/TwistWithCovariance"](
            twist=twist, covariance=covariance.copy()
        ),
    )


def odometry_pose(msg: Any) -> tuple[int, float, float, float]:
    """(stamp ns, x, y, yaw) of a nav_msgs/Odometry."""
    pose = msg.pose.pose
    return (
        stamp_ns(msg.header.stamp),
        pose.position.x,
        pose.position.y,
        quaternion_yaw(pose.orientation),
    )


def clock_message(ns: int) -> Any:
    return typestore().types[CLOCK](clock=time_msg(ns))


def detections_message(obstacles: np.ndarray, ns: int, frame_id: str) -> Any:
    """Obstacle rows as a vision_msgs/Detection3DArray (class ids: the class names)."""
    types = typestore().types
    detections = []
    for row in obstacles:
        yaw = float(row["yaw"])
        pose = types["geometry_msgs/msg/Pose"](
            position=types["geometry_msgs/msg/Point"](
                x=float(row["x"]), y=float(row["y"]), z=float(row["z"])
            ),
            orientation=types["geometry_msgs/msg/Quaternion"](
                x=0.0, y=0.0, z=math.sin(yaw / 2.0), w=math.cos(yaw / 2.0)
            ),
        )
        hypothesis = types["vision_msgs/msg/ObjectHypothesisWithPose"](
            hypothesis=types["vision_msgs/msg/ObjectHypothesis"](
                class_id=name_of(int(row["label"])), score=float(row["score"])
            ),
            pose=types["geometry_msgs/msg/PoseWithCovariance"](
                pose=pose, covariance=np.zeros(36, dtype=np.float64)
            ),
        )
        bbox = types["vision_msgs/msg/BoundingBox3D"](
            center=pose,
            size=types["geometry_msgs/msg/Vector3"](
                x=float(row["length"]), y=float(row["width"]), z=float(row["height"])
            ),
        )
        detections.append(
            types["vision_msgs/msg/Detection3D"](
                header=header(ns, frame_id), results=[hypothesis], bbox=bbox, id=""
            )
        )
    return types[DETECTION3D_ARRAY](header=header(ns, frame_id), detections=detections)


class BagWriter:
    """Writes a rosbag2 bag atomically: into a hidden folder beside it, renamed when complete.

    The bag is written with the final folder name, so its metadata does not depend on the
    temporary location, and nothing is left behind when writing fails.
    """

    def __init__(self, path: Path, storage: str = "mcap") -> None:
        if storage not in STORAGES:
            raise DataError(f"storage must be one of {sorted(STORAGES)}, got {storage!r}")
        self.path = Path(path)
        self.storage = storage
        self._staged = StagedDir(self.path, create=False)
        self._writer: Writer | None = None
        self._connections: dict[str, Connection] = {}
        self.counts: dict[str, int] = {}

    def __enter__(self) -> BagWriter:
        if self.path.exists():
            raise DataError(f"{self.path} exists already; remove it or choose another path")
        try:
            self._staged.open()
        except OSError as err:
            raise DataError(f"cannot create bag {self.path}: {err}") from err
        self._writer = Writer(
            self._staged.path, version=BAG_VERSION, storage_plugin=STORAGES[self.storage]
        )
        try:
            self._writer.open()
        except (WriterError, OSError) as err:
            self._staged.discard()
            raise DataError(f"cannot create bag {self.path}: {err}") from err
        return self

    def add_topic(self, topic: str, msgtype: str) -> None:
        if topic in self._connections:
            return
        assert self._writer is not None
        self._connections[topic] = self._writer.add_connection(
            topic, msgtype, typestore=typestore(), offered_qos_profiles=[offered_qos(topic)]
        )
        self.counts[topic] = 0

    def write(self, topic: str, ns: int, msg: Any) -> None:
        self.add_topic(topic, msg.__msgtype__)
        self.write_raw(topic, ns, typestore().serialize_cdr(msg, msg.__msgtype__))

    def write_raw(self, topic: str, ns: int, data: bytes | memoryview | np.ndarray) -> None:
        assert self._writer is not None
        payload = data.tobytes() if isinstance(data, np.ndarray) else data
        self._writer.write(self._connections[topic], int(ns), payload)
        self.counts[topic] += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._writer is not None
        try:
            if exc_type is None:
                self._writer.close()
                for storage in sorted(self._staged.path.glob("*.mcap")):
                    seal_mcap_chunks(storage)
                self._staged.publish()
            else:
                self._writer.abort()
        finally:
            self._staged.discard()


@dataclass(frozen=True)
class TopicInfo:
    """``unreadable``: why its messages cannot be decoded here (empty when they can)."""

    name: str
    msgtype: str
    count: int
    unreadable: str = ""


@dataclass(frozen=True)
class BagMessage:
    topic: str
    msgtype: str
    log_ns: int
    raw: bytes | memoryview


class BagReader:
    """Opens a rosbag2 bag (mcap or sqlite3); every read failure becomes a DataError naming it.

    Topics whose types cannot be decoded are listed with the reason (``TopicInfo.unreadable``)
    and the rest reads; only a file that cannot be read at all fails to open.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._reader: Reader | None = None
        self._typestore: Typestore = get_typestore(Stores.EMPTY)
        self._unreadable: dict[str, str] = {}
        self._storages: list[Any] = []
        self._counts: dict[str, int] = {}
        self._span: tuple[int, int] | None = None

    def __enter__(self) -> BagReader:
        if not self.path.exists():
            raise DataError(f"bag {self.path} does not exist")
        reader: Reader | None = None
        try:
            reader = Reader(self.path)
            reader.open()
        except FileNotFoundError as err:
            raise DataError(f"{self.path} is not a rosbag2 bag: {err}") from err
        except READ_ERRORS as err:
            raise DataError(
                f"cannot open bag {self.path}: it is corrupt or truncated ({reason(err)})"
            ) from err
        self._reader = reader
        try:
            self._typestore, self._unreadable = bag_typestore(reader.connections)
            self._counts, self._span = self._stored_counts()
            self._storages = self._mismatched_storages()
        except READ_ERRORS as err:
            self.__exit__()
            raise DataError(
                f"cannot open bag {self.path}: it is corrupt or truncated ({reason(err)})"
            ) from err
        for topic, why in sorted(self._unreadable.items()):
            log.info("%s: %s cannot be decoded: %s", self.path, topic, why)
        return self

    def _stored_counts(self) -> tuple[dict[str, int], tuple[int, int] | None]:
        """Message counts per topic and the (start, end) log times the storage files hold.

        metadata.yaml's counts are only a summary (some writers leave them 0); the storage
        files count their messages themselves (mcap statistics, an sqlite3 count query).
        Without storage information (not a rosbag2 bag) the metadata's counts stand.
        """
        counts: dict[str, int] = {}
        starts: list[int] = []
        ends: list[int] = []
        owners = {id(c.owner): c.owner for c in self.reader.connections}.values()
        for owner in owners:
            storages = getattr(owner, "storages", None)
            if not storages:
                return {}, None
            wanted = {(c.topic, c.msgtype) for c in self.reader.connections if c.owner is owner}
            for st in storages:
                for c in st.connections:
                    if (c.topic, c.msgtype) in wanted:
                        counts[c.topic] = counts.get(c.topic, 0) + int(c.msgcount)
                meta = getattr(st, "metadata", None)
                if meta is not None and meta.message_count:
                    starts.append(int(meta.start_time))
                    ends.append(int(meta.end_time))
        listed = self._listed_counts()
        if any(listed[t] != counts.get(t, 0) for t in listed):
            log.info(
                "%s: metadata.yaml message counts disagree with its storage; using the storage's",
                self.path,
            )
        return counts, ((min(starts), max(ends)) if starts else (0, 0))

    def _mismatched_storages(self) -> list[Any]:
        """Storages to read directly when metadata.yaml disagrees with them.

        rosbags matches the connections of metadata.yaml to those of the storage file by
        topic, type and QoS, and reads nothing where the QoS differ: some real recordings
        (ros2/rosbag2's own talker bags) hold such metadata. Their storage files are fine,
        so they are read directly.
        """
        owners = {id(c.owner): c.owner for c in self.reader.connections}.values()
        mismatched: list[Any] = []
        for owner in owners:
            storages = getattr(owner, "storages", None)
            if not storages:
                continue
            stored = [(c.topic, c.msgtype, c.ext) for st in storages for c in st.connections]
            if any(
                self._count(c.topic, c.msgcount) and (c.topic, c.msgtype, c.ext) not in stored
                for c in self.reader.connections
                if c.owner is owner
            ):
                log.info(
                    "%s: metadata.yaml disagrees with its storage; reading it directly", self.path
                )
                mismatched += storages
        return mismatched

    def __exit__(self, *exc: object) -> None:
        if self._reader is not None:
            try:
                self._reader.close()
            except READ_ERRORS:
                pass
            self._reader = None

    @property
    def reader(self) -> Reader:
        assert self._reader is not None, "BagReader is not open"
        return self._reader

    @property
    def unreadable(self) -> dict[str, str]:
        """Per topic, why its messages cannot be decoded."""
        return dict(self._unreadable)

    def _count(self, topic: str, listed: int) -> int:
        return self._counts.get(topic, 0) if self._span is not None else listed

    def _listed_counts(self) -> dict[str, int]:
        """metadata.yaml's message count per topic, summed over its connections."""
        listed: dict[str, int] = {}
        for conn in self.reader.connections:
            listed[conn.topic] = listed.get(conn.topic, 0) + conn.msgcount
        return listed

    def offered_qos(self, topic: str) -> list[Qos]:
        """The QoS profiles the recorded publishers of ``topic`` offered (metadata.yaml's
        ``offered_qos_profiles``); empty where the bag does not say."""
        offers: list[Qos] = []
        for conn in self.reader.connections:
            if conn.topic == topic and isinstance(conn.ext, ConnectionExtRosbag2):
                offers += conn.ext.offered_qos_profiles
        return offers

    def topics(self) -> list[TopicInfo]:
        types = {conn.topic: conn.msgtype for conn in self.reader.connections}
        return sorted(
            (
                TopicInfo(t, types[t], self._count(t, n), self._unreadable.get(t, ""))
                for t, n in self._listed_counts().items()
            ),
            key=lambda t: t.name,
        )

    @property
    def start_ns(self) -> int:
        if self._span is not None:
            return self._span[0]
        return int(self.reader.start_time) if self.reader.message_count else 0

    @property
    def end_ns(self) -> int:
        """One past the last log time (0 for an empty bag)."""
        if self._span is not None:
            return self._span[1]
        return int(self.reader.end_time) if self.reader.message_count else 0

    def start_at(self, offset_s: float) -> int:
        """The log time ``offset_s`` seconds into the bag, at most its end: nothing lies past
        it. Capped before converting, since 1e300 s in nanoseconds is no integer."""
        span_s = (self.end_ns - self.start_ns) / _NS
        return min(self.start_ns + round(min(offset_s, span_s) * _NS), self.end_ns)

    def messages(
        self, topics: Sequence[str] | None = None, start_ns: int | None = None
    ) -> Iterator[BagMessage]:
        """Raw messages in log-time order; a corrupt record raises DataError mid-iteration."""
        conns = [c for c in self.reader.connections if topics is None or c.topic in topics]
        if not conns:
            return
        if start_ns is not None and start_ns >= self.end_ns:
            # Nothing lies past the end; sqlite3 also cannot bind a start beyond int64.
            return
        try:
            if self._storages:
                wanted = {c.topic for c in conns}
                picks = [
                    (st, [c for c in st.connections if c.topic in wanted]) for st in self._storages
                ]
                streams = [st.messages(cs, start_ns) for st, cs in picks if cs]
                records = heapq.merge(*streams, key=lambda item: item[1])
            else:
                records = self.reader.messages(conns, start_ns)
            for conn, log_ns, raw in records:
                yield BagMessage(conn.topic, conn.msgtype, int(log_ns), raw)
        except READ_ERRORS as err:
            # A damaged chunk is named with its offset, as ``verify`` names it.
            self.verify()
            raise DataError(
                f"bag {self.path} is corrupt or truncated: reading failed ({reason(err)})"
            ) from err

    def verify(self) -> BagCheck:
        """Check what the storage files let be checked; a DataError names a damaged part.

        mcap: every chunk whose CRC is set (this package's writer sets them all) against
        its uncompressed bytes, and the record structure around it. sqlite3 keeps no
        checksums of its messages: its structure is checked (``PRAGMA quick_check``).
        """
        files = sorted(self.path.glob("*")) if self.path.is_dir() else [self.path]
        check = BagCheck()
        try:
            for file in files:
                if file.suffix == ".mcap":
                    checked, unchecked = check_mcap_chunks(file)
                    check.chunks_checked += checked
                    check.chunks_unchecked += unchecked
                elif file.suffix == ".db3":
                    check_sqlite3(file)
                    check.sqlite3_files += 1
                elif file.name != "metadata.yaml":
                    check.unchecked_files.append(file.name)
        except DataError as err:
            raise DataError(f"bag {self.path} is corrupt or truncated: {err}") from err
        return check

    def definition_differs(self, topic: str) -> bool:
        """Whether the bag's recorded definition of the topic's type differs from this
        package's (ROS 2 Jazzy) one, so that its bytes would not decode as the installed type."""
        for conn in self.reader.connections:
            if conn.topic != topic or conn.msgtype not in typestore().fielddefs:
                continue
            try:
                recorded = self._typestore.hash_rihs01(conn.msgtype)
                ours = typestore().hash_rihs01(conn.msgtype)
            except READ_ERRORS:
                return True
            if recorded != ours:
                return True
        return False

    def deserialize(self, message: BagMessage) -> Any:
        why = self._unreadable.get(message.topic)
        if why is not None:
            raise MessageError(f"{message.topic} message at {message.log_ns} ns: {why}")
        try:
            return self._typestore.deserialize_cdr(bytes(message.raw), message.msgtype)
        except READ_ERRORS as err:
            raise MessageError(
                f"{message.topic} message at {message.log_ns} ns cannot be decoded: {reason(err)}"
            ) from err
