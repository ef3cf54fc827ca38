"""Every node parameter in one table (defaults, ranges, read-only) and the core objects built."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dynshape_perception.config import (
    Bounds,
    Roi,
    default_bounds,
    default_config,
    predictor_history_steps,
)
from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.clustering import ClusterParams
from dynshape_perception.perception.localization import FrameParams
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.perception.pipeline import PipelineParams
from dynshape_perception.perception.scan import SURROUND_ROI, Box, ScanParams
from dynshape_perception.perception.stamps import StampPolicy
from dynshape_perception.perception.tracking import TrackerParams
from dynshape_perception.perception.transforms import planar
from dynshape_perception.runtime.policy import COMPILE_MODES, MODES, JitConfig
from dynshape_perception.scheduling.executor import ExecutorOptions
from dynshape_perception.scheduling.prediction_stage import MODES as MODES_OF_PREDICTION
from dynshape_perception.scheduling.prediction_stage import PredictionSettings
from dynshape_perception.scheduling.streaming import NearField
from dynshape_perception.scheduling.tiers import TierConfig

Value = bool | int | float | str

TRACKER_INPUT_OBJECTS = "detected_objects"
TRACKER_INPUT_TABLE = "table"
TRACKER_INPUT_VISION = "vision_msgs"


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its default also fixes its type (rclpy rejects other types)."""

    name: str
    default: Value
    description: str
    read_only: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    def check(self, value: Value) -> None:
        """Raise ConfigError unless ``value`` fits; rclpy enforces ranges too, this adds choices."""
        if type(value) is not type(self.default):
            raise ConfigError(f"{self.name} must be {type(self.default).__name__}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{self.name} must be one of {list(self.choices)}, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{self.name} must be finite, got {value!r}")
            if self.low is not None and value < self.low:
                raise ConfigError(f"{self.name} must be >= {self.low}, got {value!r}")
            if self.high is not None and value > self.high:
                raise ConfigError(f"{self.name} must be <= {self.high}, got {value!r}")


_CLUSTER = ClusterParams()
_TRACKER = TrackerParams()
_STAMPS = StampPolicy()
_MAX_CONFIRM_FRAMES = 1000
_PIPELINE = PipelineParams()
_JIT = JitConfig()
_BOUNDS = default_bounds()
_BOUND_NAMES = {
    "P": "bounds.max_points",
    "N": "bounds.max_obstacles",
    "M": "bounds.max_tracks",
    "A": "bounds.max_agents",
    "T": "bounds.max_history_steps",
}
_MAX_QOS_DEPTH = 1000
_MAX_BYTES = 1 << 40
_MAX_COUNT = 1_000_000
_NEAR = NearField()
_MAX_LANES = 16
_MAX_RT_PRIORITY = 99
_MAX_SWITCH_INTERVAL_MS = 100.0
_MAX_RANGE_M = 500.0
_MIN_CORRIDOR_M = 0.1
_MAX_GROUND_BAND_M = 10.0
_MAX_STAMP_TOLERANCE_S = 3600.0
_MIN_STAMP_TOLERANCE_S = 0.01
# Intensity scale: 1/65535 (16-bit drivers) must fit, with room on both sides.
_MIN_INTENSITY_SCALE = 1e-9
_MAX_INTENSITY_SCALE = 1e9
# Executor options that take None (leave the thread or interpreter as it is) are 0 here:
# a ROS parameter has one fixed type.
_OFF = 0
_FRAMES = FrameParams()
_OBJECTS = ObjectParams()
_SCAN = ScanParams()
_MAX_MOUNT_M = 100.0
_MAX_STD = 100.0
_MAX_RATE_HZ = 10_000.0
_MAX_WINDOW = 1000
# A passenger car around base_link (rear axle on the ground), for the ego crop.
_EGO_BOX_M = {"x": (-1.0, 4.0), "y": (-1.0, 1.0), "z": (-0.5, 2.0)}
_AXES = ("x", "y", "z")
_STAGE = PredictionSettings()
_MAX_PHASES = 64
_MIN_QUANTUM_M = 1e-4
_MAX_QUANTUM_M = 1.0
_MAX_RADIUS_CELLS = 100
_MAX_HYPOTHESES = 64
_MAX_SECTORS = 4096


