"""What a replay takes from its parameters: pipeline, JIT, bounds, target and tier deadlines."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from dynshape_perception.config import Bounds, default_bounds
from dynshape_perception.perception.localization import FrameParams
from dynshape_perception.perception.pipeline import PipelineParams
from dynshape_perception.perception.prediction.settings import PredictionSettings
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.tools.replay.params import (
    DEFAULT_DEADLINES_MS,
    Value,
    deadlines_from,
    dump_params,
)

# Parameter groups that change what an in-process replay computes (markers, QoS and the
# like only matter to the nodes); the tier deadlines time its stages.
REPLAY_GROUPS = (
    "segmentation.",
    "tracking.",
    "prediction.",
    "points.",
    "bounds.",
    "scan.",
    "frames.",
    "objects.",
    "tiers.",
)


def is_replay_parameter(name: str) -> bool:
    return name.startswith(REPLAY_GROUPS)


@dataclass(frozen=True)
class ReplaySettings:
    """Everything a replay takes from its parameters; ``values`` are the parameters as given."""

    pipeline: PipelineParams = field(default_factory=PipelineParams)
    frames: FrameParams = field(default_factory=FrameParams)
    prediction: PredictionSettings = field(default_factory=PredictionSettings)
    # Point clouds per sensor revolution (1: whole scans, 0: detected from azimuth).
    sectors_per_revolution: int = 1
    jit: JitConfig = field(default_factory=lambda: JitConfig(mode="off"))
    bounds: Bounds = field(default_factory=default_bounds)
    target: str = "x86_64"
    deadlines_ms: dict[int, float | None] = field(
        default_factory=lambda: dict(DEFAULT_DEADLINES_MS)
    )
    values: dict[str, Value] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()


def settings_from_values(
    values: Mapping[str, Value], jit_mode: str | None = None, target: str | None = None
) -> ReplaySettings:
    """Replay settings from ROS parameters named as the nodes declare them.

    Tier deadlines come from the ``tiers.*`` parameters, read as the nodes read them;
    unknown names are reported, not fatal, so a node's full parameter file can be used as
    it is.
    """
    from dynshape_perception import parameters as node_params

    specs = node_params.all_specs()
    known = {name: value for name, value in values.items() if name in specs}
    for name, value in known.items():
        specs[name].check(value)
    ignored = tuple(sorted(n for n in values if n not in specs))
    jit = node_params.jit_config(known)
    mode = jit_mode or ("frozen" if jit.mode == "frozen" else "off")
    # A replay crops and transforms its scans as the lidar nodes do.
    lidar = {n: s.default for n, s in node_params.node_specs("perception_pipeline").items()}
    lidar.update(known)
    return ReplaySettings(
        pipeline=node_params.pipeline_params(lidar),
        frames=node_params.frame_params(lidar),
        prediction=node_params.prediction_settings(lidar),
        sectors_per_revolution=node_params.sectors_per_revolution(lidar),
        jit=replace(jit, mode=mode),
        bounds=node_params.bounds_from(known),
        target=target or str(known.get("target_profile", "x86_64")),
        deadlines_ms=deadlines_from(values),
        values=dict(values),
        ignored=ignored,
    )


def effective_values(settings: ReplaySettings) -> dict[str, Value]:
    """Every node parameter with the value this run used: defaults, then the given ones."""
    from dynshape_perception import parameters as node_params

    values: dict[str, Value] = {n: s.default for n, s in node_params.all_specs().items()}
    values.update(settings.values)
    values["jit.mode"] = settings.jit.mode
    values["target_profile"] = settings.target
    return values


def params_yaml(settings: ReplaySettings) -> str:
    return dump_params(effective_values(settings), comment="the parameters of this replay run")
