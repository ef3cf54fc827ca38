"""TF for the nodes: tf2_ros' buffer and listener under the core's localizer, with odometry."""

from __future__ import annotations

import math

from nav_msgs.msg import Odometry
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile
from rclpy.time import Time
from tf2_msgs.msg import TFMessage
from tf2_ros import Buffer, TransformException

from dynshape_perception import parameters
from dynshape_perception.errors import MessageError, TransformError
from dynshape_perception.io.cdr import OdometryPose
from dynshape_perception.nodes.base import (
    NO_ODOMETRY,
    ODOM_BACKWARDS,
    ODOM_BAD_MESSAGE,
    ODOM_BAD_QUATERNION,
    ODOM_FRAME_CHANGES,
    ODOM_NON_FINITE,
    ODOM_STALE,
    TF_BAD_MESSAGE,
    TF_UNAVAILABLE,
    PerceptionNode,
)
from dynshape_perception.nodes.diagnostics import POSE
from dynshape_perception.nodes.messages import NS_PER_S, deserialized, odometry_of, odometry_pose
from dynshape_perception.perception.localization import (
    ODOMETRY,
    STATIC,
    TF,
    Localizer,
    Located,
)
from dynshape_perception.perception.odometry import PoseBuffer
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.perception.stamps import StampScreen
from dynshape_perception.perception.transforms import (
    DegenerateQuaternion,
    Matrix,
    matrix,
    normalised_quaternion,
)

# rclpy's Time takes nanoseconds from 0 up to this.
MAX_TIME_NS = 2**63
# tf2_ros' TransformListener's subscriptions.
TF_TOPIC, TF_STATIC_TOPIC = "/tf", "/tf_static"
TF_AUTHORITY = "default_authority"


