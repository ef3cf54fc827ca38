"""Relax ``nn.Module`` models with NumPy references: segmenter, associator, predictor."""

from __future__ import annotations

from dynshape_perception.models import associator, predictor, segmenter
from dynshape_perception.models.registry import model_definition

# Each module registers its model on import. This is the pipeline's order: where a command
# runs every model, it runs them in it.
MODEL_NAMES = tuple(m.MODEL.name for m in (segmenter, associator, predictor))

__all__ = ["MODEL_NAMES", "model_definition"]
