"""What every perception node shares: parameters, engines, executor, drops, diagnostics, main."""

from __future__ import annotations

import faulthandler
import functools
import gc
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future
from contextlib import contextmanager
from typing import Any, ParamSpec, Protocol, TypeVar

import numpy as np
import rclpy
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
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray

from dynshape_perception import parameters
from dynshape_perception.errors import BoundError, ConfigError, DynshapeError, MessageError
from dynshape_perception.interrupts import shutting_down, startup_done
from dynshape_perception.io.cdr import stamp_s_of
from dynshape_perception.io.markers import MarkerStyle
from dynshape_perception.io.pointcloud2 import REASONS, CloudError, CloudLike, cloud_to_points
from dynshape_perception.nodes import diagnostics as diag
from dynshape_perception.nodes.debug_times import switch_debug_times
from dynshape_perception.nodes.guard import InternalErrors, guarded
from dynshape_perception.nodes.inputs import InputThread
from dynshape_perception.nodes.messages import NS_PER_S, stamp_s
from dynshape_perception.nodes.outputs import Output
from dynshape_perception.perception import scan
from dynshape_perception.perception.drops import DropCounter
from dynshape_perception.perception.localization import Located
from dynshape_perception.perception.pipeline import ModelFn, Pipeline
from dynshape_perception.perception.stamps import (
    FUTURE_STAMP,
    OUTLIER_STAMP,
    RESTART,
    StampScreen,
)
from dynshape_perception.perception.transforms import Matrix
from dynshape_perception.runtime.cpu_latency import CpuLatency, hold_cpu_latency
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.metrics import LatencyStats
from dynshape_perception.runtime.process_tree import tree_values
from dynshape_perception.scheduling.executor import TieredExecutor, diagnostic_status
from dynshape_perception.scheduling.lidar_tiers import executor_values, since
from dynshape_perception.scheduling.tiers import TIERS
from dynshape_perception.scheduling.work import WorkCount, WorkGate, holding

OVER_BOUND = "over_bound"
STALE_STAMP = "stale_stamp"
PROCESSING_ERROR = "processing_error"
INTERNAL_ERROR = "internal_error"
ODOM_BACKWARDS = "odom_time_backwards"
ODOM_NON_FINITE = "odom_non_finite"
ODOM_BAD_QUATERNION = "odom_bad_quaternion"
ODOM_STALE = "odom_stale"
TF_UNAVAILABLE = "tf_unavailable"
# Bytes on odom, /tf or /tf_static that hold no message, or a transform that is none.
ODOM_BAD_MESSAGE, TF_BAD_MESSAGE = "odom_bad_message", "tf_bad_message"
# A message that decodes but holds what it must not (a NaN, a degenerate quaternion).
BAD_MESSAGE = "bad_message"
TIME_JUMP_RESET = "time_jump_reset"
ODOM_FRAME_CHANGES = "odom_frame_changes"
INTENSITY_OUT_OF_RANGE = "intensity_out_of_range"
# The stage from an input's publication to its take by the node (``InputThread.delivery_ms``).
DELIVERY = "delivery"
POINT_REASONS = (*REASONS, OUTLIER_STAMP, OVER_BOUND, PROCESSING_ERROR, INTERNAL_ERROR)
# The reasons of the nodes that take odometry and keep state in a fixed frame.
ODOM_REASONS = (
    ODOM_BACKWARDS,
    ODOM_NON_FINITE,
    ODOM_BAD_QUATERNION,
    ODOM_BAD_MESSAGE,
    ODOM_STALE,
    FUTURE_STAMP,
    OUTLIER_STAMP,
    TF_UNAVAILABLE,
    TF_BAD_MESSAGE,
)
# Pose drops, reported by the pose task; the input task reports the rest.
POSE_REASONS = frozenset(ODOM_REASONS) - {FUTURE_STAMP, OUTLIER_STAMP}
POINT_COUNTERS = {
    "points_non_finite_removed": 0,
    "frames_subsampled": 0,
    INTENSITY_OUT_OF_RANGE: 0,
    **dict.fromkeys(scan.COUNTERS, 0),
}
NO_ODOMETRY = "absent: static sensor assumed"
# Notes the pose task reports; the input task reports the others.
POSE_NOTES = frozenset({"odometry", "pose", "mount"})
# Tier-1 work runs on an engine of its own (see nodes/tiered.py).
TIER1_MODELS = ("segmenter",)
T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