class OdometryInput:
    """Subscribes to ``odom``: the vehicle's (odometry child frame's) pose at a stamp.

    Quaternions are normalised (a degenerate one drops the message, counted); a change of
    the odometry's frame clears the buffer (logged and counted), so that no pose is ever
    interpolated between two frames.
    """

    def __init__(self, node: PerceptionNode) -> None:
        self.node = node
        values = node.values
        self.buffer = PoseBuffer(int(values["odometry.buffer_size"]))
        self.stamps = StampScreen(parameters.stamp_policy(values))
        self.frame_id: str | None = None
        self._stale = False
        node.on_time_jump(self._restart)
        node.counters.setdefault(ODOM_FRAME_CHANGES, 0)
        node.note("odometry", "none received yet")
        # Read from the CDR bytes inside the node's guard: bytes that hold no Odometry are a
        # counted drop, where the executor's own read would raise out of spin.
        name = node.resolve_topic_name("odom")
        node.take_input(
            Odometry, "odom", node.guarded(name, self._on_bytes), node.input_qos, raw=True
        )

    @property
    def active(self) -> bool:
        return self.frame_id is not None

    def _on_bytes(self, data: bytes) -> None:
        try:
            odom = odometry_of(data)
        except MessageError as err:
            self.node.drops.drop(ODOM_BAD_MESSAGE, f"odometry: {err}")
            return
        self._on_odom(odom)

    def _on_odom(self, odom: OdometryPose) -> None:
        try:
            stamp, x, y, yaw = odometry_pose(odom)
        except DegenerateQuaternion as err:
            self.node.drops.drop(ODOM_BAD_QUATERNION, f"odometry: {err}")
            return
        if not all(math.isfinite(v) for v in (stamp, x, y, yaw)):
            self.node.drops.drop(ODOM_NON_FINITE, "odometry holds NaN or Inf")
            return
        if not self.node.screen_stamp(self.stamps, stamp, self.buffer.newest_stamp_s, "odometry"):
            return
        frame_id = odom.frame_id
        if self.frame_id is not None and frame_id != self.frame_id:
            self.node.get_logger().warning(
                f"odometry frame changed from {self.frame_id!r} to {frame_id!r}: its "
                f"{len(self.buffer)} buffered pose(s) cleared"
            )
            self.node.count(ODOM_FRAME_CHANGES)
            self.buffer.clear()
        newest = self.buffer.newest_stamp_s
        if not self.buffer.add(stamp, x, y, yaw):
            self.node.drops.drop(
                ODOM_BACKWARDS, f"odometry stamp {stamp:.6f} s is not after {newest:.6f} s"
            )
            return
        if self.frame_id != frame_id:
            self.frame_id = frame_id
            self.node.get_logger().info(f"odometry received: tracking in frame {frame_id!r}")
            self.node.note("odometry", f"ok (frame {frame_id})")

    def _restart(self) -> None:
        self.buffer.clear()
        self.stamps.clear()

    def note_static(self, frame: str) -> None:
        """Say once that neither TF nor odometry places the vehicle: it stands still."""
        if self.node.drops.once(
            "no_odometry",
            f"no odometry on {self.node.resolve_topic_name('odom')!r} and no TF to the fixed "
            f"frame: static sensor assumed, tracking in the input frame {frame!r}",
        ):
            self.node.note("odometry", NO_ODOMETRY, warn=True)

    def pose_at(self, stamp_s: float, sensor_frame: str) -> tuple[Pose2D, str] | None:
        """The vehicle pose and the fixed frame; without odometry the input frame is fixed.

        None (a counted ``odom_stale`` drop) once odometry was received but none lies within
        ``odometry.max_extrapolation_s`` of the stamp: the end pose would put the frame in
        the wrong place.
        """
        if self.frame_id is None:
            self.note_static(sensor_frame)
            return Pose2D(), sensor_frame
        pose = self.buffer.pose_at(stamp_s)
        gap_s = self.buffer.gap_s(stamp_s)
        limit_s = float(self.node.values["odometry.max_extrapolation_s"])
        if pose is None or gap_s > limit_s:
            newest = self.buffer.newest_stamp_s
            since = "none buffered" if newest is None else f"newest {newest:.6f} s"
            self.node.drops.drop(
                ODOM_STALE,
                f"no odometry within odometry.max_extrapolation_s {limit_s} of the frame "
                f"stamp {stamp_s:.6f} s ({since})",
            )
            self._stale = True
            self.node.note("odometry", f"stale ({since}, frame {self.frame_id})", warn=True)
            return None
        if self._stale:
            self._stale = False
            self.node.note("odometry", f"ok (frame {self.frame_id})")
        return pose, self.frame_id

    def vehicle_at(self, stamp_s: float) -> tuple[Matrix, str] | None:
        """``pose_at`` as a transform (the localizer's odometry source)."""
        located = self.pose_at(stamp_s, "")
        return None if located is None else (located[0].matrix(), located[1])


class StaticTree:
    """The frames that /tf_static alone links, from the transforms given to tf2's buffer.

    A chain of static transforms is the same at every stamp, and stays so until a transform
    of /tf_static is set again or one of its frames takes a /tf transform: ``version``
    counts those changes. Frames are named as tf2 keeps them (one leading '/' stripped);
    transforms tf2 refuses for their names (empty, or a frame to itself) are left out.
    """

    def __init__(self) -> None:
        self.parents: dict[str, str] = {}
        self.dynamic: set[str] = set()
        self.version = 0

    def add(self, parent: str, child: str, static: bool) -> None:
        parent, child = parent.removeprefix("/"), child.removeprefix("/")
        if not parent or not child or parent == child:
            return
        if static:
            self.parents[child] = parent
            self.version += 1
        elif child not in self.dynamic:
            self.dynamic.add(child)
            self.version += 1

    def _up(self, frame: str) -> list[str]:
        """``frame`` and the frames above it through static transforms alone."""
        chain = [frame]
        while frame not in self.dynamic and frame in self.parents:
            frame = self.parents[frame]
            if frame in chain:
                break
            chain.append(frame)
        return chain

    def static_chain(self, target: str, source: str) -> bool:
        """Whether only static transforms link the two frames."""
        above = set(self._up(source))
        return any(frame in above for frame in self._up(target))


