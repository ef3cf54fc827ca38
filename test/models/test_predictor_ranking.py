"""The predictor's ranking: constant velocity is always a hypothesis, and first unless gated out."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.models import model_definition
from dynshape_perception.models.predictor import PredictorConfig, decode_ref, rank_ref
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.tools.eval.prediction import constant_velocity

MODEL = model_definition("predictor")
CFG: PredictorConfig = MODEL.config


def _walkers(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0, 0.4, (count, 8, 2)).cumsum(axis=1)
    return (steps - steps[:, -1:]).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mode_zero_is_the_constant_velocity_continuation_whatever_the_weights(seed: int) -> None:
    weights = init_weights(parameter_shapes(MODEL), seed=seed)
    weights = {k: v * np.float32(5.0) for k, v in weights.items()}
    history = _walkers(40, seed)
    traj, probs = MODEL.reference("forward", weights, [history, np.full(40, 8, np.int32)])
    np.testing.assert_allclose(traj[:, 0], constant_velocity(history), atol=1e-4)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_constant_velocity_ranks_first_where_the_gate_expects_no_gain() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 4.0, (500, CFG.hypotheses)).astype(np.float32)
    # However high mode 0's own logit, it takes no part: the gate alone ranks it.
    logits[:, 0] += 20.0
    gate = rng.normal(0.0, 3.0, (500, 1)).astype(np.float32)
    probs = rank_ref(logits, gate)
    top_learned = 1 + logits[:, 1:].argmax(axis=1)
    rows = np.arange(500)
    np.testing.assert_array_equal(probs.argmax(axis=1), np.where(gate[:, 0] > 0, top_learned, 0))
    stated = probs[rows, top_learned] / (probs[:, 0] + probs[rows, top_learned])
    np.testing.assert_allclose(stated, 1.0 / (1.0 + np.exp(-gate[:, 0])), rtol=1e-5)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert (probs[:, 1:] > 0).all(), "the other learned modes keep a share: the spread stays ranked"
    # The gated mode is the likeliest learned one, open or closed, so a reader can tell it.
    np.testing.assert_array_equal(1 + probs[:, 1:].argmax(axis=1), top_learned)
    order = np.argsort(-logits[:, 1:], axis=1, kind="stable")
    ranked = np.take_along_axis(probs[:, 1:], order, axis=1)
    assert (np.diff(ranked, axis=1) <= 0).all(), "the learned modes rank as their logits do"
    # Every learned mode ranks first somewhere: no slot is kept for a central mode.
    assert set(probs.argmax(axis=1)) == set(range(CFG.hypotheses))


def test_a_closed_gate_in_the_weights_puts_constant_velocity_first() -> None:
    weights = init_weights(parameter_shapes(MODEL), seed=4)
    weights["gate.weight"][:] = 0.0
    weights["gate.bias"][:] = -3.0
    state = MODEL.reference("encode", weights, [_walkers(30, 4), np.full(30, 8, np.int32)])
    _, probs = decode_ref(weights, CFG, *state)
    assert (probs.argmax(axis=1) == 0).all()
    weights["gate.bias"][:] = 3.0
    _, probs = decode_ref(weights, CFG, *state)
    top = probs.argmax(axis=1)
    assert (top > 0).all()
    # The open gate states 1 / (1 + e^-3) for the top learned mode against mode 0.
    rows = np.arange(30)
    stated = probs[rows, top] / (probs[rows, top] + probs[:, 0])
    np.testing.assert_allclose(stated, 1.0 / (1.0 + np.exp(-3.0)), rtol=1e-5)
