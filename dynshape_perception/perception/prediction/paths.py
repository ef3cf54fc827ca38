"""Predicted paths: agent histories in, K paths per agent with their confidences out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dynshape_perception.errors import ShapeError
from dynshape_perception.perception.prediction.batching import HistoryBatcher
from dynshape_perception.perception.records import PREDICTION_DTYPE

ModelFn = Callable[..., list[np.ndarray]]


@dataclass(frozen=True)
class PredictedPaths:
    """``paths [A, K, H, 2]`` (fixed frame, one predictor step apart, the first one step after
    the last observation) and ``confidences [A, K]`` (each agent's sum to 1) of agents ``ids``."""

    ids: np.ndarray
    paths: np.ndarray
    confidences: np.ndarray
    step_s: float

    def __post_init__(self) -> None:
        a_n = self.ids.shape[0]
        if self.paths.ndim != 4 or self.paths.shape[0] != a_n or self.paths.shape[3] != 2:
            raise ShapeError(f"paths must be [{a_n}, K, H, 2], got {self.paths.shape}")
        if self.confidences.shape != self.paths.shape[:2]:
            raise ShapeError(
                f"confidences must be {self.paths.shape[:2]}, got {self.confidences.shape}"
            )

    @classmethod
    def empty(cls, step_s: float) -> PredictedPaths:
        return cls(
            np.zeros(0, np.uint32), np.zeros((0, 1, 1, 2), np.float32), np.zeros((0, 1)), step_s
        )

    def table(self) -> np.ndarray:
        """Rows (id, k, step, x, y, prob) for every agent, hypothesis and step."""
        return prediction_table(self.ids, self.paths, self.confidences)


def prediction_table(ids: np.ndarray, traj: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Rows (id, k, step, x, y, prob) for every agent, hypothesis and step."""
    a_n, k_n, h_n, _ = traj.shape
    table = np.zeros(a_n * k_n * h_n, dtype=PREDICTION_DTYPE)
    grid_a, grid_k, grid_s = np.meshgrid(
        np.arange(a_n), np.arange(k_n), np.arange(h_n), indexing="ij"
    )
    table["id"] = ids[grid_a.ravel()]
    table["k"] = grid_k.ravel()
    table["step"] = grid_s.ravel()
    table["x"] = traj[..., 0].ravel()
    table["y"] = traj[..., 1].ravel()
    table["prob"] = probs[grid_a.ravel(), grid_k.ravel()]
    return table


class PredictionStage:
    """The one place the predictor is called: histories of agents in, their paths out.

    ``encode`` and ``decode`` are the two halves, for callers that let other work run in
    between (the tiered executor); ``predict`` runs both.
    """

    def __init__(self, predictor: ModelFn, step_s: float) -> None:
        self.step_s = float(step_s)
        self.batcher = HistoryBatcher(predictor)
        self._predictor = predictor

    def encode(self, histories: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.batcher.encode(histories)

    def decode(self, ids: np.ndarray, state: Sequence[np.ndarray]) -> PredictedPaths:
        traj, probs = self._predictor("decode", *state)
        return PredictedPaths(np.asarray(ids, np.uint32), traj, probs, self.step_s)

    def predict(self, ids: np.ndarray, histories: Sequence[np.ndarray]) -> PredictedPaths:
        if len(ids) == 0:
            return PredictedPaths.empty(self.step_s)
        return self.decode(ids, self.encode(histories))