class Tf2Lookup:
    """The localizer's transform lookup over a tf2_ros buffer (no waiting: a transform
    that is not there at the stamp now is not there).

    With ``tree`` (what the buffer was given), a lookup along static transforms alone, a
    sensor's mount, is taken from tf2 once and kept until ``tree.version`` moves: tf2_ros
    builds a message for each lookup, 0.1 ms a frame on caches gone cold.
    """

    def __init__(self, buffer: Buffer, tree: StaticTree | None = None) -> None:
        self.buffer = buffer
        self.tree = tree
        self._static: dict[tuple[str, str], tuple[int, Matrix]] = {}

    def lookup(self, target: str, source: str, stamp_s: float) -> Matrix:
        tree = self.tree
        # Only stamps rclpy takes: one it refuses must still fail.
        takes = math.isfinite(stamp_s) and 0 <= round(stamp_s * NS_PER_S) < MAX_TIME_NS
        if tree is None or not takes:
            return self._lookup(target, source, stamp_s)
        version = tree.version
        kept = self._static.get((target, source))
        # Kept only for a static chain, which stays one while the version stands.
        if kept is not None and kept[0] == version:
            return kept[1].copy()
        if not tree.static_chain(target, source):
            return self._lookup(target, source, stamp_s)
        found = self._lookup(target, source, stamp_s)
        self._static[target, source] = (version, found.copy())
        return found

    def _unnamed(self, target: str, source: str) -> tuple[str, str] | None:
        """The first of two frames that no transform named yet, with tf2's name for its
        argument, or None.

        tf2 refuses such a frame too, after building its exception (0.1 ms a frame cold,
        for a cloud whose mount comes from the parameters, 40 µs for a can_transform of a
        fixed frame only odometry gives); one look in its frame table answers first. A
        frame to itself is the identity in tf2, named or not."""
        if target == source:
            return None
        for frame, argument in ((target, "target_frame"), (source, "source_frame")):
            if not self.buffer._frameExists(frame):
                return frame, argument
        return None

    def _lookup(self, target: str, source: str, stamp_s: float) -> Matrix:
        try:
            unnamed = self._unnamed(target, source)
            if unnamed is not None:
                frame, argument = unnamed
                raise TransformError(
                    f"{source!r} -> {target!r}: {frame!r} passed to lookupTransform "
                    f"argument {argument} does not exist"
                )
            found = self.buffer.lookup_transform(
                target, source, Time(nanoseconds=round(stamp_s * NS_PER_S))
            )
        except (TransformException, ValueError) as err:
            # ValueError: a stamp before 1970, which rclpy's Time refuses, or a frame name
            # that tf2 cannot take (a NUL in it).
            raise TransformError(f"{source!r} -> {target!r}: {err}") from err
        t, q = found.transform.translation, found.transform.rotation
        return matrix((t.x, t.y, t.z), (q.x, q.y, q.z, q.w))

    def connected(self, target: str, source: str) -> bool:
        # Asked at every input, mostly of a fixed frame that only odometry gives.
        if self._unnamed(target, source) is not None:
            return False
        # Time() is "the latest": connected now, whatever the stamps.
        return bool(self.buffer.can_transform(target, source, Time()))

    def latest(self, target: str, source: str) -> tuple[Matrix, float]:
        try:
            found = self.buffer.lookup_transform(target, source, Time())
        except TransformException as err:
            raise TransformError(f"{source!r} -> {target!r}: {err}") from err
        t, q = found.transform.translation, found.transform.rotation
        stamp = found.header.stamp
        return matrix((t.x, t.y, t.z), (q.x, q.y, q.z, q.w)), stamp.sec + stamp.nanosec / NS_PER_S


