"""Fit the predictor: winner-takes-all over the learned modes, confidences, a calibrated gate."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from dynshape_perception.errors import ConfigError, DataError
from dynshape_perception.models.common import ModelDef
from dynshape_perception.models.predictor import PredictorConfig
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.tools.eval.prediction import OBS_STEPS, PRED_STEPS
from dynshape_perception.tools.fit.data import (
    ETH_UCY_SCENES,
    GENERATED_LICENCE,
    SYNTHETIC,
    GeneratedFamilies,
    Source,
    SyntheticPedestrians,
    Windows,
    eth_ucy_windows,
    family_windows,
    synthetic_windows,
)
from dynshape_perception.tools.fit.schedule import adam, cosine_share, set_learning_rate
from dynshape_perception.tools.fit.torch_env import configure
from dynshape_perception.tools.fit.torch_models import (
    Predictor,
    exact_sqrt,
    load_numpy,
    to_numpy,
    top_learned,
)
from dynshape_perception.tools.sim.crowds import FAMILIES

log = logging.getLogger(__name__)

SOURCES = tuple(sorted((*ETH_UCY_SCENES, *FAMILIES, SYNTHETIC)))
# A distance's gradient is undefined at zero; this floor under its square keeps it finite.
_DISTANCE_EPS = 1e-6


@dataclass(frozen=True)
class PredictorFitConfig:
    """Hyperparameters of the predictor fit; the defaults are the committed fit's.

    Values were chosen by leave-one-out (fit without a part, score the part left out),
    taking the worst part; ``steps`` and the calibration fits keep one fit to minutes on
    one core. 2,000 steps left the densest family, held out, at a spread of x0.874 of CV-6;
    4,000 bring it under x0.85; 6,000 gain little more there and lose on ETH held out.
    """

    steps: int = 4000
    batch_size: int = 256
    learning_rate: float = 3e-3
    final_lr_share: float = 0.02
    # Weight of the final-step error beside the average error, in the winner's loss.
    fde_weight: float = 0.5
    classification_weight: float = 0.5
    # Above 0, mode 1 also regresses on every window with this weight, not only where it
    # wins: a central estimate, at the cost of one hypothesis that no longer spreads.
    anchor_weight: float = 0.0
    # Above 0, the top learned mode (highest confidence, per window) also regresses on every
    # window with this weight: the mode the gate may rank first leans to a central estimate
    # (the history's smoothed motion, a gain over the raw last step), while which mode that
    # is changes with the window, so no one hypothesis gives up its spread.
    top_anchor_weight: float = 0.15
    # The gate learns whether the top learned mode (highest confidence) beats constant
    # velocity by this share of its ADE (a clear gain); its logit is then scaled and shifted
    # (Platt) to the out-of-fold outcomes of fits that left out a share of the sources, so
    # that it opens only where a gain held on data the fit did not see.
    gate_weight: float = 0.5
    gate_margin: float = 0.05
    calibration_folds: int = 2
    calibration_steps: int = 800
    calibration_windows: int = 4000
    # The confidence head learns softmax(-cost / T) over the learned modes, not the winner
    # alone: a near miss is no failure, and the top mode leans towards the one that is close
    # most often.
    confidence_temperature: float = 0.3
    # Share of the regression loss spread over the losers at the start, annealed to 0, so
    # that no hypothesis is starved before it finds its mode.
    relax_start: float = 0.05
    relax_steps: int = 1000
    # Where constant velocity (mode 0, fixed) is within cv_margin of the best learned mode's
    # cost, the learned winner's pull keeps a weight annealed from 1 to cv_cover_weight over
    # cv_cover_steps: early on no learned mode is starved, later the learned modes spend
    # their spread on the windows CV does not cover, which is what the min over K rewards.
    cv_cover_weight: float = 0.3
    cv_cover_steps: int = 1000
    cv_margin: float = 0.0
    scale_range: tuple[float, float] = (0.4, 2.5)
    real_share: float = 0.4
    # Share of windows played backwards: walking reversed is walking, and starts become stops.
    reverse_share: float = 0.5
    # Share of windows given fresh annotation noise (per window up to extra_noise_m, metres)
    # after the speed scaling: annotators' error is in metres of the world, whatever the
    # pace, while scaling a track scales its noise too, so slowed tracks would be cleaner
    # than any slow crowd's annotations.
    extra_noise_share: float = 0.5
    extra_noise_m: float = 0.04
    # The weights written are an exponential moving average over the last few hundred steps,
    # which smooths the noise of the final minibatches.
    ema_decay: float = 0.998
    # Histories of 2 to max_history steps: a batch holds up to OBS_STEPS steps, or up to
    # max_history for long_share of the batches (cheaper than every batch at full length);
    # short_share of the windows are cut to a random shorter history.
    max_history: int = 32
    long_share: float = 0.25
    short_share: float = 0.25
    synthetic: SyntheticPedestrians = field(default_factory=SyntheticPedestrians)
    families: GeneratedFamilies = field(default_factory=GeneratedFamilies)

    def __post_init__(self) -> None:
        if min(self.steps, self.batch_size, self.relax_steps, self.cv_cover_steps) < 1:
            raise ConfigError("steps, batch_size, relax_steps and cv_cover_steps must be positive")
        if not 0 <= self.cv_cover_weight <= 1 or self.cv_margin < 0:
            raise ConfigError("cv_cover_weight must be in [0, 1] and cv_margin >= 0")
        if not (self.learning_rate > 0 and 0 < self.final_lr_share <= 1):
            raise ConfigError("learning_rate must be > 0 and final_lr_share in (0, 1]")
        if not 0 < self.scale_range[0] <= self.scale_range[1]:
            raise ConfigError(f"scale_range must be 0 < lo <= hi, got {self.scale_range}")
        shares = (
            self.real_share,
            self.reverse_share,
            self.ema_decay,
            self.short_share,
            self.long_share,
        )
        if not all(0 <= share <= 1 for share in shares) or not 0 <= self.relax_start < 1:
            raise ConfigError(
                "real_share, reverse_share, ema_decay, short_share and long_share must be in "
                "[0, 1], relax_start in [0, 1)"
            )
        if self.max_history < OBS_STEPS:
            raise ConfigError(f"max_history must be >= {OBS_STEPS}, got {self.max_history}")
        weights = (
            self.anchor_weight,
            self.top_anchor_weight,
            self.confidence_temperature,
            self.gate_weight,
            self.extra_noise_m,
        )
        if min(weights) < 0 or not 0 <= self.extra_noise_share <= 1:
            raise ConfigError(
                "anchor_weight, top_anchor_weight, confidence_temperature, gate_weight and "
                "extra_noise_m must be >= 0, extra_noise_share in [0, 1]"
            )
        if self.calibration_folds < 0 or self.calibration_folds == 1:
            raise ConfigError("calibration_folds must be 0 (no calibration) or >= 2")
        if self.calibration_steps < 1 or self.calibration_windows < 1:
            raise ConfigError("calibration_steps and calibration_windows must be positive")


@dataclass(frozen=True)
class TrainingSet:
    """Each source's windows by name, which of them are real, and their provenance."""

    parts: dict[str, Windows]
    real_names: tuple[str, ...]
    sources: list[Source]
    history: int

    def pools(self, names: tuple[str, ...]) -> tuple[Windows, Windows]:
        """The real and the generated windows of ``names``."""
        real = [self.parts[n] for n in names if n in self.real_names]
        generated = [self.parts[n] for n in names if n not in self.real_names]
        return (
            Windows.concat(real, self.history, PRED_STEPS),
            Windows.concat(generated, self.history, PRED_STEPS),
        )


