"""Models as the ONNX exporter must see them so that every dynamic dim stays dynamic."""

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from dynshape_perception.models.predictor import PredictorConfig
from dynshape_perception.models.segmenter import SegmenterConfig
from dynshape_perception.models.tir_kernels import (
    HEADING_EPS_M,
    RESIDUAL_FLOOR_M,
    SPREAD_SHARE,
    TURN_EPS,
    anchor_shares,
    residual_shares,
)
from dynshape_perception.tools.fit.torch_models import Segmenter, load_numpy


class SegmenterGraph(Segmenter):
    """The segmenter twin with ``torch.sqrt``: the twin's ``exact_sqrt`` goes through NumPy,
    which the tracer records as a constant of the example's shape (P = 64 for every P)."""

    @staticmethod
    def sqrt(x: Tensor) -> Tensor:
        return torch.sqrt(x)


def traceable_segmenter(config: SegmenterConfig, weights: Mapping[str, np.ndarray]) -> Segmenter:
    module = SegmenterGraph(config).eval()
    load_numpy(module, weights)
    return module


class PredictorGraph(torch.nn.Module):
    """Same math as ``models.predictor.reference``; tracing would unroll the loop for one T."""

    w_ih: Tensor
    w_hh: Tensor
    b_ih: Tensor
    b_hh: Tensor
    dec_weight: Tensor
    dec_bias: Tensor
    residual_weight: Tensor
    residual_bias: Tensor
    logits_weight: Tensor
    logits_bias: Tensor
    gate_weight: Tensor
    gate_bias: Tensor
    anchor_shares: Tensor
    residual_shares: Tensor

    def __init__(self, config: PredictorConfig, weights: Mapping[str, np.ndarray]) -> None:
        super().__init__()
        for key, value in weights.items():
            self.register_buffer(key.replace(".", "_"), torch.from_numpy(np.array(value)))
        self.hd = int(config.hidden)
        self.k = int(config.hypotheses)
        self.horizon = int(config.horizon)
        self.turn_eps = float(TURN_EPS)
        self.heading_eps = float(HEADING_EPS_M)
        self.residual_floor = float(RESIDUAL_FLOOR_M)
        self.spread = float(SPREAD_SHARE)
        self.register_buffer("anchor_shares", torch.tensor(anchor_shares(self.k)))
        self.register_buffer("residual_shares", torch.tensor(residual_shares(self.k)))

    def cell(self, h: Tensor, d_prev: Tensor, d_new: Tensor) -> Tensor:
        hd = self.hd
        sp = torch.sqrt(d_new[:, 0] ** 2 + d_new[:, 1] ** 2)
        sq = torch.sqrt(d_prev[:, 0] ** 2 + d_prev[:, 1] ** 2)
        den = sp * sq + self.turn_eps
        dot = (d_prev[:, 0] * d_new[:, 0] + d_prev[:, 1] * d_new[:, 1]) / den
        crs = (d_prev[:, 0] * d_new[:, 1] - d_prev[:, 1] * d_new[:, 0]) / den
        f = torch.stack([sp, sq, dot, crs], dim=1)
        gi = f @ self.w_ih + self.b_ih
        gh = h @ self.w_hh + self.b_hh
        r = torch.sigmoid(gi[:, :hd] + gh[:, :hd])
        z = torch.sigmoid(gi[:, hd : 2 * hd] + gh[:, hd : 2 * hd])
        n = torch.tanh(gi[:, 2 * hd :] + r * gh[:, 2 * hd :])
        return (1.0 - z) * n + z * h

    def forward(self, history: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        a_n = history.shape[0]
        s_n = history.shape[1]
        h = torch.zeros(a_n, self.hd, dtype=history.dtype)
        disp = torch.zeros(a_n, 2, dtype=history.dtype)
        for t in range(s_n - 1):
            live = (lengths > t + 1).unsqueeze(1)
            d_new = history[:, t + 1] - history[:, t]
            h = torch.where(live, self.cell(h, disp, d_new), h)
            disp = torch.where(live, d_new, disp)
        last = torch.clamp(lengths.long(), 1, s_n) - 1
        pos = history[torch.arange(a_n), last]
        z = torch.relu(h @ self.dec_weight + self.dec_bias)
        res = (z @ self.residual_weight + self.residual_bias).reshape(a_n, self.k, self.horizon, 2)
        speed = torch.sqrt(disp[:, 0] ** 2 + disp[:, 1] ** 2)
        moving = speed > self.heading_eps
        safe = torch.clamp(speed, min=self.heading_eps)
        c = torch.where(moving, disp[:, 0] / safe, torch.ones_like(speed))[:, None, None]
        s = torch.where(moving, disp[:, 1] / safe, torch.zeros_like(speed))[:, None, None]
        steps = torch.arange(1, self.horizon + 1, dtype=history.dtype)[None, None, :]
        scale = (speed + self.residual_floor)[:, None, None]
        learn = scale * self.residual_shares[None, :, None]
        u = speed[:, None, None] * steps * self.anchor_shares[None, :, None] + learn * res[..., 0]
        v = learn * res[..., 1]
        traj = torch.stack(
            [pos[:, 0, None, None] + c * u - s * v, pos[:, 1, None, None] + s * u + c * v], dim=-1
        )
        logits = z @ self.logits_weight + self.logits_bias
        gate = (z @ self.gate_weight + self.gate_bias)[:, 0]
        return traj, self.rank(logits, gate)

    def rank(self, logits: Tensor, gate: Tensor) -> Tensor:
        """Same math as ``tir_kernels.rank_kernel``."""
        if self.k == 1:
            return torch.ones_like(logits)
        learned = logits[:, 1:]
        top = torch.argmax(learned, dim=1)[:, None]
        g = torch.sigmoid(gate)
        peak = torch.max(learned, dim=1, keepdim=True)[0]
        others = g[:, None] * torch.exp(learned - peak) * self.spread
        others = others.scatter(1, top, torch.zeros_like(g)[:, None])
        norm = 1.0 / (1.0 + others.sum(dim=1))
        probs = torch.cat([((1.0 - g) * norm)[:, None], others * norm[:, None]], dim=1)
        return probs.scatter(1, top + 1, (g * norm)[:, None])


def scripted_predictor(
    config: PredictorConfig, weights: Mapping[str, np.ndarray]
) -> torch.jit.ScriptModule:
    return torch.jit.script(PredictorGraph(config, weights))
