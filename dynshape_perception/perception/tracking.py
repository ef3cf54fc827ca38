"""Multi-object tracking in a fixed frame: constant-velocity motion, Hungarian association."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from dynshape_perception.config import Bounds
from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.paramspec import MAX_COUNT, check_fields, derived, param
from dynshape_perception.perception.features import (
    ASSOC_FEATURES,
    obstacle_features,
)
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE

AffinityFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

# Any cost above the worst allowed one (1 - 0 = 1) works; Hungarian then maximises the
# number of allowed pairs first, and the forbidden pairs it is forced into are dropped.
FORBIDDEN_COST = 1.0e6
REFERENCE_AFFINITY_SIGMA_M = 1.0

_BOX_FIELDS = ("z", "length", "width", "height", "yaw", "score", "label", "num_points")

# Track state: x, y in float64 so that odometry-frame coordinates far from the origin keep
# centimetre resolution; meas_* are the last measured position and time, for velocity.
_STATE_DTYPE = np.dtype(
    [
        ("id", "<u4"),
        ("x", "<f8"),
        ("y", "<f8"),
        ("z", "<f4"),
        ("length", "<f4"),
        ("width", "<f4"),
        ("height", "<f4"),
        ("yaw", "<f4"),
        ("score", "<f4"),
        ("label", "<u4"),
        ("num_points", "<u4"),
        ("vx", "<f8"),
        ("vy", "<f8"),
        ("age", "<u4"),
        ("hits", "<u4"),
        ("missed", "<u4"),
        ("has_velocity", "?"),
        ("meas_x", "<f8"),
        ("meas_y", "<f8"),
        ("meas_stamp_s", "<f8"),
    ]
)


def reference_affinity(
    det_feats: np.ndarray, trk_feats: np.ndarray, sigma_m: float = REFERENCE_AFFINITY_SIGMA_M
) -> np.ndarray:
    """NumPy reference associator: Gaussian of centre distance, float32 ``[N, M]`` in [0, 1]."""
    delta = det_feats[:, None, :2].astype(np.float64) - trk_feats[None, :, :2]
    dist_sq = np.einsum("nmk,nmk->nm", delta, delta)
    affinity: np.ndarray = np.exp(-0.5 * dist_sq / sigma_m**2).astype(np.float32)
    return affinity


@dataclass(frozen=True)
class TrackerParams:
    """Tracker tuning: distances in metres, counts in frames (updates)."""

    gate_distance_m: float = param(
        2.0, "largest distance between a detection and the track it may join", low=0.01, high=100.0
    )
    min_affinity: float = param(
        0.1, "smallest associator affinity of a match, in [0, 1)", low=0.0, high=0.999
    )
    max_missed_frames: int = param(
        5, "frames a track survives without a detection", low=0, high=MAX_COUNT
    )
    min_hits_to_confirm: int = param(
        3, "detections before a track is published", low=1, high=MAX_COUNT
    )
    velocity_smoothing: float = param(
        0.5, "weight of the newest velocity estimate, in (0, 1]", low=0.01, high=1.0
    )
    # A new velocity estimate differs from the track's by at most this times the time since
    # its last measurement: a centre that jumps (two clusters merged, one split, a box seen
    # from another side) moves the track but cannot throw its velocity off.
    max_acceleration_mps2: float = param(
        10.0,
        "largest change of a track's velocity estimate per second since its last "
        "measurement: a jumping cluster centre cannot throw the velocity off",
        low=0.1,
        high=1000.0,
    )
    max_history_s: float = derived("its default: the history the tracker keeps", 64.0)
    max_history_points: int = derived("its default: the history the tracker keeps", 1024)
    publish_coasting: bool = param(
        True, "also publish tracks that missed their detection this frame"
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if not (np.isfinite(self.max_history_s) and self.max_history_s > 0.0):
            raise ConfigError(f"max_history_s must be > 0, got {self.max_history_s!r}")
        if not isinstance(self.max_history_points, int) or self.max_history_points < 2:
            raise ConfigError(
                f"max_history_points must be an integer >= 2, got {self.max_history_points!r}"
            )


class Tracker:
    """Tracks obstacles across frames; ids are monotonically increasing and never reused."""

    def __init__(
        self,
        affinity_fn: AffinityFn,
        params: TrackerParams | None = None,
        bounds: Bounds | None = None,
    ) -> None:
        self._affinity_fn = affinity_fn
        self.params = params or TrackerParams()
        self.bounds = bounds or Bounds()
        self.reset()

    def reset(self) -> None:
        self._state = np.zeros(0, dtype=_STATE_DTYPE)
        self._history: dict[int, deque[tuple[float, float, float]]] = {}
        self._next_id = 1
        self._stamp_s: float | None = None
        self._dead_ids: list[int] = []
        self.dropped_tracks = 0
        self.hits = np.zeros(0, dtype=np.uint32)
        self.missed = np.zeros(0, dtype=np.uint32)

    def live_ids(self, confirmed_only: bool = False) -> list[int]:
        state = self._state
        if confirmed_only:
            state = state[state["hits"] >= self.params.min_hits_to_confirm]
        return [int(i) for i in state["id"]]

    def dead_ids_since_last(self) -> list[int]:
        """Ids that died in the last update: missed too long, or dropped at the bound M."""
        return list(self._dead_ids)

    def history(self, track_id: int) -> tuple[np.ndarray, np.ndarray]:
        """A live track's measured positions: stamps ``[n]`` (s), ``xy [n, 2]``, oldest first."""
        try:
            samples = self._history[int(track_id)]
        except KeyError as err:
            raise InputValueError(f"no live track with id {track_id}") from err
        table = np.array(samples, dtype=np.float64).reshape(-1, 3)
        return table[:, 0].copy(), table[:, 1:].copy()

    def update(self, obstacles: np.ndarray, stamp_s: float) -> np.ndarray:
        """Advance to ``stamp_s`` with this frame's detections; return confirmed live tracks."""
        self._check_input(obstacles, stamp_s)
        dt_s = 0.0 if self._stamp_s is None else stamp_s - self._stamp_s
        state = self._state.copy()
        state["x"] += state["vx"] * dt_s
        state["y"] += state["vy"] * dt_s
        state["age"] += 1

        det_idx, trk_idx = self._associate(obstacles, state)
        self._stamp_s = stamp_s
        self._apply_matches(state, obstacles, det_idx, trk_idx, stamp_s)

        missed = np.ones(state.shape[0], dtype=bool)
        missed[trk_idx] = False
        state["missed"][missed] += 1
        alive = state["missed"] <= self.params.max_missed_frames
        dead = [int(i) for i in state["id"][~alive]]
        state = state[alive]

        unmatched = np.ones(obstacles.shape[0], dtype=bool)
        unmatched[det_idx] = False
        first_born_id = self._next_id
        state = np.concatenate([state, self._births(obstacles[unmatched], stamp_s)])
        state, dropped = self._enforce_bound(state)
        for track_id in dead + dropped:
            self._history.pop(track_id, None)
        # A track born and dropped in the same update was never visible, so never "died".
        dead.extend(i for i in dropped if i < first_born_id)
        self._dead_ids = dead
        self._state = state
        return self._output()

    def _check_input(self, obstacles: np.ndarray, stamp_s: float) -> None:
        if (
            not isinstance(obstacles, np.ndarray)
            or obstacles.dtype != OBSTACLE_DTYPE
            or obstacles.ndim != 1
        ):
            got = getattr(obstacles, "dtype", type(obstacles).__name__)
            raise ShapeError(
                f"obstacles must be a 1-D OBSTACLE_DTYPE array, got {got} "
                f"with shape {np.shape(obstacles)}"
            )
        self.bounds.check("N", obstacles.shape[0], "tracker input")
        if isinstance(stamp_s, bool) or not isinstance(stamp_s, (int, float, np.number)):
            raise InputValueError(f"stamp_s must be a number of seconds, got {stamp_s!r}")
        if not np.isfinite(stamp_s):
            raise InputValueError(f"stamp_s must be finite, got {stamp_s!r}")
        if self._stamp_s is not None and stamp_s <= self._stamp_s:
            raise InputValueError(
                f"stamps must increase: {stamp_s:.6f} s after {self._stamp_s:.6f} s"
            )

    def _associate(self, obstacles: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        num_det, num_trk = obstacles.shape[0], state.shape[0]
        none = np.zeros(0, dtype=np.intp)
        det_feats = obstacle_features(obstacles)
        if num_det == 0 or num_trk == 0:
            return none, none
        trk_feats = obstacle_features(state)
        affinity = np.asarray(self._affinity_fn(det_feats, trk_feats))
        if affinity.shape != (num_det, num_trk):
            raise ShapeError(
                f"affinity_fn returned shape {affinity.shape}, expected ({num_det}, {num_trk}) "
                f"for features of width {ASSOC_FEATURES}"
            )
        if not np.isfinite(affinity).all():
            raise InputValueError("affinity_fn returned non-finite affinities")
        affinity = np.clip(affinity.astype(np.float64), 0.0, 1.0)
        delta_x = obstacles["x"][:, None].astype(np.float64) - state["x"][None, :]
        delta_y = obstacles["y"][:, None].astype(np.float64) - state["y"][None, :]
        allowed = np.hypot(delta_x, delta_y) <= self.params.gate_distance_m
        allowed &= affinity >= self.params.min_affinity
        cost = np.where(allowed, 1.0 - affinity, FORBIDDEN_COST)
        rows, cols = linear_sum_assignment(cost)
        keep = allowed[rows, cols]
        return rows[keep].astype(np.intp), cols[keep].astype(np.intp)

    def _apply_matches(
        self,
        state: np.ndarray,
        obstacles: np.ndarray,
        det_idx: np.ndarray,
        trk_idx: np.ndarray,
        stamp_s: float,
    ) -> None:
        if det_idx.size == 0:
            return
        det = obstacles[det_idx]
        trk = state[trk_idx]
        meas_x = det["x"].astype(np.float64)
        meas_y = det["y"].astype(np.float64)
        elapsed_s = stamp_s - trk["meas_stamp_s"]
        raw_vx = (meas_x - trk["meas_x"]) / elapsed_s
        raw_vy = (meas_y - trk["meas_y"]) / elapsed_s
        change_x, change_y = raw_vx - trk["vx"], raw_vy - trk["vy"]
        change = np.hypot(change_x, change_y)
        limit = self.params.max_acceleration_mps2 * elapsed_s
        scale = np.where(
            trk["has_velocity"] & (change > limit), limit / np.maximum(change, 1e-12), 1.0
        )
        raw_vx = trk["vx"] + scale * change_x
        raw_vy = trk["vy"] + scale * change_y
        # The first finite difference replaces the unknown (zero) initial velocity outright.
        alpha = np.where(trk["has_velocity"], self.params.velocity_smoothing, 1.0)
        trk["vx"] = alpha * raw_vx + (1.0 - alpha) * trk["vx"]
        trk["vy"] = alpha * raw_vy + (1.0 - alpha) * trk["vy"]
        trk["has_velocity"] = True
        trk["x"], trk["y"] = meas_x, meas_y
        trk["meas_x"], trk["meas_y"], trk["meas_stamp_s"] = meas_x, meas_y, stamp_s
        for name in _BOX_FIELDS:
            trk[name] = det[name]
        trk["hits"] += 1
        trk["missed"] = 0
        state[trk_idx] = trk
        for track_id, x, y in zip(
            trk["id"].tolist(), meas_x.tolist(), meas_y.tolist(), strict=True
        ):
            self._record(track_id, stamp_s, x, y)

    def _births(self, obstacles: np.ndarray, stamp_s: float) -> np.ndarray:
        born = np.zeros(obstacles.shape[0], dtype=_STATE_DTYPE)
        if born.size == 0:
            return born
        born["id"] = np.arange(self._next_id, self._next_id + born.size, dtype=np.uint32)
        self._next_id += born.size
        born["x"] = born["meas_x"] = obstacles["x"]
        born["y"] = born["meas_y"] = obstacles["y"]
        born["meas_stamp_s"] = stamp_s
        for name in _BOX_FIELDS:
            born[name] = obstacles[name]
        born["hits"] = 1
        for track_id, x, y in zip(
            born["id"].tolist(), born["x"].tolist(), born["y"].tolist(), strict=True
        ):
            self._record(track_id, stamp_s, x, y)
        return born

    def _enforce_bound(self, state: np.ndarray) -> tuple[np.ndarray, list[int]]:
        excess = state.shape[0] - self.bounds.M
        if excess <= 0:
            return state, []
        # Drop the longest-missed first, then the fewest hits, then the newest id.
        order = np.lexsort(
            (-state["id"].astype(np.int64), state["hits"], -state["missed"].astype(np.int64))
        )
        drop = np.zeros(state.shape[0], dtype=bool)
        drop[order[:excess]] = True
        self.dropped_tracks += int(excess)
        dropped = [int(i) for i in state["id"][drop]]
        return state[~drop], dropped

    def _record(self, track_id: int, stamp_s: float, x: float, y: float) -> None:
        samples = self._history.get(track_id)
        if samples is None:
            samples = deque(maxlen=self.params.max_history_points)
            self._history[track_id] = samples
        samples.append((stamp_s, x, y))
        while samples[0][0] < stamp_s - self.params.max_history_s:
            samples.popleft()

    def _output(self) -> np.ndarray:
        state = self._state
        keep = state["hits"] >= self.params.min_hits_to_confirm
        if not self.params.publish_coasting:
            keep &= state["missed"] == 0
        state = state[keep]
        # Row by row with the output: what the published existence and covariance come from.
        self.hits, self.missed = state["hits"].copy(), state["missed"].copy()
        out = np.zeros(state.shape[0], dtype=TRACK_DTYPE)
        for name in TRACK_DTYPE.names or ():
            out[name] = state[name]
        return out
