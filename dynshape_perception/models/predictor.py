"""Prediction stage: a recurrent history encoder and a K-hypothesis trajectory decoder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from dynshape_perception.config import Bounds
from dynshape_perception.errors import ConfigError
from dynshape_perception.models import tir_kernels
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
from dynshape_perception.models.tir_kernels import (
    HEADING_EPS_M,
    RESIDUAL_FLOOR_M,
    SPREAD_SHARE,
    STEP_FEATURES,
    TURN_EPS,
    anchor_shares,
    residual_shares,
)

DECODER_HIDDEN = 64


@dataclass(frozen=True)
class PredictorConfig:
    hypotheses: int = 6
    horizon: int = 12
    step_s: float = 0.4
    hidden: int = 32

    def __post_init__(self) -> None:
        if self.hypotheses < 1 or self.horizon < 1 or self.hidden < 1:
            raise ConfigError("predictor K, H and hidden must be positive")
        if self.step_s <= 0:
            raise ConfigError(f"predictor step_s must be positive, got {self.step_s}")


class Predictor(nn.Module):
    def __init__(self, config: PredictorConfig, gpu: bool = False) -> None:
        self.config = config
        hd = config.hidden
        self.w_ih = nn.Parameter((STEP_FEATURES, 3 * hd), "float32")
        self.w_hh = nn.Parameter((hd, 3 * hd), "float32")
        self.b_ih = nn.Parameter((3 * hd,), "float32")
        self.b_hh = nn.Parameter((3 * hd,), "float32")
        self.dec = Dense(hd, DECODER_HIDDEN)
        self.residual = Dense(DECODER_HIDDEN, config.hypotheses * config.horizon * 2)
        self.logits = Dense(DECODER_HIDDEN, config.hypotheses)
        # The calibrated logit that the top learned mode beats constant velocity (mode 0):
        # see rank_kernel.
        self.gate = Dense(DECODER_HIDDEN, 1)
        self._rank_k = tir_kernels.rank_kernel(config.hypotheses, gpu)
        self._encode_k, self._step_k, self._place_k, self._packed_k = tir_kernels.predictor_kernels(
            config.hidden, config.hypotheses, config.horizon, gpu
        )

    def _state_op(
        self, kernel: object, name: str, inputs: list[nn.Tensor], agents: object
    ) -> tuple[nn.Tensor, ...]:
        """A GRU kernel over ``inputs`` and the weights: the state (hidden, last pos, last disp)."""
        hd = self.config.hidden
        return tuple(
            op.tensor_ir_op(
                kernel,
                name,
                args=[*inputs, self.w_ih, self.w_hh, self.b_ih, self.b_hh],
                out=[
                    nn.Tensor.placeholder([agents, hd], "float32"),
                    nn.Tensor.placeholder([agents, 2], "float32"),
                    nn.Tensor.placeholder([agents, 2], "float32"),
                ],
            )
        )

    def encode(self, history: nn.Tensor, lengths: nn.Tensor) -> tuple[nn.Tensor, ...]:
        return self._state_op(self._encode_k, "gru_encode", [history, lengths], history.shape[0])

    def encode_packed(self, points: nn.Tensor, lengths: nn.Tensor) -> tuple[nn.Tensor, ...]:
        return self._state_op(
            self._packed_k, "gru_encode_packed", [points, lengths], lengths.shape[0]
        )

    def step(
        self, hidden: nn.Tensor, last_pos: nn.Tensor, last_disp: nn.Tensor, new_pos: nn.Tensor
    ) -> tuple[nn.Tensor, ...]:
        return self._state_op(
            self._step_k, "gru_step", [hidden, last_pos, last_disp, new_pos], hidden.shape[0]
        )

    def decode(
        self, hidden: nn.Tensor, last_pos: nn.Tensor, last_disp: nn.Tensor
    ) -> tuple[nn.Tensor, nn.Tensor]:
        a = hidden.shape[0]
        cfg = self.config
        z = op.relu(self.dec(hidden))
        traj = op.tensor_ir_op(
            self._place_k,
            "place_hypotheses",
            args=[self.residual(z), last_pos, last_disp],
            out=nn.Tensor.placeholder([a, cfg.hypotheses, cfg.horizon, 2], "float32"),
        )
        probs = op.tensor_ir_op(
            self._rank_k,
            "rank_hypotheses",
            args=[self.logits(z), self.gate(z)],
            out=nn.Tensor.placeholder([a, cfg.hypotheses], "float32"),
        )
        return traj, probs

    def step_decode(
        self, hidden: nn.Tensor, last_pos: nn.Tensor, last_disp: nn.Tensor, new_pos: nn.Tensor
    ) -> tuple[nn.Tensor, ...]:
        """``step`` then ``decode`` in one call: the incremental per-frame path."""
        state = self.step(hidden, last_pos, last_disp, new_pos)
        return (*state, *self.decode(*state))

    def forward(self, history: nn.Tensor, lengths: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor]:
        hidden, last_pos, last_disp = self.encode(history, lengths)
        return self.decode(hidden, last_pos, last_disp)


def _cell_ref(
    h: np.ndarray, d_prev: np.ndarray, d_new: np.ndarray, w: Mapping[str, np.ndarray]
) -> np.ndarray:
    hd = h.shape[1]
    sp = np.sqrt(d_new[:, 0] ** 2 + d_new[:, 1] ** 2)
    sq = np.sqrt(d_prev[:, 0] ** 2 + d_prev[:, 1] ** 2)
    den = sp * sq + np.float32(TURN_EPS)
    f = np.stack(
        [
            sp,
            sq,
            (d_prev[:, 0] * d_new[:, 0] + d_prev[:, 1] * d_new[:, 1]) / den,
            (d_prev[:, 0] * d_new[:, 1] - d_prev[:, 1] * d_new[:, 0]) / den,
        ],
        axis=1,
    ).astype(np.float32)
    gi = f @ w["w_ih"] + w["b_ih"]
    gh = h @ w["w_hh"] + w["b_hh"]
    r = sigmoid(gi[:, :hd] + gh[:, :hd])
    z = sigmoid(gi[:, hd : 2 * hd] + gh[:, hd : 2 * hd])
    n = np.tanh(gi[:, 2 * hd :] + r * gh[:, 2 * hd :])
    out: np.ndarray = ((1 - z) * n + z * h).astype(np.float32)
    return out


def encode_ref(
    w: Mapping[str, np.ndarray], history: np.ndarray, lengths: np.ndarray, hidden: int
) -> list[np.ndarray]:
    a_n, s_n = history.shape[:2]
    h = np.zeros((a_n, hidden), np.float32)
    disp = np.zeros((a_n, 2), np.float32)
    for t in range(s_n - 1):
        live = lengths > t + 1
        d_new = history[:, t + 1] - history[:, t]
        h = np.where(live[:, None], _cell_ref(h, disp, d_new, w), h)
        disp = np.where(live[:, None], d_new, disp)
    if s_n:
        last = np.clip(lengths.astype(np.int64), 1, s_n) - 1
        pos = history[np.arange(a_n), last]
    else:
        pos = np.zeros((a_n, 2), np.float32)
    return [h, pos.astype(np.float32), disp.astype(np.float32)]


def decode_ref(
    w: Mapping[str, np.ndarray],
    cfg: PredictorConfig,
    h: np.ndarray,
    pos: np.ndarray,
    disp: np.ndarray,
) -> list[np.ndarray]:
    z = relu(dense_ref(h, w, "dec"))
    res = dense_ref(z, w, "residual").reshape(-1, cfg.hypotheses, cfg.horizon, 2)
    speed = np.sqrt(disp[:, 0] ** 2 + disp[:, 1] ** 2)
    moving = speed > HEADING_EPS_M
    safe = np.maximum(speed, np.float32(HEADING_EPS_M))
    c = np.where(moving, disp[:, 0] / safe, 1.0).astype(np.float32)[:, None, None]
    s = np.where(moving, disp[:, 1] / safe, 0.0).astype(np.float32)[:, None, None]
    steps = np.arange(1, cfg.horizon + 1, dtype=np.float32)[None, None, :]
    scale = (speed + np.float32(RESIDUAL_FLOOR_M))[:, None, None]
    shares = np.asarray(anchor_shares(cfg.hypotheses), np.float32)[None, :, None]
    learned = scale * np.asarray(residual_shares(cfg.hypotheses), np.float32)[None, :, None]
    u = speed[:, None, None] * steps * shares + learned * res[..., 0]
    v = learned * res[..., 1]
    traj = np.stack(
        [pos[:, 0, None, None] + c * u - s * v, pos[:, 1, None, None] + s * u + c * v], axis=-1
    )
    return [traj.astype(np.float32), rank_ref(dense_ref(z, w, "logits"), dense_ref(z, w, "gate"))]


def rank_ref(logits: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """NumPy twin of ``tir_kernels.rank_kernel``: probabilities ``[A, K]``."""
    a_n, k_hyp = logits.shape
    if k_hyp == 1:
        return np.ones_like(logits, dtype=np.float32)
    probs = np.zeros((a_n, k_hyp), np.float32)
    if a_n == 0:
        return probs
    learned = logits[:, 1:].astype(np.float32)
    top = learned.argmax(axis=1)
    rows = np.arange(a_n)
    g = sigmoid(gate[:, 0])
    others = g[:, None] * np.exp(learned - learned.max(axis=1, keepdims=True))
    others = others * np.float32(SPREAD_SHARE)
    others[rows, top] = 0.0
    norm = np.float32(1.0) / (np.float32(1.0) + others.sum(axis=1))
    probs[:, 1:] = others * norm[:, None]
    probs[:, 0] = (1.0 - g) * norm
    probs[rows, top + 1] = g * norm
    return probs


def reference(
    function: str, w: Mapping[str, np.ndarray], inputs: list[np.ndarray], cfg: PredictorConfig
) -> list[np.ndarray]:
    """NumPy twin of every ``Predictor`` entry point."""
    if function == "encode":
        return encode_ref(w, inputs[0], inputs[1], cfg.hidden)
    if function == "encode_packed":
        points, lengths = inputs
        ends = np.cumsum(lengths.astype(np.int64))
        starts = ends - lengths
        longest = int(lengths.max()) if lengths.size else 0
        padded = np.zeros((lengths.size, max(longest, 1), 2), np.float32)
        for a, (s0, n) in enumerate(zip(starts, lengths, strict=True)):
            padded[a, :n] = points[s0 : s0 + n]
        return encode_ref(w, padded, lengths, cfg.hidden)
    if function == "step":
        h, pos, disp, new = inputs
        d_new = (new - pos).astype(np.float32)
        return [_cell_ref(h, disp, d_new, w), new.astype(np.float32), d_new]
    if function == "decode":
        return decode_ref(w, cfg, *inputs)
    if function == "step_decode":
        state = reference("step", w, inputs, cfg)
        return [*state, *decode_ref(w, cfg, *state)]
    if function == "forward":
        return decode_ref(w, cfg, *encode_ref(w, inputs[0], inputs[1], cfg.hidden))
    raise KeyError(function)


def spec(bounds: Bounds, cfg: PredictorConfig) -> ModelSpec:
    hd = cfg.hidden
    # Steps past an agent's length are never read, and a padded agent with one observation
    # runs no GRU step: filling beats repeating the last agent, which pays its whole history.
    history = (
        TensorSpec("history", ("A", "T", 2), pad=0.0),
        TensorSpec("lengths", ("A",), "int32", count_of="T", pad=1),
    )
    state = (
        TensorSpec("hidden", ("A", hd)),
        TensorSpec("last_pos", ("A", 2)),
        TensorSpec("last_disp", ("A", 2)),
    )
    state_shapes = tuple(t.shape for t in state)
    packed = (TensorSpec("points", ("S", 2)), TensorSpec("lengths", ("A",), "int32", sums_to="S"))
    hypotheses = (("A", cfg.hypotheses, cfg.horizon, 2), ("A", cfg.hypotheses))
    return ModelSpec(
        model="predictor",
        dims=("A", "T", "S"),
        # S counts the rows of packed histories: at most every agent's full history.
        bounds={"A": bounds.A, "T": bounds.T, "S": bounds.A * bounds.T},
        # Agents are independent rows, so A pads exactly; small counts keep exact edges, where
        # padding one agent would cost a large share of a call. Short histories, the most
        # common, stay exact too: padded to the next edge, a short call costs more than generic.
        bucket_edges={
            "A": (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64),
            "T": (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 32, 48, 64, 96, 128),
        },
        functions=(
            FunctionSpec("forward", history, hypotheses),
            FunctionSpec("encode", history, state_shapes),
            FunctionSpec("encode_packed", packed, state_shapes),
            FunctionSpec("step", (*state, TensorSpec("new_pos", ("A", 2))), state_shapes),
            FunctionSpec("decode", state, hypotheses),
            FunctionSpec(
                "step_decode",
                (*state, TensorSpec("new_pos", ("A", 2))),
                (*state_shapes, *hypotheses),
            ),
        ),
    )


def definition(bounds: Bounds, config: PredictorConfig | None = None) -> ModelDef:
    cfg = config or PredictorConfig()
    return ModelDef(
        name="predictor",
        version="4",
        build_module=lambda gpu: Predictor(cfg, gpu),
        spec=spec(bounds, cfg),
        reference=lambda fn, w, x: reference(fn, w, x, cfg),
        config=cfg,
    )


MODEL = register(
    ModelKind(
        "predictor",
        PredictorConfig,
        definition,
        yaml_keys={"hypotheses": "K", "horizon": "H"},
        other_keys=("history_steps",),
    )
)
