"""The message types bags carry: the package's typestore, and the one a bag's definitions give."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from rosbags.interfaces import Connection, MessageDefinitionFormat
from rosbags.typesys import (
    Stores,
    get_types_from_idl,
    get_types_from_msg,
    get_typestore,
)
from rosbags.typesys.store import Typestore

from dynshape_perception.errors import DataError
from dynshape_perception.io.bag_storage import READ_ERRORS, first_line
from dynshape_perception.io.objects import OBJECT_TYPES
from dynshape_perception.resources import ament_prefixes

# Message packages whose definitions are read from their installed .msg files.
INSTALLED_MSG_PACKAGES = ("autoware_perception_msgs",)

# vision_msgs 4.x (ROS 2 Humble and later), which cannot be installed here; registered from
# the .msg text so that bags carry the exact definitions and type hashes.
VISION_MSGS: dict[str, str] = {
    "vision_msgs/msg/ObjectHypothesis": "string class_id\nfloat64 score\n",
    "vision_msgs/msg/ObjectHypothesisWithPose": (
        "vision_msgs/ObjectHypothesis hypothesis\ngeometry_msgs/PoseWithCovariance pose\n"
    ),
    "vision_msgs/msg/BoundingBox3D": "geometry_msgs/Pose center\ngeometry_msgs/Vector3 size\n",
    "vision_msgs/msg/Detection3D": (
        "std_msgs/Header header\nvision_msgs/ObjectHypothesisWithPose[] results\n"
        "vision_msgs/BoundingBox3D bbox\nstring id\n"
    ),
    "vision_msgs/msg/Detection3DArray": (
        "std_msgs/Header header\nvision_msgs/Detection3D[] detections\n"
    ),
}
# rosbag2's delimiter of the dependent definitions in a ros2idl schema.
_IDL_SEPARATOR = "=" * 80 + "\n"


def installed_definitions(package: str) -> dict[str, str]:
    """``pkg/msg/Name`` -> .msg text of an installed message package (first prefix that has
    it); empty where none has."""
    for prefix in ament_prefixes():
        folder = prefix / "share" / package / "msg"
        if folder.is_dir():
            return {
                f"{package}/msg/{path.stem}": path.read_text()
                for path in sorted(folder.glob("*.msg"))
            }
    return {}


@lru_cache(maxsize=1)
def typestore() -> Typestore:
    """The ROS 2 Jazzy typestore with the vision_msgs definitions and the installed ones of
    ``INSTALLED_MSG_PACKAGES`` added, so that bags carry their exact definitions and hashes."""
    store = get_typestore(Stores.ROS2_JAZZY)
    types: dict[str, Any] = {}
    texts = dict(VISION_MSGS)
    for package in INSTALLED_MSG_PACKAGES:
        texts.update(installed_definitions(package))
    for name, text in texts.items():
        types.update(get_types_from_msg(text, name))
    store.register(types)
    return store


def has_type(msgtype: str) -> bool:
    return msgtype in typestore().types


def message(msgtype: str, /, **fields: Any) -> Any:
    """A rosbags message of ``msgtype`` (built from its fields)."""
    try:
        cls = typestore().types[msgtype]
    except KeyError as err:
        package = msgtype.split("/")[0]
        raise DataError(
            f"{msgtype} is not known here: install {package} (apt install "
            f"ros-$ROS_DISTRO-{package.replace('_', '-')}) for its message definitions"
        ) from err
    return cls(**fields)


def object_types() -> tuple[str, ...]:
    """The standard object message types this installation can write."""
    return tuple(t for t in OBJECT_TYPES if has_type(t))


def _types_of(conn: Connection) -> dict[str, Any]:
    """The types a connection's recorded definition (ros2msg or ros2idl) declares."""
    text = conn.msgdef.data
    if conn.msgdef.format == MessageDefinitionFormat.MSG:
        return dict(get_types_from_msg(text, conn.msgtype))
    types: dict[str, Any] = {}
    if text.startswith(f"{_IDL_SEPARATOR}IDL: "):
        for section in text.split(_IDL_SEPARATOR)[1:]:
            types.update(get_types_from_idl(section.split("\n", 1)[1]))
    else:
        types.update(get_types_from_idl(text))
    return types


def _undecodable(conn: Connection, why: str) -> str:
    service = "/srv/" in conn.msgtype and conn.msgtype.endswith("_Event")
    return f"{'service event topic: ' if service else ''}{why}"


def bag_typestore(connections: Sequence[Connection]) -> tuple[Typestore, dict[str, str]]:
    """The types the bag's connections decode with, and why the others cannot be decoded.

    Each connection's recorded definition is parsed on its own: one that cannot be (a service
    event's request/response text, an unknown encoding) or whose hash disagrees costs its own
    topic only. A type recorded without a definition takes ROS 2 Jazzy's (or vision_msgs').
    """
    store = get_typestore(Stores.EMPTY)
    unreadable: dict[str, str] = {}
    for conn in connections:
        if conn.msgdef.format == MessageDefinitionFormat.NONE or conn.msgtype in store.fielddefs:
            continue
        try:
            store.register(_types_of(conn))
        except READ_ERRORS as err:
            unreadable[conn.topic] = _undecodable(
                conn,
                f"its recorded definition of {conn.msgtype} cannot be parsed ({first_line(err)})",
            )
    # Types without a recorded definition, and dependencies a definition leaves out (older
    # rosbag2 recorded only the top-level text), take the package's.
    store.register({k: v for k, v in typestore().fielddefs.items() if k not in store.fielddefs})
    for conn in connections:
        if conn.topic in unreadable:
            continue
        if conn.msgtype not in store.fielddefs:
            unreadable[conn.topic] = _undecodable(
                conn, f"unknown type {conn.msgtype}: the bag holds no definition of it"
            )
            continue
        try:
            digest = store.hash_rihs01(conn.msgtype)
        except READ_ERRORS as err:
            unreadable[conn.topic] = _undecodable(
                conn, f"its definition of {conn.msgtype} is incomplete ({first_line(err)})"
            )
            continue
        if conn.msgdef.format != MessageDefinitionFormat.NONE and conn.digest not in ("", digest):
            unreadable[conn.topic] = _undecodable(
                conn, f"its recorded type hash {conn.digest} is not that of its definition"
            )
    return store, unreadable