def descriptor(spec: parameters.ParamSpec) -> ParameterDescriptor:
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


def on_parameters(
    node: Node,
    check: Callable[[list[Parameter[Any]]], SetParametersResult],
    apply: Callable[[list[Parameter[Any]]], None],
) -> None:
    """``check`` a change before rclpy accepts it, ``apply`` it after. rclpy before Iron
    (Humble) has no post-set callback: there ``apply`` runs in the on-set path once ``check``
    accepted the change, the last thing before rclpy stores it."""
    post_set = getattr(node, "add_post_set_parameters_callback", None)
    if post_set is not None:
        node.add_on_set_parameters_callback(check)
        post_set(apply)
        return

    def check_then_apply(changes: list[Parameter[Any]]) -> SetParametersResult:
        result = check(changes)
        if result.successful:
            apply(changes)
        return result

    node.add_on_set_parameters_callback(check_then_apply)


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
        # One callback at a time, whichever thread runs it: the input thread or rclpy's.
        self.turn = threading.RLock()
        self.inputs = InputThread(self.context, kind, self.turn)
        self.specs = parameters.node_specs(kind)
        self.values = self._declare()
        # Read once and on each change: a frame's stamp screen must not re-read the values.
        self.stamp_policy = parameters.stamp_policy(self.values)
        # Frame callbacks and executor units: what the diagnostics update waits out, and,
        # in a node with an executor, the debug times too. Without one, a node records its
        # times last in its callback, after its outputs, and nothing waits for them.
        self.work = WorkCount()
        self._debug_busy = (lambda: self.work.busy) if parameters.uses_executor(kind) else None
        self.debug_times = switch_debug_times(None, self, self.values, self._debug_busy)
        self.work.listen(self._debug_work_ended)
        self.drops = DropCounter(
            reasons, self.get_logger().warning, float(self.values["warn_throttle_s"])
        )
        self.latency: dict[str, LatencyStats] = {}
        self.last_latency_ms: dict[str, float] = {}
        self.counters: dict[str, int] = {"frames_in": 0, "frames_out": 0}
        self.notes: dict[str, str] = {}
        self._warn_notes: set[str] = set()
        self._drops_seen = 0
        self.internal_errors = InternalErrors()
        # Counters and latencies are updated from the executor's lanes too.
        self._stats_lock = threading.Lock()
        self._closing = False
        self._reported: dict[str, Any] | None = None
        # What a jump back in time restarts (the fixed frame's state, the odometry buffer).
        self._time_resets: list[Callable[[], None]] = []
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
        self.fast_engine: Engine | None = None
        self.deadline_executor: TieredExecutor | None = None
        try:
            if parameters.uses_executor(kind):
                self.fast_engine = self._build_engine(TIER1_MODELS)
                self.deadline_executor = TieredExecutor(
                    parameters.tier_config(self.values),
                    parameters.executor_options(self.values),
                    pools=[self.fast_engine.pool, self.engine.pool],
                    gates=[self.fast_engine.gate, self.engine.gate, self.work],
                    wall_clock=self.ros_time_s,
                )
                self._say_lanes()
            self.bounds = parameters.bounds_from(self.values)
            on_parameters(self, self.in_turn(self._on_set), self.in_turn(self._after_set))
            self.diagnostics = diag.NodeDiagnostics(
                self,
                str(self.values["target_profile"]),
                self.values,
                lambda: self.work.busy,
                self.turn,
            )
            self.work.listen(self.diagnostics.work_ended)
            self.diagnostics.add_task(diag.INPUT, self._report_input)
            self.diagnostics.add_task(diag.JIT, self._report_jit)
            if self.deadline_executor is not None:
                self.diagnostics.add_task(diag.TIERS, self._report_tiers)
        except BaseException:
            self._stop_workers()
            raise
        self.cpu_latency = self._hold_cpu_latency()
        self.note("host_gate", self.engine.host_gate)
        # Setup made most of the objects the process will ever hold; a full collection
        # over them holds the GIL for a long while, so later ones scan new objects only.
        gc.collect()
        gc.freeze()

    # -- parameters ---------------------------------------------------------------------
    def _declare(self) -> dict[str, parameters.Value]:
        values: dict[str, parameters.Value] = {}
        for name, spec in self.specs.items():
            try:
                self.declare_parameter(name, spec.default, descriptor(spec))
            except Exception as err:
                raise ConfigError(f"parameter {name}: {err}") from err
            values[name] = self.get_parameter(name).value
        parameters.validate(values, self.specs)
        return values

    def _on_set(self, changes: list[Parameter[Any]]) -> SetParametersResult:
        candidate = dict(self.values)
        for param in changes:
            if param.name in self.specs:
                candidate[param.name] = param.value
        try:
            parameters.validate(candidate, self.specs)
        except ConfigError as err:
            return SetParametersResult(successful=False, reason=str(err))
        return SetParametersResult(successful=True)

    def _after_set(self, changes: list[Parameter[Any]]) -> None:
        # The values of ``changes``, not get_parameter's: without a post-set callback (rclpy
        # before Iron) this runs before rclpy stores them.
        changed = {p.name for p in changes if p.name in self.specs}
        for param in changes:
            if param.name in changed:
                self.values[param.name] = param.value
        if changed:
            self.drops.throttle_s = float(self.values["warn_throttle_s"])
            self.stamp_policy = parameters.stamp_policy(self.values)
            self._apply_jit()
            if self.deadline_executor is not None and any(n.startswith("tiers.") for n in changed):
                self.deadline_executor.update_config(parameters.tier_config(self.values))
            self.apply_parameters(changed)
            self.debug_times = switch_debug_times(
                self.debug_times, self, self.values, self._debug_busy
            )
            self.get_logger().info(f"parameters changed: {sorted(changed)}")

    def apply_parameters(self, changed: set[str]) -> None:
        """Hook: push accepted tunable values into the core objects."""

    def _apply_jit(self) -> None:
        config = parameters.jit_config(self.values)
        for engine in self.engines():
            engine.jit = config
            for dispatcher in engine.dispatchers.values():
                dispatcher.reconfigure(config)

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
            jit=parameters.jit_config(values),
            cache_dir=parameters.optional_path(values["model_cache_dir"]),
            models=tuple(models),
            weights_dir=parameters.optional_path(values["weights_dir"]),
        )
        try:
            profile = parameters.optional_path(values["jit.warm_up_shapes"])
            if profile is not None:
                # Frozen mode waits here for its compiles: what does not land in time never serves.
                queued = engine.warm_up(profile)
                self.get_logger().info(
                    f"warm-up: {queued} specialisation(s) queued, {engine.serving()} serving"
                )
        except BaseException:
            engine.close()
            raise
        return engine

    def engines(self) -> list[Engine]:
        return [e for e in (self.engine, self.fast_engine) if e is not None]

    def ros_time_s(self) -> float:
        """The node's clock (simulated time under ``use_sim_time``), as sensor stamps are."""
        return self.get_clock().now().nanoseconds / NS_PER_S

    def on_time_jump(self, reset: Callable[[], None]) -> None:
        self._time_resets.append(reset)
        self.counters.setdefault(TIME_JUMP_RESET, 0)

    def screen_stamp(
        self, screen: StampScreen, stamp_s: float, newest_s: float | None, what: str
    ) -> bool:
        """False (a counted drop) for an outlier stamp, which moves no state; a sustained jump
        back restarts every registered state, since a looped bag or a reset clock would
        else make every later input stale for good."""
        screen.policy = self.stamp_policy
        screened = screen.check(stamp_s, newest_s, self.ros_time_s())
        if screened.dropped:
            self.drops.drop(screened.verdict, f"{what}: {screened.reason}")
            return False
        if screened.verdict == RESTART:
            self.get_logger().warning(f"{what}: {screened.reason}: tracks and odometry restart")
            self.count(TIME_JUMP_RESET)
            for reset in self._time_resets:
                reset()
        elif screened.reason:
            self.get_logger().info(f"{what}: {screened.reason}: taken as the new timeline")
        return True

    def _hold_cpu_latency(self) -> CpuLatency | None:
        """``power.max_cpu_latency_us``, held until ``close``; a refusal is a warning."""
        request = hold_cpu_latency(int(self.values["power.max_cpu_latency_us"]))
        if request is None:
            return None
        if request.held:
            # Host-wide and a cost in power: said once, where the operator looks.
            self.get_logger().info(
                f"CPU latency request of {request.latency_us} µs held while the node runs "
                "(power.max_cpu_latency_us; -1 leaves the kernel its choice)"
            )
        else:
            self.get_logger().warning(f"CPU latency {request.summary()}")
        self.note("cpu_latency", request.summary())
        return request

    def _say_lanes(self) -> None:
        assert self.deadline_executor is not None
        options = self.deadline_executor.options
        self.get_logger().info(
            f"tiered executor: {options.reserved_workers} lane(s) reserved for tier 1, "
            f"{options.shared_workers} shared; deadlines "
            f"{[self.deadline_executor.config.deadline_ms(t) for t in TIERS]} ms"
        )

    def _stop_workers(self) -> None:
        """The executor first (it drops what is queued), then the compile workers."""
        self._closing = True
        if self.deadline_executor is not None:
            self.deadline_executor.close()
        for engine in self.engines():
            engine.close()

    def start(self) -> None:
        """Take input: the input thread starts; ``rclpy.spin`` serves the rest."""
        self.inputs.start()

    @property
    def failure(self) -> BaseException | None:
        """What ended the input thread, if anything but ``close`` did."""
        return self.inputs.failure

    def close(self) -> None:
        """Stop taking input, then the executor and the background compile workers, then
        leave the graph."""
        self.inputs.close()
        self._stop_workers()
        if self.cpu_latency is not None:
            self.cpu_latency.close()
        self.destroy_node()

    # -- topics -------------------------------------------------------------------------
    def subscribe(
        self, msg_type: Any, topic: str, callback: Callable[[Any], None], raw: bool = False
    ) -> None:
        """A sensor-data subscription whose rate and stamps the diagnostics check; ``raw``:
        the callback takes the CDR bytes (no message objects built)."""
        name = self.resolve_topic_name(topic)
        self.diagnostics.topic(name)

        def receive(msg: Any) -> None:
            self.diagnostics.tick(name, stamp_s_of(msg) if raw else stamp_s(msg.header.stamp))
            callback(msg)

        self.take_input(msg_type, topic, self.guarded(name, receive), self.input_qos, raw=raw)

    def take_input(
        self,
        msg_type: Any,
        topic: str,
        callback: Callable[[Any], None],
        qos: QoSProfile,
        raw: bool = False,
    ) -> None:
        """A subscription the input thread takes (``inputs``), its callback under ``turn``."""
        self.inputs.add(
            self.create_subscription(
                msg_type, topic, callback, qos, callback_group=self.inputs.group, raw=raw
            )
        )

    def in_turn(self, callback: Callable[P, R]) -> Callable[P, R]:
        """``callback`` run under ``turn``: for those rclpy's executor runs."""

        @functools.wraps(callback)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with self.turn:
                return callback(*args, **kwargs)

        return run

    def guarded(self, what: str, callback: Callable[[Any], None]) -> Callable[[Any], None]:
        return guarded(self, what, callback)

    def failures_count(self) -> bool:
        return not self._closing and self.context.ok()

    def output(self, msg_type: Any, topic: str, stamped: bool = True) -> Output:
        return Output(self, self.diagnostics, self.output_qos, msg_type, topic, stamped)

    def marker_output(self) -> Output | None:
        """``markers``, with ``debug.publish_markers``."""
        self.counters[MARKERS_UNREAD] = 0
        if not self.values["debug.publish_markers"]:
            return None
        return self.output(MarkerArray, "markers", stamped=False)

    def markers_to_build(self, markers: Output | None) -> Output | None:
        """``markers`` if this frame's are to be built: on, and read (else counted)."""
        if markers is None:
            return None
        if markers.unread():
            self.count(MARKERS_UNREAD)
            return None
        return markers

    # -- input handling -----------------------------------------------------------------
    @contextmanager
    def handling(self, what: str) -> Iterator[None]:
        """Count one input, hold the compiles and the diagnostics update back while it is
        handled, and turn any failure into a counted, throttled drop."""
        self.count("frames_in")
        # With an executor, its units hold these on from here.
        gates: list[WorkGate] = [engine.gate for engine in self.engines()]
        gates.append(self.work)
        with holding(gates):
            try:
                yield
            except Exception as err:  # noqa: BLE001 - one bad message must never stop the node
                self.count_failure(what, err)

    def count_failure(self, what: str, err: Exception) -> None:
        if isinstance(err, CloudError):
            self.drops.drop(err.reason, f"{what}: {err}")
        elif isinstance(err, MessageError) and BAD_MESSAGE in self.drops.counts:
            self.drops.drop(BAD_MESSAGE, f"{what}: {err}")
        elif isinstance(err, BoundError):
            self.drops.drop(OVER_BOUND, f"{what}: {err}")
        elif isinstance(err, DynshapeError):
            self.drops.drop(PROCESSING_ERROR, f"{what}: {err}")
        else:
            self.internal_errors.add(f"{what}: {err!r}")
            trace = "".join(traceback.format_exception(err, limit=-3))
            self.drops.drop(INTERNAL_ERROR, f"{what}: {err!r}\n{trace}")

    def log_shed(self, what: str, reason: str) -> None:
        """Shed work is counted per tier in /diagnostics; say so in the log too, throttled."""
        self.get_logger().warning(
            f"{what}: shed by the deadline executor ({reason})",
            throttle_duration_sec=float(self.values["warn_throttle_s"]),
        )

    def deliver(self, what: str, publish: Callable[[T], None]) -> Callable[[Future[T]], None]:
        """A done-callback of an executor unit: hand its result to ``publish``.

        It runs on the lane that finished the unit, so ``publish`` must stay short. A unit
        the executor shed (counted in its tier) or one finishing during shutdown publishes
        nothing; a unit that failed counts as a dropped input, as it would in a callback.
        """

        def done(future: Future[T]) -> None:
            if self._closing:
                return
            if future.cancelled():
                self.log_shed(what, "cancelled")
                return
            err = future.exception()
            if isinstance(err, CancelledError):
                self.log_shed(what, str(err))
                return
            if isinstance(err, Exception):
                self.count_failure(what, err)
                return
            try:
                publish(future.result())
            except Exception as failure:  # noqa: BLE001 - a lane must survive any frame
                # A signal shuts the context down before ``close`` runs: not a failure.
                if not self._closing and self.context.ok():
                    self.count_failure(what, failure)

        return done

    def points_of(
        self, msg: CloudLike, pipeline: Pipeline, mount: Matrix | None = None
    ) -> np.ndarray:
        """Vectorised conversion; into the vehicle frame by ``mount``, cropped (no-returns,
        too near, the ego box, outside the ROI: each counted); then the point bound (drop,
        or subsample if configured)."""
        points = cloud_to_points(msg)
        self.count("points_non_finite_removed", points.removed_non_finite)
        if points.has_intensity:
            self._scale_intensity(points.xyzi[:, 3])
        bounded, removed = pipeline.prepare(points.xyzi, mount)
        for key, n in removed.items():
            self.count(key, n)
        self.set_counter("frames_subsampled", pipeline.subsampled_frames)
        return bounded

    def _scale_intensity(self, intensity: np.ndarray) -> None:
        """Scale in place to the [0, 1] the segmenter was trained on; count and clip the rest."""
        scale = float(self.values["points.intensity_scale"])
        if scale != 1.0:
            intensity *= scale
        if intensity.size == 0:
            return
        low, high = float(intensity.min()), float(intensity.max())
        if low >= 0.0 and high <= 1.0:
            return
        self.count(INTENSITY_OUT_OF_RANGE)
        self.drops.once(
            INTENSITY_OUT_OF_RANGE,
            f"cloud intensity spans [{low:g}, {high:g}] after points.intensity_scale {scale:g}; "
            "the segmenter expects [0, 1] (set points.intensity_scale, e.g. 1/255 for 8-bit "
            "drivers): clipped, counted in intensity_out_of_range",
        )
        np.clip(intensity, 0.0, 1.0, out=intensity)

    def count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.counters[key] = self.counters.get(key, 0) + n

    def set_counter(self, key: str, value: int) -> None:
        with self._stats_lock:
            self.counters[key] = value

    def delivery(self) -> dict[str, float]:
        """The ``delivery`` stage of the input whose callback runs (call it from there);
        none where the middleware gave no publication time."""
        ms = self.inputs.delivery_ms()
        return {} if ms is None else {DELIVERY: ms}

    def record_latency(self, stages: dict[str, float], flush: bool = False) -> None:
        """A frame's stage times; ``flush``: its last output is out, so its debug times,
        held while its work runs (``DebugTimes``), go out now."""
        with self._stats_lock:
            for stage, ms in stages.items():
                self.latency.setdefault(stage, LatencyStats()).add(ms)
                self.last_latency_ms[stage] = ms
        debug_times = self.debug_times
        if debug_times is not None:
            debug_times.record(stages, flush)

    def _debug_work_ended(self) -> None:
        debug_times = self.debug_times
        if debug_times is not None:
            debug_times.work_ended()

    def note(self, key: str, text: str, warn: bool = False) -> None:
        self.notes[key] = text
        if warn:
            self._warn_notes.add(key)
        else:
            self._warn_notes.discard(key)

    # -- diagnostics --------------------------------------------------------------------
    def _values(self, drops: bool, pose: bool) -> dict[str, object]:
        """Counters, latencies and notes; the drops of the pose task's reasons or the rest."""
        values: dict[str, object] = {}
        if not pose:
            with self._stats_lock:
                values.update(self.counters)
                for stage, stats in self.latency.items():
                    values[f"latency_ms.{stage}.last"] = round(self.last_latency_ms[stage], 3)
                    values[f"latency_ms.{stage}.mean"] = round(stats.mean_ms, 3)
                    values[f"latency_ms.{stage}.max"] = round(stats.max_ms, 3)
        if drops:
            values.update(
                {
                    f"drops.{reason}": n
                    for reason, n in self.drops.snapshot().items()
                    if (reason in POSE_REASONS) == pose
                }
            )
        values.update({k: v for k, v in self.notes.items() if (k in POSE_NOTES) == pose})
        return values

    def _new_drops(self) -> int:
        total = self.drops.total
        new, self._drops_seen = total - self._drops_seen, total
        return new

    def _report_input(self) -> diag.Report:
        """WARN on new drops (pose drops included: they lose frames too) or notes; ERROR on
        new internal errors."""
        problems = [self.notes[k] for k in sorted(self._warn_notes) if k not in POSE_NOTES]
        new_drops = self._new_drops()
        if new_drops:
            problems.append(f"{new_drops} input(s) dropped since the last report")
        internal, last = self.internal_errors.take()
        if internal:
            problems.append(f"{internal} internal error(s) since the last report, last {last}")
        level = 2 if internal else int(bool(problems))
        return level, problems, self._values(drops=True, pose=False)

    def report_pose(self) -> diag.Report:
        problems = [self.notes[k] for k in sorted(self._warn_notes) if k in POSE_NOTES]
        return int(bool(problems)), problems, self._values(drops=True, pose=True)

    def _report_jit(self) -> diag.Report:
        snapshot = self.engine.metrics.snapshot()
        values: dict[str, object] = {f"jit.{k}": v for k, v in snapshot.items()}
        if self.fast_engine is not None:
            values.update(
                {f"jit_tier1.{k}": v for k, v in self.fast_engine.metrics.snapshot().items()}
            )
        # The whole process tree: idle compile workers are hundreds of MB beside the node.
        values.update(tree_values([e.pool for e in self.engines()]))
        values["jit.host_stops"] = sum(e.gate.host_stops for e in self.engines())
        if any(engine.metrics.degraded for engine in self.engines()):
            return 1, ["JIT specialisation paused (auto-degrade)"], values
        return 0, [], values

    def _report_tiers(self) -> diag.Report:
        """The executor's counters; ERROR on a tier-1 miss, WARN on lower-tier losses or
        degraded mode, in this period only (the counts stay cumulative)."""
        assert self.deadline_executor is not None
        snapshot = self.deadline_executor.snapshot()
        period = since(snapshot, self._reported)
        self._reported = snapshot
        degraded = bool(period.pop("degraded", False))
        level, message, _ = diagnostic_status(period)
        values: dict[str, object] = dict(diagnostic_status(snapshot)[2])
        values.update(executor_values(snapshot, self.deadline_executor.config))
        problems = [f"{message} since the last report"] if level else []
        if degraded:
            problems.append("overload: degraded mode (far field subsampled)")
        return max(level, int(degraded)), problems, values


