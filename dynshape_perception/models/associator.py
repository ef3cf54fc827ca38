"""Association stage: a learned affinity [N, M] between detections [N, F] and tracks [M, F]."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from dynshape_perception.config import Bounds
from dynshape_perception.errors import ConfigError
from dynshape_perception.models.common import (
    Dense,
    FunctionSpec,
    ModelDef,
    ModelSpec,
    TensorSpec,
    dense_ref,
    relu,
    sigmoid,
)
from dynshape_perception.models.registry import ModelKind, register


@dataclass(frozen=True)
class AssociatorConfig:
    features: int = 8
    hidden: int = 32

    def __post_init__(self) -> None:
        if self.features < 1 or self.hidden < 1:
            raise ConfigError("associator features and hidden must be positive")


class Associator(nn.Module):
    def __init__(self, config: AssociatorConfig) -> None:
        self.config = config
        self.l1 = Dense(config.features, config.hidden)
        self.l2 = Dense(config.hidden, 1)

    def forward(self, detections: nn.Tensor, tracks: nn.Tensor) -> nn.Tensor:
        n, m = detections.shape[0], tracks.shape[0]
        f = self.config.features
        diff = op.subtract(op.reshape(detections, [n, 1, f]), op.reshape(tracks, [1, m, f]))
        # |d| as max(d, -d): the affinity must not depend on which side is the detection.
        absdiff = op.maximum(diff, op.negative(diff))
        # Pairs flattened to rows keep every matmul two-dimensional for the dense schedule.
        hidden = op.relu(self.l1(op.reshape(absdiff, [n * m, f])))
        return op.reshape(op.sigmoid(self.l2(hidden)), [n, m])


def reference(
    function: str, weights: Mapping[str, np.ndarray], inputs: list[np.ndarray]
) -> list[np.ndarray]:
    """NumPy twin of ``Associator.forward``."""
    if function != "forward":
        raise KeyError(function)
    det, trk = inputs
    absdiff = np.abs(det[:, None, :] - trk[None, :, :])
    hidden = relu(dense_ref(absdiff, weights, "l1"))
    return [sigmoid(dense_ref(hidden, weights, "l2"))[..., 0].astype(np.float32)]


def spec(bounds: Bounds, config: AssociatorConfig) -> ModelSpec:
    f = config.features
    return ModelSpec(
        model="associator",
        dims=("N", "M"),
        bounds={"N": bounds.N, "M": bounds.M},
        functions=(
            FunctionSpec(
                "forward",
                (TensorSpec("detections", ("N", f)), TensorSpec("tracks", ("M", f))),
                (("N", "M"),),
            ),
        ),
    )


def definition(bounds: Bounds, config: AssociatorConfig | None = None) -> ModelDef:
    cfg = config or AssociatorConfig()
    return ModelDef(
        name="associator",
        version="1",
        build_module=lambda gpu: Associator(cfg),
        spec=spec(bounds, cfg),
        reference=reference,
        config=cfg,
    )


MODEL = register(ModelKind("associator", AssociatorConfig, definition))