def _engine_group() -> tuple[ParamSpec, ...]:
    bounds = tuple(
        ParamSpec(
            name,
            value,
            f"upper bound of {dim} ({what}) in this node; at most the compiled bound "
            f"{value} of config/models.yaml",
            read_only=True,
            low=1,
            high=value,
        )
        for (dim, name), value, what in zip(
            _BOUND_NAMES.items(),
            _BOUNDS.as_dict().values(),
            ("points", "obstacles", "tracks", "agents", "history steps"),
            strict=True,
        )
    )
    return (
        ParamSpec(
            "target_profile",
            "x86_64",
            "target profile of config/targets/ that the models are compiled for",
            read_only=True,
        ),
        ParamSpec(
            "model_cache_dir",
            "",
            "artefact cache folder; empty: $DYNSHAPE_CACHE_DIR or ~/.cache/dynshape_perception",
            read_only=True,
        ),
        ParamSpec(
            "weights_dir",
            "",
            "folder of the checksummed weights and manifest.yaml; empty: the package's models/",
            read_only=True,
        ),
        *bounds,
    )


def _tiers_group() -> tuple[ParamSpec, ...]:
    return tuple(
        ParamSpec(
            f"tiers.{spec.name}",
            spec.default,
            f"{spec.description} (live; the tiers are checked together)",
            low=spec.minimum,
            high=spec.maximum,
        )
        for spec in TierConfig.parameter_specs()
    )


def _executor_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "executor.reserved_workers",
            1,
            "lanes that run tier-1 (collision) work only",
            True,
            low=0,
            high=_MAX_LANES,
        ),
        ParamSpec(
            "executor.shared_workers",
            1,
            "lanes that run every tier, tier 1 first",
            True,
            low=1,
            high=_MAX_LANES,
        ),
        ParamSpec(
            "executor.reserved_rt_priority",
            10,
            "SCHED_FIFO priority of the reserved lanes (needs CAP_SYS_NICE or an rtprio "
            "limit, else a warning); 0: normal scheduling",
            True,
            low=_OFF,
            high=_MAX_RT_PRIORITY,
        ),
        ParamSpec(
            "executor.shared_boost_rt_priority",
            5,
            "SCHED_FIFO priority the shared lanes take while tier-1 work waits, below "
            "reserved_rt_priority; 0: never boosted",
            True,
            low=_OFF,
            high=_MAX_RT_PRIORITY,
        ),
        ParamSpec(
            "executor.switch_interval_ms",
            0.1,
            "GIL switch interval while the executor runs, so that lower-tier Python code "
            "holds tier 1 up briefly; 0: the interpreter's",
            True,
            low=float(_OFF),
            high=_MAX_SWITCH_INTERVAL_MS,
        ),
        ParamSpec(
            "executor.blas_threads",
            1,
            "threads of NumPy's OpenBLAS while the executor runs: with more, a lane's BLAS "
            "call waits on BLAS workers that other lanes pre-empt; 0: left as it is",
            True,
            low=_OFF,
            high=_MAX_LANES,
        ),
    )


def _near_field_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "near_field.ahead_m",
            _NEAR.ahead_m,
            "tier-1 collision corridor (frames.base_frame): its length ahead (+x)",
            low=_MIN_CORRIDOR_M,
            high=_MAX_RANGE_M,
        ),
        ParamSpec(
            "near_field.half_width_m",
            _NEAR.half_width_m,
            "tier-1 collision corridor: its half width (|y|)",
            low=_MIN_CORRIDOR_M,
            high=_MAX_RANGE_M,
        ),
        ParamSpec(
            "near_field.behind_m",
            _NEAR.behind_m,
            "tier-1 collision corridor (frames.base_frame): its length behind (-x)",
            low=0.0,
            high=_MAX_RANGE_M,
        ),
        ParamSpec(
            "near_field.min_z_m",
            _NEAR.min_z_m,
            "tier-1 collision corridor: lowest point height in frames.base_frame",
            low=-_MAX_RANGE_M,
            high=_MAX_RANGE_M,
        ),
        ParamSpec(
            "near_field.max_z_m",
            _NEAR.max_z_m,
            "tier-1 collision corridor: highest point height in frames.base_frame",
            low=-_MAX_RANGE_M,
            high=_MAX_RANGE_M,
        ),
        ParamSpec(
            "near_field.max_points",
            _NEAR.max_points,
            "nearest corridor points segmented at tier 1 (bounds its cost); the rest are "
            "left to the full cloud",
            low=1,
            high=_BOUNDS.P,
        ),
        ParamSpec(
            "near_field.ground_band_m",
            _NEAR.ground_band_m,
            "corridor points this close to the last ground plane are road and left out; 0 "
            "keeps them",
            low=0.0,
            high=_MAX_GROUND_BAND_M,
        ),
    )


