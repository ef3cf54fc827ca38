"""ETH/UCY trajectory prediction protocol: windows, CV and CV-6 baselines, metrics, calibration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dynshape_perception.config import check_seed
from dynshape_perception.errors import DataError, InputValueError, ShapeError
from dynshape_perception.perception.prediction.history import Tracks, detect_frame_step
from dynshape_perception.stats import bootstrap_means, central_interval
from dynshape_perception.tools.eval.breakdown import breakdown, people_in_view, ranking

OBS_STEPS = 8
PRED_STEPS = 12
# Seconds between the protocol's steps (2.5 Hz).
STEP_S = 0.4
BOOTSTRAP_RESAMPLES = 1000
CI_LEVEL = 0.95
METRIC_DECIMALS = 4
# Reliability bins of the top mode's probability: [0, 0.2), [0.2, 0.3), ... [0.9, 1.0].
CALIBRATION_EDGES = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# A baseline error below this (metres) is rounding, not error: no ratio is taken to it.
NO_ERROR_M = 1e-9
# (ratio name, model metric, baseline metric)
RATIOS = (
    ("top1_ADE/cv_ADE", "top1_ADE", "cv_ADE"),
    ("minADE/cv6_minADE", "minADE", "cv6_minADE"),
    ("minFDE/cv6_minFDE", "minFDE", "cv6_minFDE"),
)

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
    obs_xy, fut_xy, _ = extract_owned_windows(tracks, obs, pred, frame_step)
    return obs_xy, fut_xy


def extract_owned_windows(
    tracks: Tracks,
    obs: int = OBS_STEPS,
    pred: int = PRED_STEPS,
    frame_step: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``extract_windows`` plus the pedestrian id of each window ``[W]``."""
    obs_xy, fut_xy, owners, _ = extract_indexed_windows(tracks, obs, pred, frame_step)
    return obs_xy, fut_xy, owners


def extract_indexed_windows(
    tracks: Tracks,
    obs: int = OBS_STEPS,
    pred: int = PRED_STEPS,
    frame_step: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``extract_owned_windows`` plus the frame of each window's last observation ``[W]``."""
    if obs < 2 or pred < 1:
        raise InputValueError(f"need obs >= 2 and pred >= 1, got obs={obs}, pred={pred}")
    checked = {pid: _checked_track(pid, *tracks[pid]) for pid in sorted(tracks)}
    if frame_step is None:
        frame_step = detect_frame_step(checked) if checked else 1
    span = obs + pred
    windows, owners, lasts = [], [], []
    for pid, (frames, xy) in checked.items():
        if frames.shape[0] < span:
            continue
        step_ok = (np.diff(frames) == frame_step).astype(np.int64)
        breaks = np.concatenate([[0], np.cumsum(step_ok)])
        # A window starting at i needs all span - 1 following differences equal to the step.
        starts = np.flatnonzero(breaks[span - 1 :] - breaks[: -(span - 1)] == span - 1)
        if starts.size:
            view = np.lib.stride_tricks.sliding_window_view(xy, span, axis=0)
            windows.append(view[starts].transpose(0, 2, 1))
            owners.append(np.full(starts.size, pid, dtype=np.int64))
            lasts.append(frames[starts + obs - 1])
    if not windows:
        none = np.zeros(0, dtype=np.int64)
        return np.zeros((0, obs, 2)), np.zeros((0, pred, 2)), none, none.copy()
    stacked = np.concatenate(windows, axis=0)
    return (
        stacked[:, :obs].copy(),
        stacked[:, obs:].copy(),
        np.concatenate(owners),
        np.concatenate(lasts),
    )


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
    groups: np.ndarray | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``.

    With ``groups`` (one label per value) whole groups are drawn, not values: the windows
    of one pedestrian overlap, so they are not independent draws.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ShapeError(f"bootstrap needs a non-empty 1-D array, got shape {values.shape}")
    if groups is None:
        means = bootstrap_means(values, resamples, seed)
    else:
        totals, counts = _group_draws([values, np.ones_like(values)], groups, seed, resamples)
        means = totals / counts
    return central_interval(means, level)


def ratio_ci(
    numerator: np.ndarray,
    denominator: np.ndarray,
    groups: np.ndarray,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = CI_LEVEL,
) -> tuple[float, float] | None:
    """Bootstrap interval of ``mean(numerator) / mean(denominator)``, paired, by group.

    None where some resample's denominator is below ``NO_ERROR_M`` (a baseline without
    error): no ratio.
    """
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    if numerator.ndim != 1 or numerator.size == 0 or numerator.shape != denominator.shape:
        raise ShapeError(
            f"a ratio needs two equal non-empty 1-D arrays, got {numerator.shape} and "
            f"{denominator.shape}"
        )
    top, bottom = _group_draws([numerator, denominator], groups, seed, resamples)
    if not (bottom > NO_ERROR_M * denominator.size).all():
        return None
    return central_interval(top / bottom, level)


def _group_draws(
    columns: list[np.ndarray], groups: np.ndarray, seed: int, resamples: int
) -> list[np.ndarray]:
    """Per resample of whole groups, the sum of each column: ``[resamples]`` each."""
    groups = np.asarray(groups)
    if groups.shape != columns[0].shape:
        raise ShapeError(f"groups {groups.shape} must label every value {columns[0].shape}")
    _, label = np.unique(groups, return_inverse=True)
    count = int(label.max()) + 1
    sums = np.stack([np.bincount(label, weights=c, minlength=count) for c in columns], axis=1)
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, count, size=(resamples, count))
    # How often each group is drawn in each resample, [resamples, groups].
    times = np.zeros((resamples, count))
    np.add.at(times, (np.arange(resamples)[:, None], drawn), 1.0)
    totals = times @ sums
    return [totals[:, j] for j in range(len(columns))]


