"""PyTorch twins of the three models: the NumPy references' math, parameter for parameter."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor, nn

from dynshape_perception.models.associator import AssociatorConfig
from dynshape_perception.models.predictor import DECODER_HIDDEN, PredictorConfig
from dynshape_perception.models.segmenter import SegmenterConfig
from dynshape_perception.models.tir_kernels import (
    FEATURES,
    HEADING_EPS_M,
    RESIDUAL_FLOOR_M,
    SPREAD_SHARE,
    STEP_FEATURES,
    TURN_EPS,
    anchor_shares,
    residual_shares,
)


class Dense(nn.Module):
    """``x @ weight + bias`` with ``weight`` stored [in, out], as in the Relax models."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


class _ExactSqrt(torch.autograd.Function):
    """IEEE square root through NumPy, with ``torch.sqrt``'s gradient ``g / (2 sqrt(x))``."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor) -> Tensor:
        out = torch.from_numpy(np.sqrt(x.detach().numpy()))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad / (2 * out)


def exact_sqrt(x: Tensor) -> Tensor:
    """The correctly rounded square root on every CPU.

    ``torch.sqrt`` on CPU calls MKL's vector sqrt, which on MKL's portable CNR branch is
    not correctly rounded and whose last bits differ between CPU models; so did the weights.
    """
    return _ExactSqrt.apply(x)


def load_numpy(module: nn.Module, weights: Mapping[str, np.ndarray]) -> None:
    """Copy float32 arrays into the parameters of the same names; every name must match."""
    params = dict(module.named_parameters())
    if set(params) != set(weights):
        raise KeyError(f"parameters {sorted(params)} differ from weights {sorted(weights)}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(torch.from_numpy(np.asarray(weights[name], np.float32)))


def to_numpy(module: nn.Module) -> dict[str, np.ndarray]:
    return {
        name: param.detach().numpy().astype(np.float32).copy()
        for name, param in module.named_parameters()
    }


class Segmenter(nn.Module):
    """Per-point score from points [P, 4] and a ground plane [4]; see ``models.segmenter``."""

    sqrt = staticmethod(exact_sqrt)

    def __init__(self, config: SegmenterConfig) -> None:
        super().__init__()
        h1, h2 = config.hidden
        self.config = config
        self.l1 = Dense(FEATURES, h1)
        self.l2 = Dense(h1, h2)
        self.score = Dense(h2, 1)

    def features(self, points: Tensor, ground: Tensor) -> Tensor:
        xyz = points[:, :3]
        height = (xyz @ ground[:3] + ground[3]) / self.config.height_scale_m
        rng = self.sqrt(xyz[:, 0] ** 2 + xyz[:, 1] ** 2) / self.config.range_scale_m
        return torch.stack(
            [height, rng, xyz[:, 2] / self.config.height_scale_m, points[:, 3]], dim=1
        )

    def logit(self, feats: Tensor) -> Tensor:
        """The score head before its sigmoid, from precomputed point features."""
        f2 = torch.relu(self.l2(torch.relu(self.l1(feats))))
        return self.score(f2)[:, 0]

    def forward(self, points: Tensor, ground: Tensor) -> Tensor:
        return torch.sigmoid(self.logit(self.features(points, ground)))


class Associator(nn.Module):
    """Affinity [N, M] of detections [N, F] and tracks [M, F]; see ``models.associator``."""

    def __init__(self, config: AssociatorConfig) -> None:
        super().__init__()
        self.l1 = Dense(config.features, config.hidden)
        self.l2 = Dense(config.hidden, 1)

    def logit(self, absdiff: Tensor) -> Tensor:
        """The affinity before its sigmoid, from |det - trk| rows [..., F]."""
        return self.l2(torch.relu(self.l1(absdiff)))[..., 0]

    def forward(self, detections: Tensor, tracks: Tensor) -> Tensor:
        absdiff = torch.abs(detections[:, None, :] - tracks[None, :, :])
        return torch.sigmoid(self.logit(absdiff))


class Predictor(nn.Module):
    """GRU over rotation-invariant step features, K hypotheses in the heading frame."""

    def __init__(self, config: PredictorConfig) -> None:
        super().__init__()
        hd = config.hidden
        self.config = config
        self.w_ih = nn.Parameter(torch.zeros(STEP_FEATURES, 3 * hd))
        self.w_hh = nn.Parameter(torch.zeros(hd, 3 * hd))
        self.b_ih = nn.Parameter(torch.zeros(3 * hd))
        self.b_hh = nn.Parameter(torch.zeros(3 * hd))
        self.dec = Dense(hd, DECODER_HIDDEN)
        self.residual = Dense(DECODER_HIDDEN, config.hypotheses * config.horizon * 2)
        self.logits = Dense(DECODER_HIDDEN, config.hypotheses)
        self.gate = Dense(DECODER_HIDDEN, 1)
        self.final_loss = float("nan")

    def cell(self, h: Tensor, d_prev: Tensor, d_new: Tensor) -> Tensor:
        hd = self.config.hidden
        sp = exact_sqrt(d_new[:, 0] ** 2 + d_new[:, 1] ** 2)
        sq = exact_sqrt(d_prev[:, 0] ** 2 + d_prev[:, 1] ** 2)
        den = sp * sq + TURN_EPS
        f = torch.stack(
            [
                sp,
                sq,
                (d_prev[:, 0] * d_new[:, 0] + d_prev[:, 1] * d_new[:, 1]) / den,
                (d_prev[:, 0] * d_new[:, 1] - d_prev[:, 1] * d_new[:, 0]) / den,
            ],
            dim=1,
        )
        gi = f @ self.w_ih + self.b_ih
        gh = h @ self.w_hh + self.b_hh
        r = torch.sigmoid(gi[:, :hd] + gh[:, :hd])
        z = torch.sigmoid(gi[:, hd : 2 * hd] + gh[:, hd : 2 * hd])
        n = torch.tanh(gi[:, 2 * hd :] + r * gh[:, 2 * hd :])
        return (1 - z) * n + z * h

    def encode(self, history: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a_n, s_n = history.shape[0], history.shape[1]
        h = history.new_zeros(a_n, self.config.hidden)
        disp = history.new_zeros(a_n, 2)
        for t in range(s_n - 1):
            live = (lengths > t + 1)[:, None]
            d_new = history[:, t + 1] - history[:, t]
            h = torch.where(live, self.cell(h, disp, d_new), h)
            disp = torch.where(live, d_new, disp)
        last = torch.clamp(lengths.long(), 1, s_n) - 1
        pos = history[torch.arange(a_n), last]
        return h, pos, disp

    def decode(self, h: Tensor, pos: Tensor, disp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Trajectories [A, K, H, 2], the confidence logits [A, K] and the gate logit [A]
        (``rank`` turns the last two into the probabilities)."""
        cfg = self.config
        z = torch.relu(self.dec(h))
        res = self.residual(z).reshape(-1, cfg.hypotheses, cfg.horizon, 2)
        speed = exact_sqrt(disp[:, 0] ** 2 + disp[:, 1] ** 2)
        moving = speed > HEADING_EPS_M
        safe = torch.clamp(speed, min=HEADING_EPS_M)
        c = torch.where(moving, disp[:, 0] / safe, torch.ones_like(speed))[:, None, None]
        s = torch.where(moving, disp[:, 1] / safe, torch.zeros_like(speed))[:, None, None]
        steps = torch.arange(1, cfg.horizon + 1, dtype=h.dtype)[None, None, :]
        scale = (speed + RESIDUAL_FLOOR_M)[:, None, None]
        shares = torch.tensor(anchor_shares(cfg.hypotheses), dtype=h.dtype)[None, :, None]
        learn = torch.tensor(residual_shares(cfg.hypotheses), dtype=h.dtype)[None, :, None]
        u = speed[:, None, None] * steps * shares + scale * learn * res[..., 0]
        v = scale * learn * res[..., 1]
        traj = torch.stack(
            [pos[:, 0, None, None] + c * u - s * v, pos[:, 1, None, None] + s * u + c * v],
            dim=-1,
        )
        return traj, self.logits(z), self.gate(z)[:, 0]

    def forward(self, history: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        traj, logits, gate = self.decode(*self.encode(history, lengths))
        return traj, rank(logits, gate)


def top_learned(logits: Tensor) -> Tensor:
    """Index [A] of the learned mode (1..) with the highest logit, the first of equals."""
    return logits[:, 1:].argmax(dim=1) + 1


def rank(logits: Tensor, gate: Tensor) -> Tensor:
    """Probabilities [A, K] from the logits and the gate logit; see ``tir_kernels.rank_kernel``."""
    if logits.shape[1] == 1:
        return torch.ones_like(logits)
    top = top_learned(logits)
    learned = logits[:, 1:]
    g = torch.sigmoid(gate)
    others = g[:, None] * torch.exp(learned - learned.max(dim=1, keepdim=True).values)
    others = (others * SPREAD_SHARE).scatter(1, (top - 1)[:, None], 0.0)
    norm = 1.0 / (1.0 + others.sum(dim=1))
    probs = torch.cat([((1.0 - g) * norm)[:, None], others * norm[:, None]], dim=1)
    return probs.scatter(1, top[:, None], (g * norm)[:, None])