def _mount_group() -> tuple[ParamSpec, ...]:
    fallback = "where TF has no transform from the cloud's frame to frames.base_frame"
    return (
        *(
            ParamSpec(
                f"frames.mount_{axis}_m",
                0.0,
                f"sensor position along {axis} in frames.base_frame, {fallback}",
                True,
                low=-_MAX_MOUNT_M,
                high=_MAX_MOUNT_M,
            )
            for axis in _AXES
        ),
        ParamSpec(
            "frames.mount_yaw_rad",
            0.0,
            f"sensor yaw in frames.base_frame, {fallback}",
            True,
            low=-math.pi,
            high=math.pi,
        ),
    )


def _scan_group() -> tuple[ParamSpec, ...]:
    roi = tuple(
        ParamSpec(
            f"scan.roi_{axis}_{end}_m",
            getattr(SURROUND_ROI, f"{axis}_m")[i],
            f"region of interest in frames.base_frame: {end}imum {axis}; points outside are "
            "left out before segmentation (live)",
            low=-_MAX_RANGE_M,
            high=_MAX_RANGE_M,
        )
        for axis in _AXES
        for i, end in enumerate(("min", "max"))
    )
    ego = tuple(
        ParamSpec(
            f"scan.ego_{axis}_{end}_m",
            _EGO_BOX_M[axis][i],
            f"ego crop box in frames.base_frame: {end}imum {axis} (live)",
            low=-_MAX_RANGE_M,
            high=_MAX_RANGE_M,
        )
        for axis in _AXES
        for i, end in enumerate(("min", "max"))
    )
    return (
        *roi,
        ParamSpec(
            "scan.crop_ego",
            False,
            "leave out the points inside the ego crop box (the vehicle's own body)",
        ),
        *ego,
        ParamSpec(
            "scan.min_range_m",
            0.5,
            "points nearer the sensor than this are left out (housing, rain, dust); points "
            "at exactly (0, 0, 0) are no-returns and always left out",
            low=0.0,
            high=_MAX_RANGE_M,
        ),
    )


def _objects_group() -> tuple[ParamSpec, ...]:
    what = {
        "position_std_m": "standard deviation of a track's position (x, y)",
        "height_std_m": "standard deviation of a track's height (z)",
        "yaw_std_rad": "standard deviation of a track's heading",
        "velocity_std_mps": "standard deviation of a track's velocity (x, y)",
    }
    return (
        *(
            ParamSpec(
                f"objects.{name}",
                float(getattr(_OBJECTS, name)),
                f"{text} in the published covariance; it grows with each frame the track "
                "coasts without a detection",
                low=1e-6,
                high=_MAX_STD,
            )
            for name, text in what.items()
        ),
        ParamSpec(
            "objects.stationary_speed_mps",
            _OBJECTS.stationary_speed_mps,
            "tracks slower than this are published as stationary",
            low=1e-6,
            high=_MAX_STD,
        ),
    )


def _diagnostics_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "diagnostics.min_rate_hz",
            5.0,
            "input and output topics below this rate (less diagnostics.rate_tolerance) are "
            "reported as WARN; no message in a window as ERROR",
            True,
            low=0.0,
            high=_MAX_RATE_HZ,
        ),
        ParamSpec(
            "diagnostics.max_rate_hz",
            30.0,
            "input and output topics above this rate (plus diagnostics.rate_tolerance) are "
            "reported as WARN",
            True,
            low=0.0,
            high=_MAX_RATE_HZ,
        ),
        ParamSpec(
            "diagnostics.rate_tolerance",
            0.1,
            "relative slack of the rate bounds",
            True,
            low=0.0,
            high=1.0,
        ),
        ParamSpec(
            "diagnostics.rate_window",
            5,
            "diagnostics periods the topic rates are measured over",
            True,
            low=1,
            high=_MAX_WINDOW,
        ),
        ParamSpec(
            "diagnostics.max_stamp_delay_s",
            1.0,
            "a message stamped further than this before the node's clock is late (ERROR)",
            True,
            low=0.0,
            high=_MAX_STAMP_TOLERANCE_S,
        ),
        ParamSpec(
            "diagnostics.min_stamp_delay_s",
            -0.1,
            "a message stamped further than -this ahead of the node's clock is early (ERROR)",
            True,
            low=-_MAX_STAMP_TOLERANCE_S,
            high=0.0,
        ),
    )


