"""Fit the segmenter's score head on seeded ray-cast driving scenes with a RANSAC ground input."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from dynshape_perception.errors import ConfigError
from dynshape_perception.models.common import ModelDef
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.segmenter import SegmenterConfig
from dynshape_perception.models.weights import init_weights
from dynshape_perception.perception.ground import fit_ground_plane
from dynshape_perception.tools.fit.data import GENERATED_LICENCE, SYNTHETIC, Source
from dynshape_perception.tools.fit.schedule import train_binary_logit
from dynshape_perception.tools.fit.torch_env import configure
from dynshape_perception.tools.fit.torch_models import Segmenter, load_numpy, to_numpy
from dynshape_perception.tools.sim.scenes import driving_scene

log = logging.getLogger(__name__)

SOURCES = (SYNTHETIC,)


@dataclass(frozen=True)
class SegmenterFitConfig:
    """Hyperparameters of the segmenter fit; the defaults are the committed fit's."""

    scenes: int = 12
    steps: int = 2000
    batch_size: int = 4096
    learning_rate: float = 3e-3
    final_lr_share: float = 0.02
    # Object returns lower than this above the ground are labelled ground: a per-point model
    # cannot tell a bumper's lowest centimetres from a kerb or the road's camber, and the
    # clustering would only smear a footprint with them.
    min_obstacle_height_m: float = 0.25
    sensor_height_m: tuple[float, float] = (1.4, 2.2)
    max_slope: float = 0.04
    ground_noise_m: float = 0.03
    # Share of scenes whose intensities are replaced by uniform noise: reflectance differs
    # between sensors, so the score must rest on geometry.
    random_intensity_share: float = 0.5

    def __post_init__(self) -> None:
        if self.scenes < 1 or self.steps < 1 or self.batch_size < 1:
            raise ConfigError("scenes, steps and batch_size must be positive")
        if not (self.learning_rate > 0 and 0 < self.final_lr_share <= 1):
            raise ConfigError("learning_rate must be > 0 and final_lr_share in (0, 1]")
        if not 0 < self.sensor_height_m[0] <= self.sensor_height_m[1]:
            raise ConfigError(f"sensor_height_m must be 0 < lo <= hi, got {self.sensor_height_m}")
        if not 0 <= self.random_intensity_share <= 1:
            raise ConfigError("random_intensity_share must be in [0, 1]")


def training_points(seed: int, fit: SegmenterFitConfig) -> tuple[np.ndarray, np.ndarray, Source]:
    """Point features ``[P, 4]`` (as the model computes them) and obstacle labels ``[P]``."""
    rng = np.random.default_rng(seed)
    config = SegmenterConfig()
    feats, labels = [], []
    for index in range(fit.scenes):
        scene = driving_scene(
            seed=seed + index,
            sensor_height_m=float(rng.uniform(*fit.sensor_height_m)),
            max_slope=fit.max_slope,
            ground_noise_m=fit.ground_noise_m,
        )
        points = scene.points.copy()
        if rng.random() < fit.random_intensity_share:
            points[:, 3] = rng.random(points.shape[0], dtype=np.float32)
        true_height = points[:, :3].astype(np.float64) @ scene.ground_plane[:3]
        true_height += scene.ground_plane[3]
        labels.append(scene.is_obstacle & (true_height > fit.min_obstacle_height_m))
        # The model sees the plane RANSAC finds at run time, not the scene's true one.
        ground = fit_ground_plane(points, seed=seed + index).as_array()
        feats.append(_features(points, ground, config))
    stacked = np.concatenate(feats)
    source = Source(
        name=SYNTHETIC,
        kind="generated ray-cast driving scenes (tools.sim.scenes.driving_scene)",
        licence=GENERATED_LICENCE,
        detail=f"seeds {seed}..{seed + fit.scenes - 1}, {stacked.shape[0]} points",
    )
    return stacked, np.concatenate(labels), source


def _features(points: np.ndarray, ground: np.ndarray, config: SegmenterConfig) -> np.ndarray:
    net = Segmenter(config)
    with torch.no_grad():
        return net.features(torch.from_numpy(points), torch.from_numpy(ground)).numpy()


def fit_segmenter(
    model: ModelDef, sources: tuple[str, ...], seed: int, fit: SegmenterFitConfig | None = None
) -> tuple[dict[str, np.ndarray], list[Source], dict[str, float]]:
    """Fitted weights, the data's provenance, and fit statistics."""
    fit = fit or SegmenterFitConfig()
    if sources != SOURCES:
        raise ConfigError(f"the segmenter fits on {', '.join(SOURCES)} only, got {sources}")
    configure(torch, seed)
    feats_np, labels_np, source = training_points(seed, fit)
    feats = torch.from_numpy(feats_np)
    labels = torch.from_numpy(labels_np.astype(np.float32))
    net = Segmenter(model.config)
    load_numpy(net, init_weights(parameter_shapes(model), seed))
    loss_value = train_binary_logit("segmenter", net, net.parameters(), feats, labels, fit, seed)
    with torch.no_grad():
        predicted = net.logit(feats) > 0
    accuracy = float((predicted == labels.bool()).float().mean())
    stats = {
        "points": float(feats.shape[0]),
        "obstacle_share": round(float(labels.mean()), 6),
        "final_loss": round(loss_value, 6),
        "train_accuracy": round(accuracy, 6),
    }
    return to_numpy(net), [source], stats
