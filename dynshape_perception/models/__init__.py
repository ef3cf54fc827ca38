"""Relax ``nn.Module`` models with NumPy references: segmenter, associator, predictor."""

from __future__ import annotations

from dynshape_perception.config import ModelsConfig, default_config, integer, number
from dynshape_perception.errors import ConfigError
from dynshape_perception.models import associator, predictor, segmenter
from dynshape_perception.models.common import ModelDef

MODEL_NAMES = ("segmenter", "associator", "predictor")


def model_definition(name: str, config: ModelsConfig | None = None) -> ModelDef:
    """The definition of one model with shapes and bounds from ``config/models.yaml``."""
    cfg = config or default_config()
    if name == "segmenter":
        sec = cfg.section("segmenter")
        hidden = sec.get("hidden", [64, 128])
        if not isinstance(hidden, list) or len(hidden) != 2:
            raise ConfigError(f"models.yaml segmenter.hidden must be two widths, got {hidden!r}")
        return segmenter.definition(
            cfg.bounds,
            segmenter.SegmenterConfig(
                hidden=(
                    integer("segmenter.hidden", hidden[0]),
                    integer("segmenter.hidden", hidden[1]),
                )
            ),
        )
    if name == "associator":
        sec = cfg.section("associator")
        return associator.definition(
            cfg.bounds,
            associator.AssociatorConfig(
                features=integer("associator.features", sec.get("features", 8)),
                hidden=integer("associator.hidden", sec.get("hidden", 32)),
            ),
        )
    if name == "predictor":
        sec = cfg.section("predictor")
        return predictor.definition(
            cfg.bounds,
            predictor.PredictorConfig(
                hypotheses=integer("predictor.K", sec.get("K", 6)),
                horizon=integer("predictor.H", sec.get("H", 12)),
                step_s=number("predictor.step_s", sec.get("step_s", 0.4)),
                hidden=integer("predictor.hidden", sec.get("hidden", 32)),
            ),
        )
    raise KeyError(f"unknown model {name!r}; expected one of {', '.join(MODEL_NAMES)}")