GROUPS: dict[str, tuple[ParamSpec, ...]] = {
    "engine": _engine_group(),
    "jit": (
        ParamSpec("jit.mode", _JIT.mode, "JIT mode: off, frozen, adaptive", True, choices=MODES),
        ParamSpec(
            "jit.hotness_threshold",
            _JIT.hotness_threshold,
            "calls of one shape before it may be specialised",
            low=1,
            high=_MAX_COUNT,
        ),
        ParamSpec(
            "jit.max_entries",
            _JIT.max_entries,
            "specialisations kept per model (LRU)",
            low=1,
            high=_MAX_COUNT,
        ),
        ParamSpec(
            "jit.max_bytes",
            _JIT.max_bytes,
            "library bytes of specialisations kept per model (LRU)",
            low=1,
            high=_MAX_BYTES,
        ),
        ParamSpec(
            "jit.disk_max_bytes",
            _JIT.disk_max_bytes,
            "bytes of the artefact cache on disk, shared by every model and process using "
            "model_cache_dir: least recently used specialisations go first, generic builds last",
            True,
            low=1,
            high=_MAX_BYTES,
        ),
        ParamSpec(
            "jit.pool_size", _JIT.pool_size, "background compile workers", True, low=1, high=64
        ),
        ParamSpec(
            "jit.compile_mode",
            _JIT.compile_mode,
            "compile workers: process (isolated), thread, or auto (picked by the measured "
            "slowdown of live calls)",
            True,
            choices=COMPILE_MODES,
        ),
        ParamSpec(
            "jit.compile_timeout_s",
            _JIT.compile_timeout_s,
            "seconds before a background compile is abandoned",
            True,
            low=1.0,
            high=3600.0,
        ),
        ParamSpec(
            "jit.warm_up_shapes",
            "",
            "recorded shape log (YAML) whose hot shapes compile at start; empty: none",
            read_only=True,
        ),
    ),
    "io": (
        ParamSpec(
            "warn_throttle_s",
            5.0,
            "at most one warning per drop reason in this period",
            low=0.0,
            high=3600.0,
        ),
        ParamSpec(
            "qos.input_depth",
            5,
            "queue depth of the sensor-data (best-effort) subscriptions",
            True,
            low=1,
            high=_MAX_QOS_DEPTH,
        ),
        ParamSpec(
            "qos.output_depth",
            10,
            "queue depth of the (reliable) publishers",
            True,
            low=1,
            high=_MAX_QOS_DEPTH,
        ),
    ),
    "points": (
        ParamSpec(
            "points.subsample_over_bound",
            _PIPELINE.subsample_over_bound,
            "subsample a cloud above bounds.max_points (seeded) instead of dropping it",
        ),
        ParamSpec(
            "points.intensity_scale",
            1.0,
            "factor applied to the cloud's intensity field: the segmenter expects [0, 1] "
            "(1/255 for 8-bit drivers such as Velodyne, 1/65535 for 16-bit ones such as "
            "Ouster); clouds outside [0, 1] after it are clipped and counted",
            low=_MIN_INTENSITY_SCALE,
            high=_MAX_INTENSITY_SCALE,
        ),
        ParamSpec(
            "points.sectors_per_revolution",
            1,
            "clouds per sensor revolution: 1 whole scans; N > 1 sector clouds (tier 1 runs "
            "per sector, the full cloud once per revolution); 0 detect from azimuth coverage",
            True,
            low=_OFF,
            high=_MAX_SECTORS,
        ),
    ),
    "segmentation": (
        ParamSpec(
            "segmentation.score_threshold",
            _CLUSTER.score_threshold,
            "obstacle score above which a point joins a cluster",
            low=0.0,
            high=1.0,
        ),
        ParamSpec(
            "segmentation.cell_size_m",
            _CLUSTER.cell_size_m,
            "bird's-eye-view cell size of the clustering",
            low=0.02,
            high=2.0,
        ),
        ParamSpec(
            "segmentation.min_points",
            _CLUSTER.min_points,
            "points a cluster needs to become an obstacle",
            low=1,
            high=_MAX_COUNT,
        ),
        ParamSpec(
            "segmentation.closing_cells",
            _CLUSTER.closing_cells,
            "radius of the morphological closing in cells; 0 disables it",
            low=0,
            high=16,
        ),
        ParamSpec(
            "segmentation.max_height_m",
            _CLUSTER.max_height_m,
            "points higher above the ground are left out of clusters",
            low=0.1,
            high=50.0,
        ),
    ),
    "odometry": (
        ParamSpec(
            "odometry.buffer_size",
            200,
            "odometry messages kept for interpolating the pose at a cloud's stamp",
            True,
            low=2,
            high=_MAX_COUNT,
        ),
        ParamSpec(
            "odometry.max_extrapolation_s",
            0.5,
            "a frame stamped further than this outside the buffered odometry (odometry "
            "stopped or lagging) is dropped as odom_stale instead of using the end pose; "
            "likewise past the newest /tf of the fixed frame (tf_unavailable)",
            low=0.0,
            high=_MAX_STAMP_TOLERANCE_S,
        ),
    ),
    "stamps": (
        ParamSpec(
            "stamps.future_tolerance_s",
            _STAMPS.future_tolerance_s,
            "an input stamped further than this ahead of the node's clock is dropped "
            "(future_stamp) and never advances the node's state",
            low=_MIN_STAMP_TOLERANCE_S,
            high=_MAX_STAMP_TOLERANCE_S,
        ),
        ParamSpec(
            "stamps.jump_back_tolerance_s",
            _STAMPS.jump_back_tolerance_s,
            "an input stamped further than this before the newest one jumps back in time (a "
            "looped bag, a clock reset): dropped as outlier_stamp until "
            "stamps.jump_confirm_frames in a row follow it, then tracks and odometry "
            "restart (time_jump_reset); a smaller step back is dropped as stale",
            low=_MIN_STAMP_TOLERANCE_S,
            high=_MAX_STAMP_TOLERANCE_S,
        ),
        ParamSpec(
            "stamps.jump_ahead_tolerance_s",
            _STAMPS.jump_ahead_tolerance_s,
            "an input stamped further than this after the newest one, beyond how far the "
            "node's clock ran meanwhile, jumps ahead: dropped as outlier_stamp until "
            "stamps.jump_confirm_frames in a row follow it, so that one stray stamp cannot "
            "make the inputs after it stale (a pause of the input, the clock running on, is "
            "no jump)",
            low=_MIN_STAMP_TOLERANCE_S,
            high=_MAX_STAMP_TOLERANCE_S,
        ),
        ParamSpec(
            "stamps.jump_confirm_frames",
            _STAMPS.jump_confirm_frames,
            "inputs in a row, each after the one before, that make a time jump a new "
            "timeline; 1 takes every jump at once",
            low=1,
            high=_MAX_CONFIRM_FRAMES,
        ),
    ),
    "tracking": (
        ParamSpec(
            "tracking.gate_distance_m",
            _TRACKER.gate_distance_m,
            "largest distance between a detection and the track it may join",
            low=0.01,
            high=100.0,
        ),
        ParamSpec(
            "tracking.min_affinity",
            _TRACKER.min_affinity,
            "smallest associator affinity of a match, in [0, 1)",
            low=0.0,
            high=0.999,
        ),
        ParamSpec(
            "tracking.max_missed_frames",
            _TRACKER.max_missed_frames,
            "frames a track survives without a detection",
            low=0,
            high=_MAX_COUNT,
        ),
        ParamSpec(
            "tracking.min_hits_to_confirm",
            _TRACKER.min_hits_to_confirm,
            "detections before a track is published",
            low=1,
            high=_MAX_COUNT,
        ),
        ParamSpec(
            "tracking.velocity_smoothing",
            _TRACKER.velocity_smoothing,
            "weight of the newest velocity estimate, in (0, 1]",
            low=0.01,
            high=1.0,
        ),
        ParamSpec(
            "tracking.publish_coasting",
            _TRACKER.publish_coasting,
            "also publish tracks that missed their detection this frame",
        ),
    ),
    "tracker_input": (
        ParamSpec(
            "tracker.input_type",
            TRACKER_INPUT_OBJECTS,
            "detections input: autoware_perception_msgs/DetectedObjects on 'detected_objects', "
            "vision_msgs/Detection3DArray on 'detections', or the obstacle table (PointCloud2) "
            "on 'obstacles'",
            True,
            choices=(TRACKER_INPUT_OBJECTS, TRACKER_INPUT_VISION, TRACKER_INPUT_TABLE),
        ),
    ),
    "prediction": (
        ParamSpec(
            "prediction.min_history_steps",
            _PIPELINE.min_history_steps,
            "history samples (at the predictor's step) an agent needs to be predicted; at "
            "most the predictor's history steps (predictor.history_steps of "
            "config/models.yaml, capped by bounds.max_history_steps), checked on set",
            low=1,
            # Not the predictor's steps: the on-set check then gives the reason, where
            # rclpy's range check would only say "out of range".
            high=_BOUNDS.T,
        ),
        ParamSpec(
            "prediction.history_steps",
            _OFF,
            "history samples (at the predictor's step) fed to the predictor; 0: "
            "predictor.history_steps of config/models.yaml; at most bounds.max_history_steps",
            True,
            low=_OFF,
            high=_BOUNDS.T,
        ),
        ParamSpec(
            "prediction.mode",
            _STAGE.mode,
            "incremental: each track below the window (history_steps) keeps its GRU state "
            "and a frame costs one step_decode call whatever its history length; tracks at "
            "the window slide, which a recurrent state cannot, and share one forward call; "
            "full: forward over every history each frame (the same outputs within the "
            "parity tolerance); a change restarts the tracks",
            choices=MODES_OF_PREDICTION,
        ),
        ParamSpec(
            "prediction.speculation",
            _STAGE.speculation,
            "in idle time (tier 4), precompute the next frame's likeliest observations; used "
            "only when an observation verifies exactly, so no output changes",
        ),
        ParamSpec(
            "prediction.grid_phases",
            _STAGE.phases,
            "grid points per predictor step: the track rate times the predictor step "
            "(10 Hz x 0.4 s = 4); each frame advances the state of its grid point",
            True,
            low=1,
            high=_MAX_PHASES,
        ),
        ParamSpec(
            "prediction.position_quantum_m",
            _STAGE.quantum_m,
            "track positions are snapped to this grid in every mode (speculation verifies on it)",
            True,
            low=_MIN_QUANTUM_M,
            high=_MAX_QUANTUM_M,
        ),
        ParamSpec(
            "prediction.speculation_radius_cells",
            _STAGE.speculation_radius_cells,
            "speculated cells (of position_quantum_m) around each hypothesis' first step, "
            "either side",
            True,
            low=0,
            high=_MAX_RADIUS_CELLS,
        ),
        ParamSpec(
            "prediction.speculation_hypotheses",
            _STAGE.speculation_hypotheses,
            "likeliest hypotheses whose first step is speculated",
            True,
            low=1,
            high=_MAX_HYPOTHESES,
        ),
    ),
    "markers": (
        ParamSpec(
            "debug.publish_markers",
            True,
            "publish RViz markers (track boxes, ids, predicted paths) on 'markers'",
            True,
        ),
        ParamSpec("markers.box_alpha", 0.5, "opacity of the track boxes", low=0.0, high=1.0),
        ParamSpec("markers.text_size_m", 1.0, "height of the track id labels", low=0.01, high=10.0),
        ParamSpec(
            "markers.path_width_m",
            0.15,
            "line width of the predicted paths (their alpha is the probability)",
            low=0.01,
            high=5.0,
        ),
    ),
    "tiers": _tiers_group(),
    "executor": _executor_group(),
    "near_field": _near_field_group(),
    "base_frame": (
        ParamSpec(
            "frames.base_frame",
            _FRAMES.base_frame,
            "vehicle frame: clouds are transformed into it (mount from /tf_static) before "
            "segmentation; region of interest, ego crop and collision corridor lie in it",
            True,
        ),
    ),
    "mount": _mount_group(),
    "fixed_frame": (
        ParamSpec(
            "frames.fixed_frame",
            _FRAMES.fixed_frame,
            "frame tracks and predictions are kept in: from TF (fixed_frame -> base_frame) at "
            "each input's stamp, else from odometry on 'odom'; without either the vehicle "
            "stands still in the input's frame",
            True,
        ),
    ),
    "scan": _scan_group(),
    "objects": _objects_group(),
    "tables": (
        ParamSpec(
            "debug.publish_tables",
            False,
            "also publish the PointCloud2 tables (near_obstacles, obstacles, tracks, "
            "predictions) laid out in docs/interfaces.md",
            True,
        ),
    ),
    "diagnostics": _diagnostics_group(),
}