class TfInput:
    """/tf and /tf_static into tf2's buffer, with tf2_ros' TransformListener's QoS, but read
    from their CDR bytes inside the node's guard: bytes that hold no TFMessage, and each
    transform that is not finite or has no rotation, are counted ``tf_bad_message`` drops
    (the other transforms of the message are kept)."""

    def __init__(self, node: PerceptionNode, buffer: Buffer) -> None:
        self.node = node
        self.buffer = buffer
        self.tree = StaticTree()
        for topic, durability, static in (
            (TF_TOPIC, DurabilityPolicy.VOLATILE, False),
            (TF_STATIC_TOPIC, DurabilityPolicy.TRANSIENT_LOCAL, True),
        ):
            qos = QoSProfile(depth=100, durability=durability, history=HistoryPolicy.KEEP_LAST)

            def on_bytes(data: bytes, static: bool = static, topic: str = topic) -> None:
                self.take(data, static, topic)

            node.take_input(TFMessage, topic, node.guarded(topic, on_bytes), qos, raw=True)

    def take(self, data: bytes, static: bool, topic: str) -> None:
        try:
            msg = deserialized(data, TFMessage)
        except MessageError as err:
            self.node.drops.drop(TF_BAD_MESSAGE, f"{topic}: {err}")
            return
        for transform in msg.transforms:
            t, q = transform.transform.translation, transform.transform.rotation
            problem = "" if all(map(math.isfinite, (t.x, t.y, t.z))) else "translation NaN or Inf"
            if not problem:
                try:
                    q.x, q.y, q.z, q.w = normalised_quaternion(q.x, q.y, q.z, q.w)
                except DegenerateQuaternion as err:
                    problem = str(err)
            if problem:
                what = f"{transform.header.frame_id!r} -> {transform.child_frame_id!r}"
                self.node.drops.drop(TF_BAD_MESSAGE, f"{topic}: transform {what}: {problem}")
                continue
            if static:
                self.buffer.set_transform_static(transform, TF_AUTHORITY)
            else:
                self.buffer.set_transform(transform, TF_AUTHORITY)
            self.tree.add(transform.header.frame_id, transform.child_frame_id, static)


class PoseInput:
    """Where a node's inputs lie: mounts from /tf_static, the fixed frame from /tf at each
    stamp, falling back to odometry, then to a standing vehicle (``perception.localization``).
    Adds the pose task to the node's diagnostics."""

    def __init__(self, node: PerceptionNode, odometry: bool = True) -> None:
        self.node = node
        self.buffer = Buffer(node=node)
        self.listener = TfInput(node, self.buffer)
        self.odometry = OdometryInput(node) if odometry else None
        odom = self.odometry
        self.params = parameters.frame_params(node.values)
        self.localizer = Localizer(
            Tf2Lookup(self.buffer, self.listener.tree),
            self.params,
            odom.vehicle_at if odom is not None else None,
            lambda: odom is not None and odom.active,
        )
        self._source = ""
        # Per sensor frame: a fixed-frame lookup of the base frame itself asks for no mount.
        self._mount_sources: dict[str, str] = {}
        node.diagnostics.add_task(POSE, node.report_pose)

    def mount(self, sensor_frame: str, stamp_s: float) -> Matrix:
        """The sensor's mount (sensor frame -> base frame): TF, else the mount parameters."""
        m = self.localizer.mount(sensor_frame, stamp_s)
        self._say_mount(sensor_frame)
        return m

    def _say_mount(self, sensor_frame: str) -> None:
        """Log and note the mount in use when it first comes up or changes."""
        source = self.localizer.mount_source
        base = self.params.base_frame
        if source and sensor_frame != base and source != self._mount_sources.get(sensor_frame):
            self._mount_sources[sensor_frame] = source
            text = (
                f"{sensor_frame!r} -> {base!r} from TF"
                if source == TF
                else f"no TF from {sensor_frame!r} to {base!r}: frames.mount_* parameters"
            )
            self.node.get_logger().info(f"sensor mount: {text}")
            self.node.note("mount", text)

    def locate(self, frame_id: str, stamp_s: float) -> Located | None:
        """The input's place in the fixed frame at its stamp; None is a counted drop."""
        try:
            located = self.localizer.locate(frame_id, stamp_s)
        except TransformError as err:
            self.node.drops.drop(TF_UNAVAILABLE, f"no transform at {stamp_s:.6f} s: {err}")
            self.node.note("pose", f"TF without this stamp ({self.params.fixed_frame})", warn=True)
            self._source = ""
            return None
        self._say_mount(frame_id)
        if located is None:
            return None
        if located.source == STATIC and self.odometry is not None:
            self.odometry.note_static(frame_id)
        if located.source != self._source:
            self._source = located.source
            fixed = located.fixed_frame
            text = {
                TF: f"TF ({fixed} -> {self.params.base_frame})",
                ODOMETRY: f"odometry (frame {fixed})",
                STATIC: f"none: the vehicle stands still in {fixed!r}",
            }[located.source]
            self.node.get_logger().info(f"fixed frame from {text}")
            self.node.note("pose", text)
        return located
