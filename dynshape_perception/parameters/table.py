"""Every parameter group in the order of the documented table, and the groups each node declares."""

from __future__ import annotations

from dynshape_perception.parameters import engine, perception, sensing
from dynshape_perception.paramspec import ParamSpec

GROUPS: dict[str, tuple[ParamSpec, ...]] = {
    "engine": engine.engine_group(),
    "jit": engine.jit_group(),
    "io": engine.io_group(),
    "points": sensing.points_group(),
    "segmentation": perception.segmentation_group(),
    "odometry": sensing.odometry_group(),
    "stamps": sensing.stamps_group(),
    "tracking": perception.tracking_group(),
    "tracker_input": perception.tracker_input_group(),
    "prediction": perception.prediction_group(),
    "markers": perception.markers_group(),
    "tiers": engine.tiers_group(),
    "executor": engine.executor_group(),
    "near_field": engine.near_field_group(),
    "base_frame": sensing.base_frame_group(),
    "mount": sensing.mount_group(),
    "fixed_frame": sensing.fixed_frame_group(),
    "scan": sensing.scan_group(),
    "objects": perception.objects_group(),
    "tables": engine.tables_group(),
    "diagnostics": engine.diagnostics_group(),
    "power": engine.power_group(),
}

_TIERED = ("tiers", "executor", "near_field")
_COMMON = ("engine", "jit", "io", "diagnostics", "tables", "power")

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


def uses_executor(node: str) -> bool:
    """Whether ``node`` runs its work through the tiered executor (declares ``tiers.*``)."""
    return "tiers" in NODE_GROUPS[node]