_TIERED = ("tiers", "executor", "near_field")
_COMMON = ("engine", "jit", "io", "diagnostics", "tables")

NODE_GROUPS: dict[str, tuple[str, ...]] = {
    "pointcloud_node": (
        *_COMMON,
        "points",
        "base_frame",
        "mount",
        "scan",
        "segmentation",
        *_TIERED,
    ),
    "tracker_node": (
        *_COMMON,
        "base_frame",
        "mount",
        "fixed_frame",
        "odometry",
        "stamps",
        "tracking",
        "objects",
        "tracker_input",
    ),
    "prediction_node": (
        *_COMMON,
        "base_frame",
        "fixed_frame",
        "odometry",
        "stamps",
        "objects",
        "prediction",
        "markers",
    ),
    "perception_pipeline": (
        *_COMMON,
        "points",
        "base_frame",
        "mount",
        "fixed_frame",
        "scan",
        "segmentation",
        "odometry",
        "stamps",
        "tracking",
        "objects",
        "prediction",
        "markers",
        *_TIERED,
    ),
}

# Parameters rclpy declares on every node by itself, and those diagnostic_updater declares
# (its publishing period and whether statuses carry the node's namespace).
BUILTIN_PARAMETERS = frozenset({"use_sim_time", "start_type_description_service"})
UPDATER_PERIOD = "diagnostic_updater.period"
LIBRARY_PARAMETERS = frozenset({UPDATER_PERIOD, "diagnostic_updater.use_fqn"})