class FixedFrame:
    """Remembers the fixed frame; a change (odometry appearing) restarts the state in it."""

    def __init__(self, node: PerceptionNode, reset: Callable[[], None]) -> None:
        self.node = node
        self.frame_id: str | None = None
        self._reset = reset
        self.last_stamp_s: float | None = None
        self.stamps = StampScreen(parameters.stamp_policy(node.values))
        node.on_time_jump(self._restart)

    def _restart(self) -> None:
        self._reset()
        self.last_stamp_s = None
        self.stamps.clear()

    def screen(self, stamp_s: float) -> bool:
        """False (a counted drop) for an outlier stamp; a sustained jump back restarts.

        Call it before anything uses the stamp, so that a bad one moves no state.
        """
        return self.node.screen_stamp(self.stamps, stamp_s, self.last_stamp_s, "frame")

    def place(self, pose: PoseSource, frame_id: str, stamp_s: float) -> Located | None:
        """The screened stamp's place in the fixed frame, or None (a counted drop): screened
        first, so that an outlier stamp never reaches the pose's staleness check."""
        if not self.screen(stamp_s):
            return None
        return pose.locate(frame_id, stamp_s)

    def admit(self, frame_id: str, stamp_s: float, same_stamp: bool = False) -> bool:
        """``same_stamp``: an input may share the previous one's stamp (sectors of a scan)."""
        if frame_id != self.frame_id:
            if self.frame_id is not None:
                self.node.get_logger().info(
                    f"fixed frame changed from {self.frame_id!r} to {frame_id!r}: state reset"
                )
            self.frame_id = frame_id
            self._reset()
            self.last_stamp_s = None
        last = self.last_stamp_s
        if last is not None and not (stamp_s > last or (same_stamp and stamp_s == last)):
            self.node.drops.drop(
                STALE_STAMP,
                f"stamp {stamp_s:.6f} s is not after the previous {self.last_stamp_s:.6f} s",
            )
            return False
        self.last_stamp_s = stamp_s
        return True


