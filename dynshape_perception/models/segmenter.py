"""Point stage: a per-point obstacle score from points [P, 4] and a ground plane."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from dynshape_perception.config import Bounds
from dynshape_perception.errors import ConfigError
from dynshape_perception.models import kernels_point_mlp, tir_kernels
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
from dynshape_perception.models.tir_kernels import FEATURES, GROUND_WIDTH, POINT_WIDTH


@dataclass(frozen=True)
class SegmenterConfig:
    hidden: tuple[int, int] = (64, 128)
    range_scale_m: float = 50.0
    height_scale_m: float = 3.0

    def __post_init__(self) -> None:
        if len(self.hidden) != 2 or min(self.hidden) < 1:
            raise ConfigError(f"segmenter hidden must be two positive widths, got {self.hidden}")
        if self.range_scale_m <= 0 or self.height_scale_m <= 0:
            raise ConfigError("segmenter scales must be positive")


class Segmenter(nn.Module):
    def __init__(self, config: SegmenterConfig, gpu: bool = False) -> None:
        h1, h2 = config.hidden
        self.config = config
        self.gpu = gpu
        self.l1 = Dense(FEATURES, h1)
        self.l2 = Dense(h1, h2)
        self.score = Dense(h2, 1)

    def forward(self, points: nn.Tensor, ground: nn.Tensor) -> nn.Tensor:
        if not self.gpu:
            return self._fused(points, ground)
        n = points.shape[0]
        feats = op.tensor_ir_op(
            tir_kernels.point_features_kernel(
                self.config.range_scale_m, self.config.height_scale_m
            ),
            "point_features",
            args=[points, ground],
            out=nn.Tensor.placeholder([n, FEATURES], "float32"),
        )
        f2 = op.relu(self.l2(op.relu(self.l1(feats))))
        return op.reshape(op.sigmoid(self.score(f2)), [n])

    def _fused(self, points: nn.Tensor, ground: nn.Tensor) -> nn.Tensor:
        """CPU: one kernel per tile of points, so no [P, hidden] tensor reaches memory."""
        cfg = self.config
        layers = (self.l1, self.l2, self.score)
        scores: nn.Tensor = op.tensor_ir_op(
            kernels_point_mlp.point_mlp_kernel(cfg.hidden, cfg.range_scale_m, cfg.height_scale_m),
            "point_mlp",
            args=[points, ground, *(p for layer in layers for p in (layer.weight, layer.bias))],
            out=nn.Tensor.placeholder([points.shape[0]], "float32"),
        )
        return scores


def reference(
    function: str,
    weights: Mapping[str, np.ndarray],
    inputs: list[np.ndarray],
    config: SegmenterConfig,
) -> list[np.ndarray]:
    """NumPy twin of ``Segmenter.forward``."""
    if function != "forward":
        raise KeyError(function)
    points, ground = inputs
    xyz = points[:, :3]
    feats = np.empty((points.shape[0], FEATURES), np.float32)
    feats[:, 0] = (xyz @ ground[:3] + ground[3]) / np.float32(config.height_scale_m)
    feats[:, 1] = np.sqrt(xyz[:, 0] ** 2 + xyz[:, 1] ** 2) / np.float32(config.range_scale_m)
    feats[:, 2] = xyz[:, 2] / np.float32(config.height_scale_m)
    feats[:, 3] = points[:, 3]
    f1 = relu(dense_ref(feats, weights, "l1"))
    f2 = relu(dense_ref(f1, weights, "l2"))
    return [sigmoid(dense_ref(f2, weights, "score"))[:, 0].astype(np.float32)]


# Point counts never repeat, so P is bucketed.
P_EDGES = (
    2048,
    4096,
    8192,
    12288,
    16384,
    20480,
    24576,
    32768,
    40960,
    49152,
    65536,
    81920,
    98304,
    114688,
    131072,
    150000,
)


def spec(bounds: Bounds) -> ModelSpec:
    return ModelSpec(
        model="segmenter",
        dims=("P",),
        bounds={"P": bounds.P},
        bucket_edges={"P": P_EDGES},
        functions=(
            FunctionSpec(
                "forward",
                (TensorSpec("points", ("P", POINT_WIDTH)), TensorSpec("ground", (GROUND_WIDTH,))),
                (("P",),),
            ),
        ),
    )


def definition(bounds: Bounds, config: SegmenterConfig | None = None) -> ModelDef:
    cfg = config or SegmenterConfig()
    return ModelDef(
        name="segmenter",
        version="2",
        build_module=lambda gpu: Segmenter(cfg, gpu),
        spec=spec(bounds),
        reference=lambda fn, w, x: reference(fn, w, x, cfg),
        config=cfg,
    )


MODEL = register(ModelKind("segmenter", SegmenterConfig, definition))
