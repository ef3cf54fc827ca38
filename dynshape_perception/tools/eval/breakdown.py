"""Prediction scores by crowd density and agent speed, and the calibration of the ranking."""

from __future__ import annotations

from typing import Any

import numpy as np

from dynshape_perception.perception.prediction.history import Tracks

# People annotated in the window's last observed frame: bins' lower edges.
DENSITY_EDGES = (1, 6, 16, 41)
# The agent's speed over its last observed step, metres per second: bins' lower edges.
SPEED_EDGES_MPS = (0.0, 0.3, 0.8, 1.3)
# Bins of the gate's stated probability that the top learned mode clearly beats CV.
GATE_EDGES = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
# A clear gain: the top learned mode's ADE at least this share below constant velocity's. The
# fit's gate learns the same event (``PredictorFitConfig.gate_margin``).
GATE_MARGIN = 0.05
DECIMALS = 4


def people_in_view(tracks: Tracks, frames: np.ndarray) -> np.ndarray:
    """How many pedestrians are annotated in each of ``frames``."""
    every = np.concatenate([np.asarray(f, np.int64) for f, _ in tracks.values()])
    seen, counts = np.unique(every, return_counts=True)
    where = np.clip(np.searchsorted(seen, frames), 0, max(seen.size - 1, 0))
    return np.where(seen[where] == frames, counts[where], 0)


def _label(edges: tuple[float, ...], index: int, unit: str) -> str:
    lo = edges[index]
    if index + 1 < len(edges):
        hi = edges[index + 1]
        return f"{lo:g}-{hi - 1:g}{unit}" if unit == "" else f"{lo:g}-{hi:g}{unit}"
    return f">={lo:g}{unit}"


def _bins(values: np.ndarray, edges: tuple[float, ...]) -> np.ndarray:
    return np.clip(np.searchsorted(np.asarray(edges), values, side="right") - 1, 0, len(edges) - 1)


def breakdown(
    per_window: dict[str, np.ndarray], people: np.ndarray, speed_mps: np.ndarray
) -> dict[str, list[dict[str, Any]]]:
    """Per density bin and per speed bin: windows, and the model / baseline ratios."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key, values, edges, unit in (
        ("by_people_in_view", people, DENSITY_EDGES, ""),
        ("by_speed_mps", speed_mps, SPEED_EDGES_MPS, " m/s"),
    ):
        which = _bins(values, edges)
        rows = []
        for b in range(len(edges)):
            inside = which == b
            if not inside.any():
                continue
            rows.append(
                {
                    "bin": _label(edges, b, unit),
                    "windows": int(inside.sum()),
                    "top1_ADE/cv_ADE": _ratio(per_window["top1_ADE"], per_window["cv_ADE"], inside),
                    "minADE/cv6_minADE": _ratio(
                        per_window["minADE"], per_window["cv6_minADE"], inside
                    ),
                    "minFDE/cv6_minFDE": _ratio(
                        per_window["minFDE"], per_window["cv6_minFDE"], inside
                    ),
                }
            )
        out[key] = rows
    return out


def _ratio(model: np.ndarray, base: np.ndarray, inside: np.ndarray) -> float | None:
    bottom = float(base[inside].mean())
    return None if bottom <= 1e-9 else round(float(model[inside].mean()) / bottom, DECIMALS)


def ranking(
    probs: np.ndarray, traj: np.ndarray, fut: np.ndarray, cv_ade: np.ndarray
) -> dict[str, Any] | None:
    """How often the top-ranked hypothesis beats constant velocity, against its stated odds.

    The package's predictor states, in ``p_j / (p0 + p_j)``, the probability that its top
    learned mode j (the likeliest of modes 1..) clearly beats constant velocity (mode 0); it
    ranks mode j first where that passes one half. None for predictors with fewer than two
    hypotheses.
    """
    if probs.shape[1] < 2 or probs.shape[0] == 0:
        return None
    rows = np.arange(probs.shape[0])
    learned = 1 + probs[:, 1:].argmax(axis=1)
    pair = probs[:, 0] + probs[rows, learned]
    stated = np.where(pair > 0, probs[rows, learned] / np.maximum(pair, 1e-12), 0.0)
    ade_j = np.linalg.norm(traj[rows, learned] - fut, axis=-1).mean(axis=-1)
    clear = ade_j < (1.0 - GATE_MARGIN) * cv_ade
    beats = ade_j < cv_ade
    top = probs.argmax(axis=1)
    top_ade = np.linalg.norm(traj[np.arange(top.size), top] - fut, axis=-1).mean(axis=-1)
    opened = top != 0
    table: list[dict[str, Any]] = []
    which = _bins(stated, GATE_EDGES[:-1])
    for b in range(len(GATE_EDGES) - 1):
        inside = which == b
        if inside.any():
            table.append(
                {
                    "bin": [GATE_EDGES[b], GATE_EDGES[b + 1]],
                    "windows": int(inside.sum()),
                    "stated": round(float(stated[inside].mean()), DECIMALS),
                    "clear_gain_share": round(float(clear[inside].mean()), DECIMALS),
                    "beats_cv_share": round(float(beats[inside].mean()), DECIMALS),
                }
            )
    gap = sum(r["windows"] * abs(r["stated"] - r["clear_gain_share"]) for r in table)
    return {
        "top_is_cv_share": round(float((~opened).mean()), DECIMALS),
        "opened_windows": int(opened.sum()),
        "opened_stated": _share(stated, opened),
        "opened_clear_gain_share": _share(clear.astype(float), opened),
        "opened_beats_cv_share": _share(beats.astype(float), opened),
        "top1_beats_cv_share": round(float((top_ade < cv_ade).mean()), DECIMALS),
        "ece": round(gap / probs.shape[0], DECIMALS),
        "reliability": table,
    }


def _share(values: np.ndarray, mask: np.ndarray) -> float | None:
    return round(float(values[mask].mean()), DECIMALS) if mask.any() else None
