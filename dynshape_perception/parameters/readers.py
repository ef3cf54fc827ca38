"""The parameter values turned into the core objects, each checked by its own constructor."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from dynshape_perception.config import (
    Bounds,
    default_config,
    predictor_history_steps,
)
from dynshape_perception.errors import ConfigError
from dynshape_perception.parameters.limits import (
    BOUNDS,
    BOUNDS_PREFIX,
    CLUSTER,
    FRAMES,
    JIT,
    NEAR,
    OBJECTS,
    PIPELINE,
    STAGE,
    STAMPS,
    TRACKER,
)
from dynshape_perception.parameters.perception import PREDICTION
from dynshape_perception.paramspec import OFF, ParamSpec, Value, read, read_values
from dynshape_perception.perception.clustering import ClusterParams
from dynshape_perception.perception.localization import FRAMES_PREFIX, FrameParams, Mount
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.perception.pipeline import PipelineParams
from dynshape_perception.perception.prediction.settings import PredictionSettings
from dynshape_perception.perception.scan import SCAN_PREFIX, ScanCrop, ScanParams
from dynshape_perception.perception.stamps import StampPolicy
from dynshape_perception.perception.streaming import NearField
from dynshape_perception.perception.tracking import TrackerParams
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.scheduling.executor import ExecutorOptions
from dynshape_perception.scheduling.tiers import PREFIX as TIERS_PREFIX
from dynshape_perception.scheduling.tiers import TierConfig


def bounds_from(values: Mapping[str, Value]) -> Bounds:
    """The compiled bounds of config/models.yaml, lowered by the ``bounds.*`` values."""
    return read(Bounds, values, BOUNDS_PREFIX, BOUNDS)


def cluster_params(values: Mapping[str, Value], base: ClusterParams = CLUSTER) -> ClusterParams:
    return read(ClusterParams, values, "segmentation", base)


def tracker_params(values: Mapping[str, Value], base: TrackerParams = TRACKER) -> TrackerParams:
    return read(TrackerParams, values, "tracking", base)


def scan_crop(values: Mapping[str, Value]) -> ScanCrop:
    return read(ScanCrop, values, SCAN_PREFIX)


def scan_params(values: Mapping[str, Value]) -> ScanParams | None:
    """The crop of the lidar nodes (None where a node declares no ``scan.*``)."""
    if f"{SCAN_PREFIX}.min_range_m" not in values:
        return None
    return scan_crop(values).params()


def object_params(values: Mapping[str, Value]) -> ObjectParams:
    return read(ObjectParams, values, "objects", OBJECTS)


def frame_params(values: Mapping[str, Value]) -> FrameParams:
    mount = read(Mount, values, FRAMES_PREFIX)
    return replace(read(FrameParams, values, FRAMES_PREFIX, FRAMES), fallback_mount=mount)


def pipeline_params(values: Mapping[str, Value]) -> PipelineParams:
    extra = read_values(PipelineParams, values, "points")
    if "prediction.min_history_steps" in values:
        extra["min_history_steps"] = values["prediction.min_history_steps"]
    scan = scan_params(values)
    cluster = cluster_params(values)
    if scan is not None:
        cluster = replace(cluster, roi=scan.roi)
    return replace(
        PIPELINE,
        cluster=cluster,
        tracker=tracker_params(values),
        scan=scan,
        objects=object_params(values),
        **extra,
    )


def history_steps(values: Mapping[str, Value]) -> int:
    """History samples fed to the predictor: the parameter, else the fitted window."""
    bounds = bounds_from(values)
    steps = int(values.get("prediction.history_steps", OFF))
    return min(steps, bounds.T) if steps != OFF else predictor_history_steps(bounds)


def prediction_settings(values: Mapping[str, Value]) -> PredictionSettings:
    """The prediction stage's settings; the predictor's step comes from config/models.yaml."""
    bounds = bounds_from(values)
    picked: dict[str, Any] = {
        "history_steps": history_steps(values),
        "max_agents": bounds.A,
        "step_s": float(default_config().section("predictor").get("step_s", STAGE.step_s)),
    }
    picked.update(read_values(PredictionSettings, values, PREDICTION))
    return replace(STAGE, **picked)


def sectors_per_revolution(values: Mapping[str, Value]) -> int:
    return int(values.get("points.sectors_per_revolution", 1))


def jit_config(values: Mapping[str, Value]) -> JitConfig:
    return read(JitConfig, values, "jit", JIT)


def stamp_policy(values: Mapping[str, Value]) -> StampPolicy:
    return read(StampPolicy, values, "stamps", STAMPS)


def tier_config(values: Mapping[str, Value]) -> TierConfig:
    """The ``tiers.*`` values as one checked config (raises ConfigError with the reason)."""
    return read(TierConfig, values, TIERS_PREFIX)


def executor_options(values: Mapping[str, Value]) -> ExecutorOptions:
    return read(ExecutorOptions, values, "executor")


def near_field(values: Mapping[str, Value]) -> NearField:
    return read(NearField, values, "near_field", NEAR)


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


# Each prefix whose parameters are the fields of one core dataclass, and its reader; a field
# may name its own prefix (FrameParams.max_extrapolation_s is odometry.max_extrapolation_s).
DATACLASS_READERS: dict[str, tuple[type, Callable[[Mapping[str, Value]], Any]]] = {
    BOUNDS_PREFIX: (Bounds, bounds_from),
    "segmentation": (ClusterParams, cluster_params),
    "tracking": (TrackerParams, tracker_params),
    "objects": (ObjectParams, object_params),
    "stamps": (StampPolicy, stamp_policy),
    "near_field": (NearField, near_field),
    "jit": (JitConfig, jit_config),
    "executor": (ExecutorOptions, executor_options),
    "points": (PipelineParams, pipeline_params),
    FRAMES_PREFIX: (FrameParams, frame_params),
    SCAN_PREFIX: (ScanCrop, scan_crop),
    TIERS_PREFIX: (TierConfig, tier_config),
    PREDICTION: (PredictionSettings, prediction_settings),
}
# Parameters under one of those prefixes that are no field of its dataclass, and why.
NOT_IN_DATACLASS: dict[str, str] = {
    "jit.warm_up_shapes": "a shape log the node loads at start (optional_path)",
    "points.intensity_scale": "the node scales each cloud's intensity as it arrives",
    "points.sectors_per_revolution": "how the nodes gather sector clouds into a revolution "
    "(sectors_per_revolution)",
}
