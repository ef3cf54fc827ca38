"""Track histories rebuilt from received track tables, batched for the predictor."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from dynshape_perception.config import Bounds, predictor_history_steps
from dynshape_perception.errors import MessageError
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.perception.prediction.history import pack_histories, resample_history


class TrackHistories:
    """Positions of every live track id, newest ``bounds.T`` predictor steps kept."""

    def __init__(self, bounds: Bounds, step_s: float) -> None:
        self.bounds = bounds
        self.step_s = step_s
        self._samples: dict[int, deque[tuple[float, float, float]]] = {}
        self.dropped_agents = 0

    def reset(self) -> None:
        self._samples.clear()

    def update(self, tracks: np.ndarray, stamp_s: float) -> None:
        """Append this frame's positions; ids that are gone are forgotten.

        The message is checked before anything is stored (MessageError, nothing changed):
        a stored NaN or repeated stamp would fail every later batch until it aged out. A
        sample at an id's newest stamp again is skipped.
        """
        self._check(tracks, stamp_s)
        live = tracks["id"].tolist()
        for gone in set(self._samples) - set(live):
            del self._samples[gone]
        horizon_s = self.bounds.T * self.step_s
        for track_id, x, y in zip(live, tracks["x"].tolist(), tracks["y"].tolist(), strict=True):
            samples = self._samples.setdefault(int(track_id), deque())
            if samples and samples[-1][0] == stamp_s:
                continue
            samples.append((stamp_s, float(x), float(y)))
            while samples[0][0] < stamp_s - horizon_s:
                samples.popleft()

    def _check(self, tracks: np.ndarray, stamp_s: float) -> None:
        if not math.isfinite(stamp_s):
            raise MessageError(f"track stamp {stamp_s!r} is not finite")
        if not (np.isfinite(tracks["x"]).all() and np.isfinite(tracks["y"]).all()):
            raise MessageError("a track position holds NaN or Inf")
        ids, counts = np.unique(tracks["id"], return_counts=True)
        if (counts > 1).any():
            raise MessageError(f"track id(s) {ids[counts > 1].tolist()} repeated in one message")
        for track_id in ids.tolist():
            samples = self._samples.get(int(track_id))
            if samples and stamp_s < samples[-1][0]:
                raise MessageError(
                    f"track {track_id}: stamp {stamp_s:.6f} s is before its newest "
                    f"{samples[-1][0]:.6f} s"
                )

    def batch(
        self, tracks: np.ndarray, ego: Pose2D, min_steps: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ids, ``[A, T, 2]`` histories and lengths of the agents to predict, nearest first."""
        ids, histories = self.agent_histories(tracks, ego, min_steps)
        longest = max((len(h) for h in histories), default=1)
        batch, lengths = pack_histories(histories, longest)
        return ids, batch, lengths

    def agent_histories(
        self, tracks: np.ndarray, ego: Pose2D, min_steps: int
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Ids and histories (at the predictor's step) of the agents to predict, nearest
        first, at most ``bounds.A`` (the farthest are counted in ``dropped_agents``)."""
        ids: list[int] = []
        histories: list[np.ndarray] = []
        order = np.argsort(np.hypot(tracks["x"] - ego.x, tracks["y"] - ego.y), kind="stable")
        for track_id in tracks["id"][order].tolist():
            samples = self._samples.get(int(track_id))
            if not samples:
                continue
            table = np.asarray(samples, dtype=np.float64)
            hist, length = resample_history(
                table[:, 0],
                table[:, 1:],
                num_steps=predictor_history_steps(self.bounds),
                step_s=self.step_s,
            )
            if length < min_steps:
                continue
            ids.append(int(track_id))
            histories.append(hist)
        if len(ids) > self.bounds.A:
            self.dropped_agents += len(ids) - self.bounds.A
            ids, histories = ids[: self.bounds.A], histories[: self.bounds.A]
        return np.asarray(ids, dtype=np.uint32), histories