# Frames whose markers were not built: nobody subscribed to them.
MARKERS_UNREAD = "markers_unread"


class PoseSource(Protocol):
    def locate(self, frame_id: str, stamp_s: float) -> Located | None: ...


def output_header(stamp: Any, frame_id: str) -> Header:
    return Header(stamp=stamp, frame_id=frame_id)


# A node still stopping this long after its spin ended writes every thread's stack to stderr:
# launch sends SIGTERM at 5 s, which the node ignores by then, and kills it at 10-15 s.
STOP_STACKS_S = 3.0
# The descriptor itself, whatever object sys.stderr has been replaced with.
STDERR_FD = 2


def run_node(factory: Callable[[], PerceptionNode], args: list[str] | None = None) -> int:
    """Spin one node until SIGINT/SIGTERM (exit 0), stopping its compile workers on the way out.

    ``rclpy.init`` and ``try_shutdown`` rather than ``with rclpy.init()``, which Jazzy's and
    Humble's rclpy lack. A signal during start-up (the engine builds, a frozen warm-up) raises
    StartupInterrupted when the entry point installed its handlers (``nodes.entry``).
    """
    rclpy.init(args=args)
    try:
        try:
            node = factory()
        except Exception:
            # SIGINT/SIGTERM under rclpy's own handlers shuts the context down under the
            # constructor: a requested exit, not a failure.
            if not rclpy.ok():
                return 0
            raise
        try:
            startup_done()
            node.start()
            rclpy.spin(node)
        except Exception:
            # A signal may shut the context down just before the executor builds its wait
            # set (RCLError): a requested exit too, unless the input thread failed and shut
            # it down.
            if node.failure is None:
                if not rclpy.ok():
                    return 0
                raise
        finally:
            # From C: a stop stuck in native code (DDS teardown, a joined thread inside
            # TVM) holds the GIL or the main thread, and ignores SIGTERM once spinning.
            faulthandler.dump_traceback_later(STOP_STACKS_S, file=STDERR_FD)
            node.close()
        if node.failure is not None:
            raise node.failure
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except DynshapeError as err:
        rclpy.logging.get_logger("dynshape_perception").fatal(f"cannot start: {err}")
        return 1
    finally:
        rclpy.try_shutdown()
        shutting_down()
        faulthandler.cancel_dump_traceback_later()
    return 0
