"""ETH/UCY trajectory prediction protocol: windows, CV and CV-6 baselines, min-of-K metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dynshape_perception.config import check_seed
from dynshape_perception.errors import DataError, InputValueError, ShapeError
from dynshape_perception.io.datasets import Tracks, detect_frame_step

OBS_STEPS = 8
PRED_STEPS = 12
BOOTSTRAP_RESAMPLES = 1000
CI_LEVEL = 0.95
METRIC_DECIMALS = 4

CV6_TURN_RAD = 0.35
CV6_SLOW_FACTOR = 0.6
CV6_FAST_FACTOR = 1.3
# (heading change rad, speed factor); k = 0 is plain constant velocity, the last is stop.
CV6_HYPOTHESES: tuple[tuple[float, float], ...] = (
    (0.0, 1.0),
    (CV6_TURN_RAD, 1.0),
    (-CV6_TURN_RAD, 1.0),
    (0.0, CV6_SLOW_FACTOR),
    (0.0, CV6_FAST_FACTOR),
    (0.0, 0.0),
)

Predictor = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def _checked_track(
    ped_id: int, frames: np.ndarray, xy: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    frames = np.asarray(frames)
    xy = np.asarray(xy, dtype=np.float64)
    if frames.ndim != 1 or xy.shape != (frames.shape[0], 2):
        raise ShapeError(
            f"track {ped_id}: frames must be [n] and xy [n, 2], got {frames.shape} and {xy.shape}"
        )
    # Readers may hand frame numbers over as floats; only whole numbers are accepted.
    if not np.issubdtype(frames.dtype, np.integer):
        if not (np.issubdtype(frames.dtype, np.floating) and np.isfinite(frames).all()):
            raise InputValueError(f"track {ped_id}: frame numbers must be numbers")
        if not (frames == np.round(frames)).all():
            raise InputValueError(f"track {ped_id}: frame numbers must be whole numbers")
    frames = frames.astype(np.int64)
    if frames.shape[0] > 1 and not (np.diff(frames) > 0).all():
        raise InputValueError(f"track {ped_id}: frame numbers must be strictly increasing")
    if not np.isfinite(xy).all():
        raise InputValueError(f"track {ped_id}: positions hold non-finite values")
    return frames, xy


def extract_windows(
    tracks: Tracks,
    obs: int = OBS_STEPS,
    pred: int = PRED_STEPS,
    frame_step: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every run of ``obs + pred`` consecutive annotated frames of one pedestrian, stride 1.

    Pedestrians are visited in id order. Returns ``obs [W, obs, 2]`` and ``fut [W, pred, 2]``.
    """
    if obs < 2 or pred < 1:
        raise InputValueError(f"need obs >= 2 and pred >= 1, got obs={obs}, pred={pred}")
    checked = {pid: _checked_track(pid, *tracks[pid]) for pid in sorted(tracks)}
    if frame_step is None:
        frame_step = detect_frame_step(checked) if checked else 1
    span = obs + pred
    windows = []
    for frames, xy in checked.values():
        if frames.shape[0] < span:
            continue
        step_ok = (np.diff(frames) == frame_step).astype(np.int64)
        breaks = np.concatenate([[0], np.cumsum(step_ok)])
        # A window starting at i needs all span - 1 following differences equal to the step.
        starts = np.flatnonzero(breaks[span - 1 :] - breaks[: -(span - 1)] == span - 1)
        if starts.size:
            view = np.lib.stride_tricks.sliding_window_view(xy, span, axis=0)
            windows.append(view[starts].transpose(0, 2, 1))
    if not windows:
        return np.zeros((0, obs, 2)), np.zeros((0, pred, 2))
    stacked = np.concatenate(windows, axis=0)
    return stacked[:, :obs].copy(), stacked[:, obs:].copy()


def _check_obs(obs: np.ndarray) -> np.ndarray:
    obs = np.asarray(obs, dtype=np.float64)
    if obs.ndim != 3 or obs.shape[1] < 2 or obs.shape[2] != 2:
        raise ShapeError(f"observations must be [W, T>=2, 2], got {obs.shape}")
    return obs


def constant_velocity(obs: np.ndarray, pred: int = PRED_STEPS) -> np.ndarray:
    """Extrapolate the last displacement: ``[W, pred, 2]``."""
    return cv6(obs, pred)[:, 0]


def cv6(obs: np.ndarray, pred: int = PRED_STEPS) -> np.ndarray:
    """Six constant-velocity variants per window (see CV6_HYPOTHESES): ``[W, 6, pred, 2]``."""
    obs = _check_obs(obs)
    velocity = obs[:, -1] - obs[:, -2]
    angles = np.array([angle for angle, _ in CV6_HYPOTHESES])
    scales = np.array([scale for _, scale in CV6_HYPOTHESES])
    cos, sin = np.cos(angles) * scales, np.sin(angles) * scales
    vx = cos[None, :] * velocity[:, None, 0] - sin[None, :] * velocity[:, None, 1]
    vy = sin[None, :] * velocity[:, None, 0] + cos[None, :] * velocity[:, None, 1]
    steps = np.arange(1, pred + 1, dtype=np.float64)
    traj = np.empty((obs.shape[0], len(CV6_HYPOTHESES), pred, 2))
    traj[..., 0] = obs[:, None, None, -1, 0] + vx[:, :, None] * steps
    traj[..., 1] = obs[:, None, None, -1, 1] + vy[:, :, None] * steps
    return traj


