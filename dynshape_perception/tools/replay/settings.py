"""What a replay takes from its parameters: pipeline, JIT, bounds, target and tier deadlines."""

from __future__ import annotations

from dataclasses import dataclass, field

from dynshape_perception.config import Bounds, default_bounds
from dynshape_perception.perception.localization import FrameParams
from dynshape_perception.perception.pipeline import PipelineParams
from dynshape_perception.perception.prediction.stage import PredictionSettings
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.tools.replay.params import DEFAULT_DEADLINES_MS, Value, is_tier_parameter

# Parameter groups that change what an in-process replay computes (markers, QoS and the
# like only matter to the nodes), besides the tier deadlines.
REPLAY_GROUPS = (
    "segmentation.",
    "tracking.",
    "prediction.",
    "points.",
    "bounds.",
    "scan.",
    "frames.",
    "objects.",
)


def is_replay_parameter(name: str) -> bool:
    return name.startswith(REPLAY_GROUPS) or is_tier_parameter(name)


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
