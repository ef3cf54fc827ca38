"""The PyTorch twins compute the NumPy references' math, so fitted weights transfer exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="fitting needs PyTorch (requirements-fit.txt)")

from dynshape_perception.models import model_definition  # noqa: E402
from dynshape_perception.models.registry import parameter_shapes  # noqa: E402
from dynshape_perception.tools.fit import torch_models  # noqa: E402

TOLERANCE = 2e-5


def _weights(name: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = parameter_shapes(model_definition(name))
    return {
        key: (rng.standard_normal(shape) * 0.3).astype(np.float32) for key, shape in shapes.items()
    }


def _compare(name: str, net: Any, inputs: list[np.ndarray]) -> None:
    rng = np.random.default_rng(7)
    weights = _weights(name, rng)
    torch_models.load_numpy(net, weights)
    assert list(dict(net.named_parameters())) == list(weights)
    expected = model_definition(name).reference("forward", weights, inputs)
    with torch.no_grad():
        got = net(*[torch.from_numpy(x) for x in inputs])
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for out, ref in zip(got, expected, strict=True):
        np.testing.assert_allclose(out.numpy(), ref, rtol=TOLERANCE, atol=TOLERANCE)
    assert torch_models.to_numpy(net).keys() == weights.keys()


def test_segmenter_twin() -> None:
    rng = np.random.default_rng(0)
    points = np.c_[rng.uniform(-40, 40, (400, 3)) * [1, 1, 0.05], rng.random(400)]
    ground = np.array([0.01, -0.02, 0.9997, 1.73], np.float32)
    net = torch_models.Segmenter(model_definition("segmenter").config)
    _compare("segmenter", net, [points.astype(np.float32), ground])


def test_associator_twin() -> None:
    rng = np.random.default_rng(1)
    det = rng.standard_normal((9, 8)).astype(np.float32)
    trk = rng.standard_normal((5, 8)).astype(np.float32)
    net = torch_models.Associator(model_definition("associator").config)
    _compare("associator", net, [det, trk])


def test_predictor_twin_with_stops_and_short_histories() -> None:
    rng = np.random.default_rng(2)
    history = np.cumsum(rng.standard_normal((30, 10, 2)) * 0.3, axis=1).astype(np.float32)
    history[:4] = 2.0  # standing agents: no heading, the decoder's +x fallback
    lengths = rng.integers(1, 11, 30).astype(np.int32)
    net = torch_models.Predictor(model_definition("predictor").config)
    _compare("predictor", net, [history, lengths])
