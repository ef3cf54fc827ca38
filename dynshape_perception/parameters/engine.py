"""Parameter groups of the runtime: models, JIT, I/O, tables, diagnostics, power, tiered
executor."""

from __future__ import annotations

from dataclasses import replace

from dynshape_perception.config import Bounds
from dynshape_perception.parameters.limits import (
    BOUNDS,
    BOUNDS_PREFIX,
    MAX_QOS_DEPTH,
    MAX_RATE_HZ,
    MAX_WINDOW,
)
from dynshape_perception.paramspec import MAX_STAMP_TOLERANCE_S, ParamSpec, declarations, declared
from dynshape_perception.perception.streaming import NearField
from dynshape_perception.runtime.cpu_latency import (
    DEFAULT_CPU_LATENCY_US,
    LEAVE,
    MAX_CPU_LATENCY_US,
)
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.scheduling.executor import ExecutorOptions
from dynshape_perception.scheduling.tiers import PREFIX as TIERS_PREFIX
from dynshape_perception.scheduling.tiers import TierConfig


def engine_group() -> tuple[ParamSpec, ...]:
    compiled = BOUNDS.as_dict()
    bounds = tuple(
        replace(
            spec,
            default=compiled[dim],
            high=compiled[dim],
            description=f"{spec.description}; at most the compiled bound {compiled[dim]} of "
            "config/models.yaml",
        )
        for dim, spec in zip(declarations(Bounds), declared(Bounds, BOUNDS_PREFIX), strict=True)
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


def jit_group() -> tuple[ParamSpec, ...]:
    return (
        *declared(JitConfig, "jit"),
        ParamSpec(
            "jit.warm_up_shapes",
            "",
            "recorded shape log (YAML) whose hot shapes compile at start; empty: none",
            read_only=True,
        ),
    )


def io_group() -> tuple[ParamSpec, ...]:
    return (
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
            read_only=True,
            low=1,
            high=MAX_QOS_DEPTH,
        ),
        ParamSpec(
            "qos.output_depth",
            10,
            "queue depth of the (reliable) publishers",
            read_only=True,
            low=1,
            high=MAX_QOS_DEPTH,
        ),
    )


def power_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "power.max_cpu_latency_us",
            DEFAULT_CPU_LATENCY_US,
            "while the node runs, idle cores sleep no deeper than a wake-up of this many µs "
            "(Linux CPU latency QoS, /dev/cpu_dma_latency; needs write access to it, else a "
            "warning): each hop between nodes wakes a core; 0 keeps idle cores polling, "
            "-1 leaves the kernel's choice",
            read_only=True,
            low=LEAVE,
            high=MAX_CPU_LATENCY_US,
        ),
    )


def tiers_group() -> tuple[ParamSpec, ...]:
    return declared(TierConfig, TIERS_PREFIX, "live; the tiers are checked together")


def executor_group() -> tuple[ParamSpec, ...]:
    return declared(ExecutorOptions, "executor")


def near_field_group() -> tuple[ParamSpec, ...]:
    return declared(NearField, "near_field")


def tables_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "debug.publish_tables",
            False,
            "also publish the PointCloud2 tables (near_obstacles, obstacles, tracks, "
            "predictions) laid out in docs/interfaces.md",
            read_only=True,
        ),
        ParamSpec(
            "debug.publish_processing_time",
            True,
            "publish each stage's time on ~/debug/processing_time_ms, ~/debug/cyclic_time_ms "
            "and ~/debug/processing_time/<stage>_ms, as Autoware's nodes do (docs/interfaces.md)",
        ),
    )


def diagnostics_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "diagnostics.min_rate_hz",
            5.0,
            "input and output topics below this rate (less diagnostics.rate_tolerance) are "
            "reported as WARN; no message in a window as ERROR",
            read_only=True,
            low=0.0,
            high=MAX_RATE_HZ,
        ),
        ParamSpec(
            "diagnostics.max_rate_hz",
            30.0,
            "input and output topics above this rate (plus diagnostics.rate_tolerance) are "
            "reported as WARN",
            read_only=True,
            low=0.0,
            high=MAX_RATE_HZ,
        ),
        ParamSpec(
            "diagnostics.rate_tolerance",
            0.1,
            "relative slack of the rate bounds",
            read_only=True,
            low=0.0,
            high=1.0,
        ),
        ParamSpec(
            "diagnostics.rate_window",
            5,
            "diagnostics periods the topic rates are measured over",
            read_only=True,
            low=1,
            high=MAX_WINDOW,
        ),
        ParamSpec(
            "diagnostics.max_stamp_delay_s",
            1.0,
            "a message stamped further than this before the node's clock is late (ERROR)",
            read_only=True,
            low=0.0,
            high=MAX_STAMP_TOLERANCE_S,
        ),
        ParamSpec(
            "diagnostics.min_stamp_delay_s",
            -0.1,
            "a message stamped further than -this ahead of the node's clock is early (ERROR)",
            read_only=True,
            low=-MAX_STAMP_TOLERANCE_S,
            high=0.0,
        ),
    )
