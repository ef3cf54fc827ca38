"""Fit the predictor: winner-takes-all over K hypotheses plus cross-entropy on the winner."""

from __future__ import annotations

import logging
import math
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
    SYNTHETIC,
    Source,
    SyntheticPedestrians,
    eth_ucy_windows,
    synthetic_windows,
)
from dynshape_perception.tools.fit.schedule import adam, cosine_share, set_learning_rate
from dynshape_perception.tools.fit.torch_env import configure
from dynshape_perception.tools.fit.torch_models import Predictor, exact_sqrt, load_numpy, to_numpy

log = logging.getLogger(__name__)

SOURCES = (*sorted(ETH_UCY_SCENES), SYNTHETIC)
# A distance's gradient is undefined at zero; this floor under its square keeps it finite.
_DISTANCE_EPS = 1e-6


@dataclass(frozen=True)
class PredictorFitConfig:
    """Hyperparameters of the predictor fit; the defaults are the committed fit's."""

    steps: int = 3000
    batch_size: int = 256
    learning_rate: float = 3e-3
    final_lr_share: float = 0.02
    # Weight of the final-step error beside the average error, in the winner's loss.
    fde_weight: float = 0.5
    classification_weight: float = 0.5
    # Share of the regression loss spread over the losers at the start, annealed to 0, so
    # that no hypothesis is starved before it finds its mode.
    relax_start: float = 0.05
    relax_steps: int = 1000
    scale_range: tuple[float, float] = (0.5, 2.0)
    real_share: float = 0.7
    # Share of windows played backwards: walking reversed is walking, and starts become stops.
    reverse_share: float = 0.5
    # The weights written are an exponential moving average over the last few hundred steps,
    # which smooths the noise of the final minibatches.
    ema_decay: float = 0.998
    # Share of windows seen through a shorter history (2 to 7 steps, left-aligned as the
    # pipeline packs them): young tracks are predicted too.
    short_share: float = 0.25
    synthetic: SyntheticPedestrians = field(default_factory=SyntheticPedestrians)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.relax_steps < 1:
            raise ConfigError("steps, batch_size and relax_steps must be positive")
        if not (self.learning_rate > 0 and 0 < self.final_lr_share <= 1):
            raise ConfigError("learning_rate must be > 0 and final_lr_share in (0, 1]")
        if not 0 < self.scale_range[0] <= self.scale_range[1]:
            raise ConfigError(f"scale_range must be 0 < lo <= hi, got {self.scale_range}")
        shares = (self.real_share, self.reverse_share, self.ema_decay, self.short_share)
        if not all(0 <= share <= 1 for share in shares) or not 0 <= self.relax_start < 1:
            raise ConfigError(
                "real_share, reverse_share, ema_decay and short_share must be in [0, 1], "
                "relax_start in [0, 1)"
            )


def training_windows(
    sources: tuple[str, ...], seed: int, fit: PredictorFitConfig, data_dir: Path | None = None
) -> tuple[np.ndarray, np.ndarray, list[Source]]:
    """Real windows ``[R, 20, 2]`` and synthetic ones ``[S, 20, 2]`` of the named sources."""
    real, synth, used = [], [], []
    for name in sources:
        if name == SYNTHETIC:
            windows, source = synthetic_windows(seed, fit.synthetic)
            synth.append(windows)
        else:
            windows, source = eth_ucy_windows(name, data_dir)
            real.append(windows)
        used.append(source)
    empty = np.zeros((0, OBS_STEPS + PRED_STEPS, 2))
    out_real = np.concatenate(real) if real else empty
    out_synth = np.concatenate(synth) if synth else empty
    if out_real.shape[0] + out_synth.shape[0] == 0:
        names = ", ".join(sources)
        raise DataError(
            f"no {OBS_STEPS + PRED_STEPS}-step track windows in {names}: nothing to fit on"
        )
    return out_real, out_synth, used


def _sample(real: Tensor, synth: Tensor, fit: PredictorFitConfig, gen: torch.Generator) -> Tensor:
    """One batch of windows, ``real_share`` of them real where both kinds exist."""
    if real.shape[0] == 0 or synth.shape[0] == 0:
        pool = real if real.shape[0] else synth
        return pool[torch.randint(pool.shape[0], (fit.batch_size,), generator=gen)]
    num_real = round(fit.real_share * fit.batch_size)
    pick_real = torch.randint(real.shape[0], (num_real,), generator=gen)
    pick_synth = torch.randint(synth.shape[0], (fit.batch_size - num_real,), generator=gen)
    return torch.cat([real[pick_real], synth[pick_synth]])


