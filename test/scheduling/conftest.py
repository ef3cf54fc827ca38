"""Fixtures of the scheduling tests: TVM models with committed or deterministic initial weights."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import committed_weights, parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import JitConfig

MODELS = ("segmenter", "predictor")


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    # Equivalence does not depend on the weights, but a segmenter with random ones scores
    # too few obstacles in a scene for the streaming comparisons to show anything.
    weights = {n: init_weights(parameter_shapes(model_definition(n)), seed=0) for n in MODELS}
    weights["segmenter"] = committed_weights("segmenter")[1]
    with Engine("x86_64", JitConfig(mode="off"), models=MODELS, weights=weights) as eng:
        yield eng