def training_windows(
    sources: tuple[str, ...],
    seed: int,
    fit: PredictorFitConfig,
    data_dir: Path | None = None,
    scene_files: Mapping[str, Path] | None = None,
) -> TrainingSet:
    """The real and generated windows of the named sources.

    A real source is looked up in ``scene_files`` (name -> file) first, then among the
    shared ETH/UCY scenes.
    """
    parts: dict[str, Windows] = {}
    real, used = [], []
    history = fit.max_history
    for name in sources:
        if name == SYNTHETIC:
            walkers, walker_detail = synthetic_windows(seed, fit.synthetic, history)
            parts[name] = walkers
            used.append(
                Source(
                    name=SYNTHETIC,
                    kind="generated pedestrians (tools.sim.scenes.pedestrian_scene with "
                    "arrivals and idlers)",
                    licence=GENERATED_LICENCE,
                    detail=walker_detail,
                )
            )
        elif name in FAMILIES:
            parts[name], source = family_windows(name, seed, fit.families, history)
            used.append(source)
        else:
            path = (scene_files or {}).get(name)
            parts[name], source = eth_ucy_windows(name, history, data_dir, path)
            real.append(name)
            used.append(source)
    if sum(part.count for part in parts.values()) == 0:
        names = ", ".join(sources)
        raise DataError(f"no track windows of {PRED_STEPS + 2} steps in {names}: nothing to fit on")
    return TrainingSet(parts, tuple(real), used, history)


