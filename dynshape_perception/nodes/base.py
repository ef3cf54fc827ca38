"""What every perception node shares: parameters, engine, drops, odometry, diagnostics, main."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from nav_msgs.msg import Odometry
from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header

from dynshape_perception.core.io.pointcloud2 import REASONS, CloudError, cloud_to_points
from dynshape_perception.core.perception.pipeline import ModelFn, Pipeline, Pose2D
from dynshape_perception.core.runtime.engine import Engine
from dynshape_perception.core.runtime.metrics import LatencyStats
from dynshape_perception.errors import BoundError, ConfigError, DynshapeError
from dynshape_perception.nodes import params as P
from dynshape_perception.nodes.drops import DropCounter
from dynshape_perception.nodes.messages import MarkerStyle, diagnostic_array, odometry_pose
from dynshape_perception.nodes.odometry import PoseBuffer

OVER_BOUND = "over_bound"
STALE_STAMP = "stale_stamp"
PROCESSING_ERROR = "processing_error"
INTERNAL_ERROR = "internal_error"
ODOM_BACKWARDS = "odom_time_backwards"
ODOM_NON_FINITE = "odom_non_finite"
POINT_REASONS = (*REASONS, OVER_BOUND, PROCESSING_ERROR, INTERNAL_ERROR)
ODOM_REASONS = (ODOM_BACKWARDS, ODOM_NON_FINITE)
POINT_COUNTERS = {"points_non_finite_removed": 0, "frames_subsampled": 0}
NO_ODOMETRY = "absent: static sensor assumed"


def descriptor(spec: P.ParamSpec) -> ParameterDescriptor:
    desc = ParameterDescriptor(description=spec.description, read_only=spec.read_only)
    if spec.choices:
        desc.additional_constraints = f"one of: {', '.join(spec.choices)}"
    if spec.low is not None and spec.high is not None and not isinstance(spec.default, bool):
        if isinstance(spec.default, float):
            desc.floating_point_range = [
                FloatingPointRange(from_value=float(spec.low), to_value=float(spec.high), step=0.0)
            ]
        elif isinstance(spec.default, int):
            desc.integer_range = [
                IntegerRange(from_value=int(spec.low), to_value=int(spec.high), step=1)
            ]
    return desc


def model_not_loaded(name: str) -> ModelFn:
    """The model slot of a stage that runs in another node."""

    def call(*_: object) -> list[np.ndarray]:
        raise ConfigError(f"model {name!r} is not loaded in this node")

    return call


class PerceptionNode(Node):
    """A thin node over the core; subclasses wire topics and call the pipeline."""

    def __init__(self, kind: str, models: Sequence[str], reasons: Sequence[str]) -> None:
        super().__init__(kind)
        self.kind = kind
        self.specs = P.node_specs(kind)
        self.values = self._declare()
        self.drops = DropCounter(
            reasons, self.get_logger().warning, float(self.values["warn_throttle_s"])
        )
        self.latency: dict[str, LatencyStats] = {}
        self.last_latency_ms: dict[str, float] = {}
        self.counters: dict[str, int] = {"frames_in": 0, "frames_out": 0}
        self.notes: dict[str, str] = {}
        self._warn_notes: set[str] = set()
        self._drops_seen = 0
        self.input_qos = QoSProfile(
            history=HistoryPolicy.KEEP_LAST,
            depth=int(self.values["qos.input_depth"]),
            reliability=ReliabilityPolicy.BEST_EFFORT,
            durability=DurabilityPolicy.VOLATILE,
        )
        self.output_qos = QoSProfile(
            history=HistoryPolicy.KEEP_LAST,
            depth=int(self.values["qos.output_depth"]),
            reliability=ReliabilityPolicy.RELIABLE,
        )
        self.engine = self._build_engine(models)
        try:
            self.bounds = P.bounds_from(self.values)
            self.add_on_set_parameters_callback(self._on_set)
            self.add_post_set_parameters_callback(self._after_set)
            self._diagnostics = self.create_publisher(
                DiagnosticArray, "/diagnostics", self.output_qos
            )
            self.create_timer(float(self.values["diagnostics_period_s"]), self.publish_diagnostics)
        except BaseException:
            self.engine.close()
            raise

    # -- parameters ---------------------------------------------------------------------
    def _declare(self) -> dict[str, P.Value]:
        values: dict[str, P.Value] = {}
        for name, spec in self.specs.items():
            try:
                self.declare_parameter(name, spec.default, descriptor(spec))
            except Exception as err:
                raise ConfigError(f"parameter {name}: {err}") from err
            values[name] = self.get_parameter(name).value
        P.validate(values, self.specs)
        return values

    def _on_set(self, parameters: list[Parameter]) -> SetParametersResult:
        candidate = dict(self.values)
        for param in parameters:
            if param.name in self.specs:
                candidate[param.name] = param.value
        try:
            P.validate(candidate, self.specs)
        except ConfigError as err:
            return SetParametersResult(successful=False, reason=str(err))
        return SetParametersResult(successful=True)

    def _after_set(self, parameters: list[Parameter]) -> None:
        changed = {p.name for p in parameters if p.name in self.specs}
        for name in changed:
            self.values[name] = self.get_parameter(name).value
        if changed:
            self.drops.throttle_s = float(self.values["warn_throttle_s"])
            self._apply_jit()
            self.apply_parameters(changed)
            self.get_logger().info(f"parameters changed: {sorted(changed)}")

    def apply_parameters(self, changed: set[str]) -> None:
        """Hook: push accepted tunable values into the core objects."""

    def _apply_jit(self) -> None:
        config = P.jit_config(self.values)
        self.engine.jit = config
        for dispatcher in self.engine.dispatchers.values():
            dispatcher.config = config
            dispatcher.cache.max_entries = config.max_entries
            dispatcher.cache.max_bytes = config.max_bytes

    def marker_style(self) -> MarkerStyle:
        return MarkerStyle(
            box_alpha=float(self.values["markers.box_alpha"]),
            text_size_m=float(self.values["markers.text_size_m"]),
            path_width_m=float(self.values["markers.path_width_m"]),
        )

    # -- engine -------------------------------------------------------------------------
    def _build_engine(self, models: Sequence[str]) -> Engine:
        values = self.values
        engine = Engine(
            profile=str(values["target_profile"]),
            jit=P.jit_config(values),
            cache_dir=P.optional_path(values["model_cache_dir"]),
            models=tuple(models),
            weights_dir=P.optional_path(values["weights_dir"]),
        )
        try:
            profile = P.optional_path(values["jit.warm_up_profile"])
            if profile is not None:
                queued = engine.warm_up(profile)
                self.get_logger().info(f"warm-up: {queued} specialisation(s) queued")
        except BaseException:
            engine.close()
            raise
        return engine

    def close(self) -> None:
        """Stop the background compile workers, then leave the graph."""
        self.engine.close()
        self.destroy_node()

    # -- input handling -----------------------------------------------------------------
    @contextmanager
    def handling(self, what: str) -> Iterator[None]:
        """Count one input; turn any failure into a counted, throttled drop."""
        self.counters["frames_in"] += 1
        try:
            yield
        except CloudError as err:
            self.drops.drop(err.reason, f"{what}: {err}")
        except BoundError as err:
            self.drops.drop(OVER_BOUND, f"{what}: {err}")
        except DynshapeError as err:
            self.drops.drop(PROCESSING_ERROR, f"{what}: {err}")
        except Exception as err:  # noqa: BLE001 - one bad message must never stop the node
            self.drops.drop(INTERNAL_ERROR, f"{what}: {err!r}\n{traceback.format_exc(limit=-3)}")

    def points_of(self, msg: PointCloud2, pipeline: Pipeline) -> np.ndarray:
        """Vectorised conversion, then the point bound (drop, or subsample if configured)."""
        points = cloud_to_points(msg)
        self.counters["points_non_finite_removed"] += points.removed_non_finite
        bounded = pipeline.bound_points(points.xyzi)
        self.counters["frames_subsampled"] = pipeline.subsampled_frames
        return bounded

    def record_latency(self, stages: dict[str, float]) -> None:
        for stage, ms in stages.items():
            self.latency.setdefault(stage, LatencyStats()).add(ms)
            self.last_latency_ms[stage] = ms

    def note(self, key: str, text: str, warn: bool = False) -> None:
        self.notes[key] = text
        if warn:
            self._warn_notes.add(key)
        else:
            self._warn_notes.discard(key)

    # -- diagnostics --------------------------------------------------------------------
    def diagnostic_values(self) -> dict[str, object]:
        values: dict[str, object] = dict(self.counters)
        values.update({f"drops.{reason}": n for reason, n in self.drops.counts.items()})
        values.update(self.notes)
        values.update({f"jit.{k}": v for k, v in self.engine.metrics.snapshot().items()})
        for stage, stats in self.latency.items():
            values[f"latency_ms.{stage}.last"] = round(self.last_latency_ms[stage], 3)
            values[f"latency_ms.{stage}.mean"] = round(stats.mean_ms, 3)
            values[f"latency_ms.{stage}.max"] = round(stats.max_ms, 3)
        return values

    def publish_diagnostics(self) -> None:
        values = self.diagnostic_values()
        new_drops = self.drops.total - self._drops_seen
        self._drops_seen = self.drops.total
        problems = [self.notes[k] for k in sorted(self._warn_notes)]
        if new_drops:
            problems.append(f"{new_drops} input(s) dropped since the last report")
        if self.engine.metrics.degraded:
            problems.append("JIT specialisation paused (auto-degrade)")
        level = DiagnosticStatus.WARN if problems else DiagnosticStatus.OK
        self._diagnostics.publish(
            diagnostic_array(
                self.get_clock().now().to_msg(),
                f"{self.get_fully_qualified_name()}: perception",
                str(self.values["target_profile"]),
                level,
                "; ".join(problems) or "ok",
                values,
            )
        )


class OdometryInput:
    """Subscribes to ``odom``; gives the lidar pose at a stamp, or the static-sensor fallback."""

    def __init__(self, node: PerceptionNode) -> None:
        self.node = node
        values = node.values
        mount = Pose2D(
            float(values["odometry.sensor_x_m"]),
            float(values["odometry.sensor_y_m"]),
            float(values["odometry.sensor_yaw_rad"]),
        )
        self.buffer = PoseBuffer(int(values["odometry.buffer_size"]), mount)
        self.frame_id: str | None = None
        node.note("odometry", "none received yet")
        node.create_subscription(Odometry, "odom", self._on_odom, node.input_qos)

    def _on_odom(self, msg: Odometry) -> None:
        stamp, x, y, yaw = odometry_pose(msg)
        if not np.isfinite((stamp, x, y, yaw)).all():
            self.node.drops.drop(ODOM_NON_FINITE, "odometry holds NaN or Inf")
            return
        newest = self.buffer.newest_stamp_s
        if not self.buffer.add(stamp, x, y, yaw):
            self.node.drops.drop(
                ODOM_BACKWARDS, f"odometry stamp {stamp:.6f} s is not after {newest:.6f} s"
            )
            return
        if self.frame_id != msg.header.frame_id:
            self.frame_id = msg.header.frame_id
            self.node.get_logger().info(f"odometry received: tracking in frame {self.frame_id!r}")
            self.node.note("odometry", f"ok (frame {self.frame_id})")

    def pose_at(self, stamp_s: float, sensor_frame: str) -> tuple[Pose2D, str]:
        """The lidar pose and the fixed frame; without odometry the sensor frame is fixed."""
        pose = self.buffer.pose_at(stamp_s)
        if pose is None or self.frame_id is None:
            if self.node.drops.once(
                "no_odometry",
                f"no odometry on {self.node.resolve_topic_name('odom')!r}: static sensor "
                f"assumed, tracking in the sensor frame {sensor_frame!r}",
            ):
                self.node.note("odometry", NO_ODOMETRY, warn=True)
            return Pose2D(), sensor_frame
        return pose, self.frame_id


class FixedFrame:
    """Remembers the fixed frame; a change (odometry appearing) restarts the state in it."""

    def __init__(self, node: PerceptionNode, reset: Callable[[], None]) -> None:
        self.node = node
        self.frame_id: str | None = None
        self._reset = reset
        self.last_stamp_s: float | None = None

    def admit(self, frame_id: str, stamp_s: float) -> bool:
        if frame_id != self.frame_id:
            if self.frame_id is not None:
                self.node.get_logger().info(
                    f"fixed frame changed from {self.frame_id!r} to {frame_id!r}: state reset"
                )
            self.frame_id = frame_id
            self._reset()
            self.last_stamp_s = None
        if self.last_stamp_s is not None and not stamp_s > self.last_stamp_s:
            self.node.drops.drop(
                STALE_STAMP,
                f"stamp {stamp_s:.6f} s is not after the previous {self.last_stamp_s:.6f} s",
            )
            return False
        self.last_stamp_s = stamp_s
        return True


def output_header(stamp: Any, frame_id: str) -> Header:
    return Header(stamp=stamp, frame_id=frame_id)


def run_node(factory: Callable[[], PerceptionNode], args: list[str] | None = None) -> int:
    """Spin one node until SIGINT/SIGTERM (exit 0), stopping its compile workers on the way out."""
    try:
        with rclpy.init(args=args):
            try:
                node = factory()
            except Exception:
                # SIGINT/SIGTERM while the engine was building shuts the context down
                # under the constructor: that is a requested exit, not a failure.
                if not rclpy.ok():
                    return 0
                raise
            try:
                rclpy.spin(node)
            finally:
                node.close()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except DynshapeError as err:
        rclpy.logging.get_logger("dynshape_perception").fatal(f"cannot start: {err}")
        return 1
    return 0
