"""Parameter shapes and committed weights of each model, by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynshape_perception.models import model_definition
from dynshape_perception.models.common import ModelDef
from dynshape_perception.models.weights import load_weights


def parameter_shapes(model: ModelDef) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the ``nn.Module`` parameters, in export order."""
    module = model.build_module(False)
    return {name: tuple(int(d) for d in p.shape) for name, p in module.named_parameters()}


def committed_weights(
    name: str, directory: Path | None = None
) -> tuple[ModelDef, dict[str, np.ndarray]]:
    model = model_definition(name)
    return model, load_weights(name, parameter_shapes(model), directory)