def _sample(
    real: tuple[Tensor, Tensor],
    generated: tuple[Tensor, Tensor],
    fit: PredictorFitConfig,
    gen: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """One batch of windows and lengths, ``real_share`` of them real where both kinds exist."""
    if real[0].shape[0] == 0 or generated[0].shape[0] == 0:
        pool = real if real[0].shape[0] else generated
        pick = torch.randint(pool[0].shape[0], (fit.batch_size,), generator=gen)
        return pool[0][pick], pool[1][pick]
    num_real = round(fit.real_share * fit.batch_size)
    pick_real = torch.randint(real[0].shape[0], (num_real,), generator=gen)
    pick_gen = torch.randint(generated[0].shape[0], (fit.batch_size - num_real,), generator=gen)
    return (
        torch.cat([real[0][pick_real], generated[0][pick_gen]]),
        torch.cat([real[1][pick_real], generated[1][pick_gen]]),
    )


def _reverse(positions: Tensor, lengths: Tensor, chosen: Tensor, horizon: int) -> Tensor:
    """The ``chosen`` windows played backwards: their observed span reversed in place, the
    rows before it repeating its new first point."""
    span = positions.shape[1]
    start = span - horizon - lengths
    column = torch.arange(span)[None, :]
    backwards = start[:, None] + (span - 1 - column)
    backwards = torch.where(column >= start[:, None], backwards, span - 1)
    index = torch.where(chosen[:, None], backwards, column.expand(positions.shape[0], -1))
    return torch.gather(positions, 1, index[..., None].expand(-1, -1, 2))


def augment(
    positions: Tensor, lengths: Tensor, fit: PredictorFitConfig, cap: int, gen: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Histories ``[B, L, 2]`` (left-aligned, L the longest), lengths ``[B]`` and futures
    ``[B, PRED_STEPS, 2]`` of a batch: played backwards at random, cut to at most ``cap``
    steps (``short_share`` of them shorter still, down to 2), centred on the last observed
    point, then rotated, mirrored and scaled in speed at random."""
    n, span = positions.shape[0], positions.shape[1]
    horizon = PRED_STEPS
    reverse = torch.rand(n, generator=gen) < fit.reverse_share
    positions = _reverse(positions, lengths, reverse, horizon)
    longest = torch.clamp(lengths, max=cap)
    cut = 2 + (torch.rand(n, generator=gen, dtype=torch.float64) * (longest - 1)).long()
    short = torch.rand(n, generator=gen) < fit.short_share
    kept = torch.where(short, torch.minimum(cut, longest), longest)
    last = span - horizon - 1
    centred = positions - positions[:, last : last + 1]
    angle = torch.rand(n, generator=gen, dtype=positions.dtype) * (2 * math.pi)
    lo, hi = math.log(fit.scale_range[0]), math.log(fit.scale_range[1])
    scale = torch.exp(lo + (hi - lo) * torch.rand(n, generator=gen, dtype=positions.dtype))
    mirror = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).to(positions.dtype)
    cos, sin = torch.cos(angle) * scale, torch.sin(angle) * scale
    x, y = centred[..., 0], centred[..., 1] * mirror[:, None]
    moved = torch.stack(
        [cos[:, None] * x - sin[:, None] * y, sin[:, None] * x + cos[:, None] * y], dim=-1
    )
    if fit.extra_noise_share > 0:
        noisy = torch.rand(n, generator=gen) < fit.extra_noise_share
        sigma = torch.rand(n, generator=gen, dtype=moved.dtype) * fit.extra_noise_m
        noise = torch.randn(moved.shape, generator=gen, dtype=moved.dtype)
        moved = moved + noise * torch.where(noisy, sigma, 0.0)[:, None, None]
    width = int(kept.max())
    rows = (last + 1 - kept)[:, None] + torch.arange(width)[None, :]
    rows = torch.clamp(rows, max=last)
    history = torch.gather(moved, 1, rows[..., None].expand(-1, -1, 2))
    future = moved[:, last + 1 :]
    return history.to(torch.float32), kept.to(torch.int32), future.to(torch.float32)


CENTRAL = 1


def gate_labels(traj: Tensor, fut: Tensor, margin: float, top: Tensor) -> Tensor:
    """1 where the ADE of mode ``top`` (per window) is below constant velocity's (mode 0) by
    ``margin`` of it."""
    rows = torch.arange(traj.shape[0])
    pair = torch.stack([traj[rows, 0], traj[rows, top]], dim=1)
    ade = exact_sqrt(((pair - fut[:, None]) ** 2).sum(-1) + _DISTANCE_EPS).mean(-1)
    return (ade[:, 1] < (1.0 - margin) * ade[:, 0]).to(traj.dtype)


def wta_loss(
    traj: Tensor,
    logits: Tensor,
    fut: Tensor,
    fit: PredictorFitConfig,
    relax: float,
    gate: Tensor | None = None,
    cover: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Winner-takes-all regression over the learned modes (and a central mode's regression
    where ``anchor_weight`` > 0, the top learned mode's where ``top_anchor_weight`` > 0), the
    confidence head's cross-entropy over the learned modes against soft targets, and the
    gate's cross-entropy against whether the top learned mode beats constant velocity;
    returns (loss, winner)."""
    err = exact_sqrt(((traj - fut[:, None]) ** 2).sum(-1) + _DISTANCE_EPS)
    cost = err.mean(-1) + fit.fde_weight * err[..., -1]
    k = cost.shape[1]
    # Mode 0 (constant velocity, fixed) takes no part in the competition: where it won, no
    # learned mode would be pulled, and early on it wins nearly everywhere.
    first = 1 if k > 2 else 0
    winner = cost.detach()[:, first:].argmin(dim=1) + first
    weights = torch.full_like(cost, relax / max(k - first - 1, 1))
    weights[:, :first] = 0.0
    weights.scatter_(1, winner[:, None], 1.0 - relax if k - first > 1 else 1.0)
    if first and cover < 1.0:
        best = cost.detach().gather(1, winner[:, None])[:, 0]
        covered = cost.detach()[:, 0] <= (1.0 + fit.cv_margin) * best
        weights = weights * torch.where(covered, cover, 1.0)[:, None]
    central = CENTRAL if k > 1 else 0
    regression = (weights * cost).sum(1).mean() + fit.anchor_weight * cost[:, central].mean()
    if fit.top_anchor_weight > 0 and k > 2:
        top = top_learned(logits.detach())
        regression = regression + fit.top_anchor_weight * cost.gather(1, top[:, None]).mean()
    # Mode 0's logit takes no part: the gate alone ranks constant velocity.
    learned = logits[:, first:]
    if fit.confidence_temperature > 0:
        target = torch.softmax(-cost.detach()[:, first:] / fit.confidence_temperature, dim=1)
        classification = torch.nn.functional.cross_entropy(learned, target)
    else:
        classification = torch.nn.functional.cross_entropy(learned, winner - first)
    loss = regression + fit.classification_weight * classification
    if gate is not None and k > 1:
        top = top_learned(logits.detach())
        labels = gate_labels(traj.detach(), fut, fit.gate_margin, top)
        bce = torch.nn.functional.binary_cross_entropy_with_logits(gate, labels)
        loss = loss + fit.gate_weight * bce
    return loss, winner


def _train(
    model: ModelDef,
    pools: tuple[Windows, Windows],
    seed: int,
    fit: PredictorFitConfig,
    steps: int,
) -> Predictor:
    """The twin fitted on the real and generated pools for ``steps`` steps (EMA weights)."""
    cfg: PredictorConfig = model.config
    real = (torch.from_numpy(pools[0].positions), torch.from_numpy(pools[0].lengths))
    generated = (torch.from_numpy(pools[1].positions), torch.from_numpy(pools[1].lengths))
    net = Predictor(cfg)
    load_numpy(net, init_weights(parameter_shapes(model), seed))
    opt = adam(net.parameters(), fit.learning_rate)
    gen = torch.Generator().manual_seed(seed)
    ema = [p.detach().clone() for p in net.parameters()]
    loss_value = float("nan")
    for step in range(steps):
        share = cosine_share(step, steps, fit.final_lr_share)
        set_learning_rate(opt, fit.learning_rate * share)
        relax = fit.relax_start * max(0.0, 1.0 - step / fit.relax_steps)
        cover = 1.0 - (1.0 - fit.cv_cover_weight) * min(1.0, step / fit.cv_cover_steps)
        positions, lengths = _sample(real, generated, fit, gen)
        cap = fit.max_history if float(torch.rand(1, generator=gen)) < fit.long_share else OBS_STEPS
        history, kept, fut = augment(positions, lengths, fit, cap, gen)
        traj, logits, gate = net.decode(*net.encode(history, kept))
        loss, _ = wta_loss(traj, logits, fut, fit, relax, gate, cover)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for avg, param in zip(ema, net.parameters(), strict=True):
                avg.mul_(fit.ema_decay).add_(param.detach(), alpha=1.0 - fit.ema_decay)
        loss_value = float(loss.detach())
        if step % 500 == 0 or step == steps - 1:
            log.info("predictor step %d/%d loss %.4f", step, steps, loss_value)
    with torch.no_grad():
        for avg, param in zip(ema, net.parameters(), strict=True):
            param.copy_(avg)
    net.final_loss = loss_value
    return net


def protocol_cut(windows: Windows, count: int, seed: int) -> tuple[Tensor, Tensor]:
    """Up to ``count`` seeded windows with ``OBS_STEPS`` observed steps: histories
    ``[W, OBS_STEPS, 2]`` centred on the last observation, and futures."""
    span = windows.positions.shape[1]
    full = np.flatnonzero(windows.lengths >= OBS_STEPS)
    if full.size > count:
        full = np.sort(np.random.default_rng(seed).choice(full, count, replace=False))
    last = span - PRED_STEPS - 1
    chosen = windows.positions[full, last - OBS_STEPS + 1 :]
    centred = chosen - chosen[:, OBS_STEPS - 1 : OBS_STEPS]
    history = torch.from_numpy(centred[:, :OBS_STEPS].astype(np.float32))
    return history, torch.from_numpy(centred[:, OBS_STEPS:].astype(np.float32))


def gate_outcomes(
    net: Predictor, history: Tensor, fut: Tensor, margin: float
) -> tuple[np.ndarray, np.ndarray]:
    """The gate's logits and whether the top learned mode clearly beat constant velocity,
    per window."""
    with torch.no_grad():
        lengths = torch.full((history.shape[0],), OBS_STEPS, dtype=torch.int32)
        traj, logits, gate = net.decode(*net.encode(history, lengths))
        labels = gate_labels(traj, fut, margin, top_learned(logits))
        return gate.numpy().astype(np.float64), labels.numpy()


def platt(logits: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """(a, b) of the weighted logistic fit ``P(label) = sigmoid(a * logit + b)``, a >= 0.

    Newton steps on the weighted cross-entropy. Where the logits carry no sign of the
    outcome (a would be negative), a = 0: the gate states the base rate everywhere.
    """
    x = np.stack([logits, np.ones_like(logits)], axis=1)
    w = weights / weights.sum()
    theta = np.zeros(2)
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(x @ theta)))
        grad = x.T @ (w * (p - labels))
        hess = (x * (w * p * (1 - p))[:, None]).T @ x + 1e-9 * np.eye(2)
        theta = theta - np.linalg.solve(hess, grad)
    if theta[0] < 0:
        rate = float(np.clip((w * labels).sum(), 1e-6, 1 - 1e-6))
        return 0.0, math.log(rate / (1 - rate))
    return float(theta[0]), float(theta[1])


def calibration_folds(names: tuple[str, ...], folds: int) -> list[tuple[str, ...]]:
    """Sources dealt round-robin into ``folds`` groups, real scenes first, so that each fold
    holds out real and generated data alike."""
    ordered = sorted(names, key=lambda n: (n not in ETH_UCY_SCENES, n))
    groups = [tuple(ordered[i::folds]) for i in range(folds)]
    return [g for g in groups if g]


def calibrate_gate(
    model: ModelDef, data: TrainingSet, seed: int, fit: PredictorFitConfig
) -> tuple[float, float, dict[str, float]]:
    """Platt (a, b) of the gate from out-of-fold fits, and their statistics."""
    names = tuple(n for n in data.parts if data.parts[n].count)
    logits, labels, weights = [], [], []
    for index, held in enumerate(calibration_folds(names, fit.calibration_folds)):
        kept = tuple(n for n in names if n not in held)
        if not kept:
            continue
        net = _train(model, data.pools(kept), seed + 1 + index, fit, fit.calibration_steps)
        for name in held:
            history, fut = protocol_cut(data.parts[name], fit.calibration_windows, seed)
            if history.shape[0] == 0:
                continue
            raw, label = gate_outcomes(net, history, fut, fit.gate_margin)
            logits.append(raw)
            labels.append(label)
            # Each source weighs the same, however many windows it holds.
            weights.append(np.full(raw.size, 1.0 / raw.size))
    if not logits:
        return 1.0, 0.0, {}
    a, b = platt(np.concatenate(logits), np.concatenate(labels), np.concatenate(weights))
    return a, b, {"gate_scale": round(a, 6), "gate_shift": round(b, 6)}


def fit_predictor(
    model: ModelDef,
    sources: tuple[str, ...],
    seed: int,
    fit: PredictorFitConfig | None = None,
    data_dir: Path | None = None,
    scene_files: Mapping[str, Path] | None = None,
) -> tuple[dict[str, np.ndarray], list[Source], dict[str, float]]:
    """Fitted weights, the data's provenance, and fit statistics."""
    fit = fit or PredictorFitConfig()
    cfg: PredictorConfig = model.config
    if cfg.horizon != PRED_STEPS:
        raise ConfigError(f"the fit's windows hold {PRED_STEPS} future steps; H={cfg.horizon}")
    configure(torch, seed)
    data = training_windows(sources, seed, fit, data_dir, scene_files)
    a, b, calibration = (
        calibrate_gate(model, data, seed, fit) if fit.calibration_folds else (1.0, 0.0, {})
    )
    net = _train(model, data.pools(tuple(data.parts)), seed, fit, fit.steps)
    weights = to_numpy(net)
    weights["gate.weight"] = (weights["gate.weight"] * np.float32(a)).astype(np.float32)
    weights["gate.bias"] = (weights["gate.bias"] * np.float32(a) + np.float32(b)).astype(np.float32)
    real, generated = data.pools(tuple(data.parts))
    stats = {
        "real_windows": float(real.count),
        "synthetic_windows": float(generated.count),
        "final_loss": round(float(net.final_loss), 6),
        **calibration,
    }
    return weights, data.sources, stats
