"""Relax ``nn.Module`` models with NumPy references: segmenter, associator, predictor."""

from __future__ import annotations

from dynshape_perception.config import ModelsConfig, default_config
from dynshape_perception.models import associator, predictor, segmenter
from dynshape_perception.models.common import ModelDef

MODEL_NAMES = ("segmenter", "associator", "predictor")


def model_definition(name: str, config: ModelsConfig | None = None) -> ModelDef:
    """The definition of one model with shapes and bounds from ``config/models.yaml``."""
    cfg = config or default_config()
    if name == "segmenter":
        sec = cfg.section("segmenter")
        return segmenter.definition(
            cfg.bounds,
            segmenter.SegmenterConfig(hidden=tuple(sec.get("hidden", (64, 128, 256)))),  # type: ignore[arg-type]
        )
    if name == "associator":
        sec = cfg.section("associator")
        return associator.definition(
            cfg.bounds,
            associator.AssociatorConfig(
                features=int(sec.get("features", 8)), hidden=int(sec.get("hidden", 32))
            ),
        )
    if name == "predictor":
        sec = cfg.section("predictor")
        return predictor.definition(
            cfg.bounds,
            predictor.PredictorConfig(
                hypotheses=int(sec.get("K", 6)),
                horizon=int(sec.get("H", 12)),
                step_s=float(sec.get("step_s", 0.4)),
                hidden=int(sec.get("hidden", 32)),
            ),
        )
    raise KeyError(f"unknown model {name!r}; expected one of {', '.join(MODEL_NAMES)}")