def node_specs(node: str) -> dict[str, ParamSpec]:
    return {spec.name: spec for group in NODE_GROUPS[node] for spec in GROUPS[group]}


def all_specs() -> dict[str, ParamSpec]:
    return {spec.name: spec for group in GROUPS.values() for spec in group}


def _pick(values: Mapping[str, Value], prefix: str, names: Iterable[str]) -> dict[str, Any]:
    """The values under ``prefix``; their types were checked against the specs' defaults."""
    return {name: values[f"{prefix}.{name}"] for name in names if f"{prefix}.{name}" in values}


def bounds_from(values: Mapping[str, Value]) -> Bounds:
    picked: dict[str, Any] = {
        dim: values[name] for dim, name in _BOUND_NAMES.items() if name in values
    }
    return replace(_BOUNDS, **picked)


def cluster_params(values: Mapping[str, Value], base: ClusterParams = _CLUSTER) -> ClusterParams:
    names = ("score_threshold", "cell_size_m", "min_points", "closing_cells", "max_height_m")
    return replace(base, **_pick(values, "segmentation", names))


def tracker_params(values: Mapping[str, Value], base: TrackerParams = _TRACKER) -> TrackerParams:
    names = (
        "gate_distance_m",
        "min_affinity",
        "max_missed_frames",
        "min_hits_to_confirm",
        "velocity_smoothing",
        "publish_coasting",
    )
    return replace(base, **_pick(values, "tracking", names))