def calibration(probs: np.ndarray, traj: np.ndarray, fut: np.ndarray) -> dict[str, Any]:
    """How well the top mode's probability says how often that mode is the best one.

    The best mode of a window is the one of lowest ADE. Returns the mean top probability,
    the share of windows whose top mode is the best, the expected calibration error (the
    windows' share-weighted gap between the two, bin by bin, over ``CALIBRATION_EDGES``)
    and the reliability table.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape != traj.shape[:2] or probs.shape[0] == 0:
        raise ShapeError(f"probs {probs.shape} must be [W, K] for traj {traj.shape}, W > 0")
    err = np.linalg.norm(np.asarray(traj, np.float64) - fut[:, None], axis=-1).mean(axis=-1)
    top = probs.argmax(axis=1)
    confidence = probs[np.arange(probs.shape[0]), top]
    hit = (top == err.argmin(axis=1)).astype(np.float64)
    edges = np.asarray(CALIBRATION_EDGES)
    which = np.clip(np.searchsorted(edges, confidence, side="right") - 1, 0, edges.size - 2)
    table, gap = [], 0.0
    for b in range(edges.size - 1):
        inside = which == b
        if not inside.any():
            continue
        conf_b, hit_b = float(confidence[inside].mean()), float(hit[inside].mean())
        gap += inside.mean() * abs(conf_b - hit_b)
        table.append(
            {
                "bin": [float(edges[b]), float(edges[b + 1])],
                "windows": int(inside.sum()),
                "confidence": round(conf_b, METRIC_DECIMALS),
                "best_share": round(hit_b, METRIC_DECIMALS),
            }
        )
    return {
        "confidence": _mean(confidence),
        "best_share": _mean(hit),
        "ece": round(float(gap), METRIC_DECIMALS),
        "reliability": table,
    }


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

    Metrics are in metres, averaged over windows. ``ci95`` and ``ratios`` hold seeded
    percentile bootstrap intervals that draw whole pedestrians; ``calibration`` sets the top
    mode's probability against how often it is the best. ``batch_size`` splits the windows
    for predictors with a bounded batch.
    """
    check_seed("seed", seed)
    obs_xy, fut_xy, owners, lasts = extract_indexed_windows(tracks, obs, pred, frame_step)
    if obs_xy.shape[0] == 0:
        raise DataError(f"the scene holds no window of {obs + pred} consecutive annotated frames")
    traj, probs = _run_predictor(predictor, obs_xy, pred, batch_size)
    min_ade, min_fde = min_ade_fde(traj, fut_xy)
    best = np.argmax(probs, axis=1)
    top1_ade, top1_fde = ade_fde(traj[np.arange(traj.shape[0]), best], fut_xy)
    cv_ade, cv_fde = ade_fde(constant_velocity(obs_xy, pred), fut_xy)
    cv6_ade, cv6_fde = min_ade_fde(cv6(obs_xy, pred), fut_xy)
    per_window = {
        "minADE": min_ade,
        "minFDE": min_fde,
        "top1_ADE": top1_ade,
        "top1_FDE": top1_fde,
        "cv_ADE": cv_ade,
        "cv_FDE": cv_fde,
        "cv6_minADE": cv6_ade,
        "cv6_minFDE": cv6_fde,
    }
    result: dict[str, Any] = {key: _mean(values) for key, values in per_window.items()}
    result["windows"] = int(obs_xy.shape[0])
    result["pedestrians"] = int(np.unique(owners).size)
    result["ci95"] = {
        key: _rounded(bootstrap_ci(values, seed, groups=owners))
        for key, values in per_window.items()
    }
    ratios = {}
    for name, model_key, base_key in RATIOS:
        model, base = per_window[model_key], per_window[base_key]
        interval = ratio_ci(model, base, owners, seed)
        ratios[name] = {
            "value": round(float(model.mean() / base.mean()), METRIC_DECIMALS)
            if base.mean() > NO_ERROR_M
            else None,
            "ci95": None if interval is None else _rounded(interval),
        }
    result["ratios"] = ratios
    result["calibration"] = calibration(probs, traj, fut_xy)
    result["ranking"] = ranking(probs, traj, fut_xy, cv_ade)
    speed = np.linalg.norm(obs_xy[:, -1] - obs_xy[:, -2], axis=1) / STEP_S
    result["breakdown"] = breakdown(per_window, people_in_view(tracks, lasts), speed)
    return result


def _rounded(interval: tuple[float, float]) -> list[float]:
    return [round(v, METRIC_DECIMALS) for v in interval]