def ade_fde(pred: np.ndarray, fut: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-window average and final displacement errors of ``pred [W, H, 2]`` against ``fut``."""
    pred, fut = np.asarray(pred, dtype=np.float64), np.asarray(fut, dtype=np.float64)
    if pred.ndim != 3 or pred.shape != fut.shape or pred.shape[-1] != 2:
        raise ShapeError(f"pred {pred.shape} and fut {fut.shape} must both be [W, H, 2]")
    err = np.linalg.norm(pred - fut, axis=-1)
    return err.mean(axis=-1), err[:, -1]


def min_ade_fde(pred: np.ndarray, fut: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Best-of-K ADE and FDE of ``pred [W, K, H, 2]``, each minimised over K independently."""
    pred, fut = np.asarray(pred, dtype=np.float64), np.asarray(fut, dtype=np.float64)
    if pred.ndim != 4 or fut.ndim != 3 or pred.shape[:1] + pred.shape[2:] != fut.shape:
        raise ShapeError(f"pred {pred.shape} must be [W, K, H, 2] for fut {fut.shape}")
    if pred.shape[1] < 1:
        raise ShapeError("pred holds no hypotheses (K = 0)")
    err = np.linalg.norm(pred - fut[:, None], axis=-1)
    return err.mean(axis=-1).min(axis=1), err[:, :, -1].min(axis=1)


def bootstrap_ci(
    values: np.ndarray,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = CI_LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ShapeError(f"bootstrap needs a non-empty 1-D array, got shape {values.shape}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(resamples, values.size))
    means = values[idx].mean(axis=1)
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return float(lo), float(hi)


def _run_predictor(
    predictor: Predictor, obs: np.ndarray, pred: int, batch_size: int | None
) -> tuple[np.ndarray, np.ndarray]:
    size = obs.shape[0] if batch_size is None else int(batch_size)
    if size < 1:
        raise InputValueError(f"batch_size must be >= 1, got {batch_size!r}")
    trajs, probs = [], []
    for start in range(0, obs.shape[0], size):
        chunk = obs[start : start + size]
        traj, prob = predictor(chunk)
        traj, prob = np.asarray(traj, dtype=np.float64), np.asarray(prob, dtype=np.float64)
        num = chunk.shape[0]
        if traj.ndim != 4 or traj.shape[0] != num or traj.shape[2:] != (pred, 2):
            raise ShapeError(
                f"predictor returned traj {traj.shape}, expected [{num}, K, {pred}, 2]"
            )
        if prob.shape != traj.shape[:2]:
            raise ShapeError(f"predictor returned probs {prob.shape}, expected {traj.shape[:2]}")
        if not (np.isfinite(traj).all() and np.isfinite(prob).all()):
            raise InputValueError("predictor returned non-finite trajectories or probabilities")
        trajs.append(traj)
        probs.append(prob)
    return np.concatenate(trajs), np.concatenate(probs)


def _mean(values: np.ndarray) -> float:
    return round(float(np.mean(values)), METRIC_DECIMALS)


def evaluate_prediction(
    tracks: Tracks,
    predictor: Predictor,
    seed: int = 0,
    obs: int = OBS_STEPS,
    pred: int = PRED_STEPS,
    frame_step: int | None = None,
    batch_size: int | None = None,
) -> dict[str, Any]:
    """Score ``predictor(obs [W, obs, 2]) -> (traj [W, K, pred, 2], probs [W, K])`` on a scene.

    Metrics are in metres, averaged over windows; ``ci95`` is a seeded percentile bootstrap
    over windows. ``batch_size`` splits the windows for predictors with a bounded batch.
    """
    check_seed("seed", seed)
    obs_xy, fut_xy = extract_windows(tracks, obs, pred, frame_step)
    if obs_xy.shape[0] == 0:
        raise DataError(f"the scene holds no window of {obs + pred} consecutive annotated frames")
    traj, probs = _run_predictor(predictor, obs_xy, pred, batch_size)
    min_ade, min_fde = min_ade_fde(traj, fut_xy)
    best = np.argmax(probs, axis=1)
    top1_ade, top1_fde = ade_fde(traj[np.arange(traj.shape[0]), best], fut_xy)
    cv_ade, cv_fde = ade_fde(constant_velocity(obs_xy, pred), fut_xy)
    cv6_ade, cv6_fde = min_ade_fde(cv6(obs_xy, pred), fut_xy)
    ci = {
        "minADE": [round(v, METRIC_DECIMALS) for v in bootstrap_ci(min_ade, seed)],
        "minFDE": [round(v, METRIC_DECIMALS) for v in bootstrap_ci(min_fde, seed)],
    }
    return {
        "minADE": _mean(min_ade),
        "minFDE": _mean(min_fde),
        "top1_ADE": _mean(top1_ade),
        "top1_FDE": _mean(top1_fde),
        "cv_ADE": _mean(cv_ade),
        "cv_FDE": _mean(cv_fde),
        "cv6_minADE": _mean(cv6_ade),
        "cv6_minFDE": _mean(cv6_fde),
        "windows": int(obs_xy.shape[0]),
        "ci95": ci,
    }