def _augment(windows: Tensor, fit: PredictorFitConfig, gen: torch.Generator) -> Tensor:
    """Centre on the last observed point, then rotate, mirror and scale the speed at random."""
    n = windows.shape[0]
    reverse = torch.rand(n, generator=gen) < fit.reverse_share
    windows = torch.where(reverse[:, None, None], windows.flip(1), windows)
    centred = windows - windows[:, OBS_STEPS - 1 : OBS_STEPS]
    angle = torch.rand(n, generator=gen, dtype=windows.dtype) * (2 * math.pi)
    lo, hi = math.log(fit.scale_range[0]), math.log(fit.scale_range[1])
    scale = torch.exp(lo + (hi - lo) * torch.rand(n, generator=gen, dtype=windows.dtype))
    mirror = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).to(windows.dtype)
    cos, sin = torch.cos(angle) * scale, torch.sin(angle) * scale
    x, y = centred[..., 0], centred[..., 1] * mirror[:, None]
    return torch.stack(
        [cos[:, None] * x - sin[:, None] * y, sin[:, None] * x + cos[:, None] * y], dim=-1
    )


def _shorten(obs: Tensor, fit: PredictorFitConfig, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Keep only the last L observed steps of ``short_share`` of the windows, left-aligned.

    Returns the histories ``[B, OBS_STEPS, 2]`` (rows past L repeat the last point and are
    masked by the lengths) and the int32 lengths ``[B]``.
    """
    n = obs.shape[0]
    short = torch.randint(2, OBS_STEPS, (n,), generator=gen)
    lengths = torch.where(torch.rand(n, generator=gen) < fit.short_share, short, OBS_STEPS)
    index = torch.arange(OBS_STEPS)[None, :] + (OBS_STEPS - lengths)[:, None]
    index = torch.clamp(index, max=OBS_STEPS - 1)
    history = torch.gather(obs, 1, index[..., None].expand(-1, -1, 2))
    return history, lengths.to(torch.int32)


def wta_loss(
    traj: Tensor, logits: Tensor, fut: Tensor, fit: PredictorFitConfig, relax: float
) -> tuple[Tensor, Tensor]:
    """Winner-takes-all regression and cross-entropy on the winner; returns (loss, winner)."""
    err = exact_sqrt(((traj - fut[:, None]) ** 2).sum(-1) + _DISTANCE_EPS)
    cost = err.mean(-1) + fit.fde_weight * err[..., -1]
    winner = cost.detach().argmin(dim=1)
    k = cost.shape[1]
    weights = torch.full_like(cost, relax / max(k - 1, 1))
    weights.scatter_(1, winner[:, None], 1.0 - relax if k > 1 else 1.0)
    regression = (weights * cost).sum(1).mean()
    classification = torch.nn.functional.cross_entropy(logits, winner)
    return regression + fit.classification_weight * classification, winner


def fit_predictor(
    model: ModelDef,
    sources: tuple[str, ...],
    seed: int,
    fit: PredictorFitConfig | None = None,
    data_dir: Path | None = None,
) -> tuple[dict[str, np.ndarray], list[Source], dict[str, float]]:
    """Fitted weights, the data's provenance, and fit statistics."""
    fit = fit or PredictorFitConfig()
    cfg: PredictorConfig = model.config
    if cfg.horizon > PRED_STEPS:
        raise ConfigError(f"the fit's windows hold {PRED_STEPS} future steps; H={cfg.horizon}")
    configure(torch, seed)
    real_np, synth_np, used = training_windows(sources, seed, fit, data_dir)
    real = torch.from_numpy(real_np)
    synth = torch.from_numpy(synth_np)
    net = Predictor(cfg)
    load_numpy(net, init_weights(parameter_shapes(model), seed))
    opt = adam(net.parameters(), fit.learning_rate)
    gen = torch.Generator().manual_seed(seed)
    horizon = cfg.horizon
    ema = [p.detach().clone() for p in net.parameters()]
    loss_value = float("nan")
    for step in range(fit.steps):
        share = cosine_share(step, fit.steps, fit.final_lr_share)
        set_learning_rate(opt, fit.learning_rate * share)
        relax = fit.relax_start * max(0.0, 1.0 - step / fit.relax_steps)
        batch = _augment(_sample(real, synth, fit, gen), fit, gen).to(torch.float32)
        history, lengths = _shorten(batch[:, :OBS_STEPS], fit, gen)
        fut = batch[:, OBS_STEPS : OBS_STEPS + horizon]
        traj, logits = net.decode(*net.encode(history, lengths))
        loss, _ = wta_loss(traj, logits, fut, fit, relax)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for avg, param in zip(ema, net.parameters(), strict=True):
                avg.mul_(fit.ema_decay).add_(param.detach(), alpha=1.0 - fit.ema_decay)
        loss_value = float(loss.detach())
        if step % 500 == 0 or step == fit.steps - 1:
            log.info("predictor step %d/%d loss %.4f", step, fit.steps, loss_value)
    stats = {
        "real_windows": float(real.shape[0]),
        "synthetic_windows": float(synth.shape[0]),
        "final_loss": round(loss_value, 6),
    }
    with torch.no_grad():
        for avg, param in zip(ema, net.parameters(), strict=True):
            param.copy_(avg)
    return to_numpy(net), used, stats
