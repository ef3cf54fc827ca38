"""Fit the associator on detection-track pairs drawn from seeded driving scenes."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from dynshape_perception.errors import ConfigError
from dynshape_perception.models.common import ModelDef
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.perception.features import obstacle_features
from dynshape_perception.tools.fit.data import GENERATED_LICENCE, SYNTHETIC, Source
from dynshape_perception.tools.fit.schedule import train_binary_logit
from dynshape_perception.tools.fit.torch_env import configure
from dynshape_perception.tools.fit.torch_models import Associator, load_numpy, to_numpy
from dynshape_perception.tools.sim.scenes import driving_scene

log = logging.getLogger(__name__)

SOURCES = (SYNTHETIC,)
# Seeds of the held-out scenes start this far from the training seeds.
VALIDATION_SEED_OFFSET = 10_000
COARSE_AZIMUTH_STEP_DEG = 5.0


@dataclass(frozen=True)
class AssociatorFitConfig:
    """Hyperparameters of the associator fit and of its pair generator (metres, radians)."""

    scenes: int = 24
    pairs_per_scene: int = 4000
    steps: int = 2000
    batch_size: int = 1024
    learning_rate: float = 3e-3
    final_lr_share: float = 0.02
    # Error of a track's predicted centre against the next detection of the same object.
    position_error_m: tuple[float, float] = (0.05, 0.6)
    height_error_m: float = 0.05
    # A cluster sees only part of an object: each side of a box shrinks by up to this share.
    visible_share: tuple[float, float] = (0.5, 1.0)
    # The top of an object is missed at range: heights shrink by up to this share.
    height_share: float = 0.8
    yaw_error_rad: float = 0.1
    # A near-square footprint swaps length and width now and then, turning yaw by pi/2.
    yaw_flip_share: float = 0.1
    # Other objects are placed at least side by side, at most this far from the detection.
    negative_max_distance_m: float = 4.0

    def __post_init__(self) -> None:
        if min(self.scenes, self.pairs_per_scene, self.steps, self.batch_size) < 1:
            raise ConfigError("scenes, pairs_per_scene, steps and batch_size must be positive")
        if not (self.learning_rate > 0 and 0 < self.final_lr_share <= 1):
            raise ConfigError("learning_rate must be > 0 and final_lr_share in (0, 1]")
        if not 0 < self.visible_share[0] <= self.visible_share[1] <= 1:
            raise ConfigError(f"visible_share must be 0 < lo <= hi <= 1, got {self.visible_share}")
        if not 0 <= self.yaw_flip_share <= 1 or self.negative_max_distance_m <= 0:
            raise ConfigError("yaw_flip_share must be in [0, 1], negative_max_distance_m > 0")


def _observe(rng: np.random.Generator, boxes: np.ndarray, fit: AssociatorFitConfig) -> np.ndarray:
    """One noisy, partial observation of each box: what clustering reports for it."""
    seen = boxes.copy()
    n = seen.shape[0]
    shrink = rng.uniform(*fit.visible_share, (n, 2))
    seen["length"] = boxes["length"] * shrink[:, 0]
    seen["width"] = boxes["width"] * shrink[:, 1]
    seen["height"] = boxes["height"] * rng.uniform(fit.height_share, 1.0, n)
    yaw = boxes["yaw"] + rng.normal(0.0, fit.yaw_error_rad, n)
    flip = rng.random(n) < fit.yaw_flip_share
    yaw = np.where(flip, yaw + np.pi / 2, yaw)
    seen["length"], seen["width"] = (
        np.where(flip, seen["width"], seen["length"]),
        np.where(flip, seen["length"], seen["width"]),
    )
    seen["yaw"] = np.angle(np.exp(1j * yaw))
    seen["z"] = boxes["z"] + rng.normal(0.0, fit.height_error_m, n)
    return seen


def scene_pairs(seed: int, fit: AssociatorFitConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Detection features ``[Q, 8]``, track features ``[Q, 8]`` and same-object labels ``[Q]``."""
    rng = np.random.default_rng(seed)
    # Boxes are placed before any ray is cast; a coarse scan keeps the generation cheap.
    boxes = driving_scene(seed=seed, azimuth_step_deg=COARSE_AZIMUTH_STEP_DEG).boxes
    count = fit.pairs_per_scene
    det_idx = rng.integers(0, boxes.shape[0], count)
    positive = rng.random(count) < 0.5
    other = (det_idx + rng.integers(1, boxes.shape[0], count)) % boxes.shape[0]
    trk_idx = np.where(positive, det_idx, other)
    det = _observe(rng, boxes[det_idx], fit)
    trk = _observe(rng, boxes[trk_idx], fit)
    err = rng.uniform(*fit.position_error_m, count)
    bearing = rng.uniform(-np.pi, np.pi, count)
    # A different object stands beside the detected one or farther, never inside it.
    beside = 0.5 * (boxes["width"][det_idx] + boxes["width"][trk_idx])
    distance = np.where(
        positive,
        np.abs(rng.normal(0.0, 1.0, count)) * err,
        rng.uniform(beside, np.maximum(beside, fit.negative_max_distance_m)),
    )
    trk["x"] = det["x"] + distance * np.cos(bearing)
    trk["y"] = det["y"] + distance * np.sin(bearing)
    return obstacle_features(det), obstacle_features(trk), positive


def training_pairs(
    seed: int, fit: AssociatorFitConfig, first_scene: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """|det - trk| features ``[Q, 8]`` and labels ``[Q]`` over ``fit.scenes`` scenes."""
    diffs, labels = [], []
    for index in range(fit.scenes):
        det, trk, same = scene_pairs(seed + first_scene + index, fit)
        diffs.append(np.abs(det - trk))
        labels.append(same)
    return np.concatenate(diffs), np.concatenate(labels)


def fit_associator(
    model: ModelDef, sources: tuple[str, ...], seed: int, fit: AssociatorFitConfig | None = None
) -> tuple[dict[str, np.ndarray], list[Source], dict[str, float]]:
    """Fitted weights, the data's provenance, and fit and held-out statistics."""
    fit = fit or AssociatorFitConfig()
    if sources != SOURCES:
        raise ConfigError(f"the associator fits on {', '.join(SOURCES)} only, got {sources}")
    configure(torch, seed)
    diffs_np, labels_np = training_pairs(seed, fit)
    diffs = torch.from_numpy(diffs_np)
    labels = torch.from_numpy(labels_np.astype(np.float32))
    net = Associator(model.config)
    load_numpy(net, init_weights(parameter_shapes(model), seed))
    loss_value = train_binary_logit("associator", net, net.parameters(), diffs, labels, fit, seed)
    held_diffs, held_labels = training_pairs(seed, fit, first_scene=VALIDATION_SEED_OFFSET)
    with torch.no_grad():
        held = net.logit(torch.from_numpy(held_diffs)).numpy() > 0
    stats = {
        "pairs": float(diffs.shape[0]),
        "final_loss": round(loss_value, 6),
        "heldout_accuracy": round(float((held == held_labels).mean()), 6),
    }
    source = Source(
        name=SYNTHETIC,
        kind="detection-track pairs from generated driving scenes (tools.sim.scenes.driving_scene)",
        licence=GENERATED_LICENCE,
        detail=f"seeds {seed}..{seed + fit.scenes - 1}, {diffs.shape[0]} pairs; held out: "
        f"seeds from {seed + VALIDATION_SEED_OFFSET}",
    )
    return to_numpy(net), [source], stats