def _interval(values: Mapping[str, Value], prefix: str, axis: str) -> tuple[float, float]:
    return float(values[f"{prefix}_{axis}_min_m"]), float(values[f"{prefix}_{axis}_max_m"])


def scan_params(values: Mapping[str, Value]) -> ScanParams | None:
    """The crop of the lidar nodes (None where a node declares no ``scan.*``)."""
    if "scan.min_range_m" not in values:
        return None
    roi = Roi(*(_interval(values, "scan.roi", axis) for axis in _AXES))
    ego = Box(*(_interval(values, "scan.ego", axis) for axis in _AXES))
    return ScanParams(
        roi=roi,
        ego=ego if values["scan.crop_ego"] else None,
        min_range_m=float(values["scan.min_range_m"]),
    )


def object_params(values: Mapping[str, Value]) -> ObjectParams:
    names = ("position_std_m", "height_std_m", "yaw_std_rad", "velocity_std_mps")
    return replace(_OBJECTS, **_pick(values, "objects", (*names, "stationary_speed_mps")))


def frame_params(values: Mapping[str, Value]) -> FrameParams:
    picked: dict[str, Any] = _pick(values, "frames", ("base_frame", "fixed_frame"))
    if "odometry.max_extrapolation_s" in values:
        picked["max_extrapolation_s"] = float(values["odometry.max_extrapolation_s"])
    mount = _pick(values, "frames", ("mount_x_m", "mount_y_m", "mount_z_m", "mount_yaw_rad"))
    fallback = planar(
        float(mount.get("mount_x_m", 0.0)),
        float(mount.get("mount_y_m", 0.0)),
        float(mount.get("mount_yaw_rad", 0.0)),
        float(mount.get("mount_z_m", 0.0)),
    )
    return replace(_FRAMES, fallback_mount=fallback, **picked)


def pipeline_params(values: Mapping[str, Value]) -> PipelineParams:
    extra: dict[str, Any] = {}
    if "points.subsample_over_bound" in values:
        extra["subsample_over_bound"] = values["points.subsample_over_bound"]
    if "prediction.min_history_steps" in values:
        extra["min_history_steps"] = values["prediction.min_history_steps"]
    scan = scan_params(values)
    cluster = cluster_params(values)
    if scan is not None:
        cluster = replace(cluster, roi=scan.roi)
    return replace(
        _PIPELINE,
        cluster=cluster,
        tracker=tracker_params(values),
        scan=scan,
        objects=object_params(values),
        **extra,
    )


