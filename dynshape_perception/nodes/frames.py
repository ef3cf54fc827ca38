"""TF for the nodes: tf2_ros' buffer and listener under the core's localizer, with odometry."""

from __future__ import annotations

from rclpy.time import Time
from tf2_ros import Buffer, TransformException, TransformListener

from dynshape_perception import parameters
from dynshape_perception.errors import TransformError
from dynshape_perception.nodes.base import (
    TF_UNAVAILABLE,
    OdometryInput,
    PerceptionNode,
)
from dynshape_perception.nodes.diagnostics import POSE
from dynshape_perception.nodes.messages import NS_PER_S
from dynshape_perception.perception.localization import (
    ODOMETRY,
    STATIC,
    TF,
    Localizer,
    Located,
)
from dynshape_perception.perception.transforms import Matrix, matrix


class Tf2Lookup:
    """The localizer's transform lookup over a tf2_ros buffer (no waiting: a transform
    that is not there at the stamp now is not there)."""

    def __init__(self, buffer: Buffer) -> None:
        self.buffer = buffer

    def lookup(self, target: str, source: str, stamp_s: float) -> Matrix:
        try:
            found = self.buffer.lookup_transform(
                target, source, Time(nanoseconds=round(stamp_s * NS_PER_S))
            )
        except TransformException as err:
            raise TransformError(f"{source!r} -> {target!r}: {err}") from err
        t, q = found.transform.translation, found.transform.rotation
        return matrix((t.x, t.y, t.z), (q.x, q.y, q.z, q.w))

    def connected(self, target: str, source: str) -> bool:
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


class PoseInput:
    """Where a node's inputs lie: mounts from /tf_static, the fixed frame from /tf at each
    stamp, falling back to odometry, then to a standing vehicle (``perception.localization``).
    Adds the pose task to the node's diagnostics."""

    def __init__(self, node: PerceptionNode, odometry: bool = True) -> None:
        self.node = node
        self.buffer = Buffer(node=node)
        self.listener = TransformListener(self.buffer, node)
        self.odometry = OdometryInput(node) if odometry else None
        odom = self.odometry
        self.params = parameters.frame_params(node.values)
        self.localizer = Localizer(
            Tf2Lookup(self.buffer),
            self.params,
            odom.vehicle_at if odom is not None else None,
            lambda: odom is not None and odom.active,
        )
        self._source = ""
        self._mount_source = ""
        node.diagnostics.add_task(POSE, node.report_pose)

    def mount(self, sensor_frame: str, stamp_s: float) -> Matrix:
        """The sensor's mount (sensor frame -> base frame): TF, else the mount parameters."""
        m = self.localizer.mount(sensor_frame, stamp_s)
        source = self.localizer.mount_source
        if source != self._mount_source:
            self._mount_source = source
            base = self.params.base_frame
            text = (
                f"{sensor_frame!r} -> {base!r} from TF"
                if source == TF
                else f"no TF from {sensor_frame!r} to {base!r}: frames.mount_* parameters"
            )
            self.node.get_logger().info(f"sensor mount: {text}")
            self.node.note("mount", text)
        return m

    def locate(self, frame_id: str, stamp_s: float) -> Located | None:
        """The input's place in the fixed frame at its stamp; None is a counted drop."""
        try:
            located = self.localizer.locate(frame_id, stamp_s)
        except TransformError as err:
            self.node.drops.drop(TF_UNAVAILABLE, f"no transform at {stamp_s:.6f} s: {err}")
            self.node.note("pose", f"TF without this stamp ({self.params.fixed_frame})", warn=True)
            self._source = ""
            return None
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