def history_steps(values: Mapping[str, Value]) -> int:
    """History samples fed to the predictor: the parameter, else the fitted window."""
    bounds = bounds_from(values)
    steps = int(values.get("prediction.history_steps", _OFF))
    return min(steps, bounds.T) if steps != _OFF else predictor_history_steps(bounds)


def prediction_settings(values: Mapping[str, Value]) -> PredictionSettings:
    """The prediction stage's settings; the predictor's step comes from config/models.yaml."""
    bounds = bounds_from(values)
    picked: dict[str, Any] = {
        "history_steps": history_steps(values),
        "max_agents": bounds.A,
        "step_s": float(default_config().section("predictor").get("step_s", _STAGE.step_s)),
    }
    for name, field_name in (
        ("min_history_steps", "min_history_steps"),
        ("mode", "mode"),
        ("speculation", "speculation"),
        ("grid_phases", "phases"),
        ("position_quantum_m", "quantum_m"),
        ("speculation_radius_cells", "speculation_radius_cells"),
        ("speculation_hypotheses", "speculation_hypotheses"),
    ):
        if f"prediction.{name}" in values:
            picked[field_name] = values[f"prediction.{name}"]
    return replace(_STAGE, **picked)


def sectors_per_revolution(values: Mapping[str, Value]) -> int:
    return int(values.get("points.sectors_per_revolution", 1))


def jit_config(values: Mapping[str, Value]) -> JitConfig:
    names = (
        "mode",
        "hotness_threshold",
        "max_entries",
        "max_bytes",
        "disk_max_bytes",
        "pool_size",
        "compile_mode",
        "compile_timeout_s",
    )
    return replace(_JIT, **_pick(values, "jit", names))


def stamp_policy(values: Mapping[str, Value]) -> StampPolicy:
    names = (
        "future_tolerance_s",
        "jump_back_tolerance_s",
        "jump_ahead_tolerance_s",
        "jump_confirm_frames",
    )
    return replace(_STAMPS, **_pick(values, "stamps", names))


def uses_executor(node: str) -> bool:
    """Whether ``node`` runs its work through the tiered executor (declares ``tiers.*``)."""
    return "tiers" in NODE_GROUPS[node]


def tier_config(values: Mapping[str, Value]) -> TierConfig:
    """The ``tiers.*`` values as one checked config (raises ConfigError with the reason)."""
    return TierConfig.from_mapping(
        {name.removeprefix("tiers."): v for name, v in values.items() if name.startswith("tiers.")}
    )


def _or_none(value: Value) -> Any:
    return None if value == _OFF else value


def executor_options(values: Mapping[str, Value]) -> ExecutorOptions:
    picked = _pick(
        values,
        "executor",
        (
            "reserved_workers",
            "shared_workers",
            "reserved_rt_priority",
            "shared_boost_rt_priority",
            "switch_interval_ms",
            "blas_threads",
        ),
    )
    for name in (
        "reserved_rt_priority",
        "shared_boost_rt_priority",
        "switch_interval_ms",
        "blas_threads",
    ):
        if name in picked:
            picked[name] = _or_none(picked[name])
    return ExecutorOptions(**picked)


def near_field(values: Mapping[str, Value]) -> NearField:
    names = (
        "ahead_m",
        "half_width_m",
        "behind_m",
        "min_z_m",
        "max_z_m",
        "max_points",
        "ground_band_m",
    )
    return replace(_NEAR, **_pick(values, "near_field", names))


def optional_path(value: Value) -> Path | None:
    return Path(str(value)).expanduser() if value else None


def validate(values: Mapping[str, Value], specs: Mapping[str, ParamSpec]) -> None:
    """Check every value, then build the core objects so that their own checks run too."""
    for name, value in values.items():
        specs[name].check(value)
    bounds = bounds_from(values)
    jit_config(values)
    tier_config(values)
    executor_options(values)
    near_field(values)
    stamp_policy(values)
    frame_params(values)
    pipeline = pipeline_params(values)
    # Only where the node predicts: the others would refuse to start over a value they
    # never use (bounds.max_history_steps: 1 with the default minimum of 2).
    if "prediction.min_history_steps" in specs:
        steps = history_steps(values)
        if pipeline.min_history_steps > steps:
            raise ConfigError(
                f"prediction.min_history_steps {pipeline.min_history_steps} exceeds the "
                f"{steps} history steps the predictor gets (prediction.history_steps or "
                f"predictor.history_steps, at most bounds.max_history_steps {bounds.T}): no "
                "agent could ever be predicted"
            )
        prediction_settings(values)
