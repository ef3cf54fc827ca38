"""Prediction scores by density and speed, and the ranking's calibration against outcomes."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.tools.eval.breakdown import breakdown, people_in_view, ranking
from dynshape_perception.tools.eval.prediction import evaluate_prediction


def test_people_in_view_counts_everyone_annotated_in_a_frame() -> None:
    tracks = {
        1: (np.array([0, 10, 20]), np.zeros((3, 2))),
        2: (np.array([10, 20]), np.zeros((2, 2))),
        3: (np.array([20]), np.zeros((1, 2))),
    }
    np.testing.assert_array_equal(people_in_view(tracks, np.array([0, 10, 20, 30])), [1, 2, 3, 0])


def test_breakdown_bins_every_window_once() -> None:
    rng = np.random.default_rng(0)
    n = 200
    per_window = {
        key: rng.uniform(0.1, 1.0, n)
        for key in ("top1_ADE", "cv_ADE", "minADE", "cv6_minADE", "minFDE", "cv6_minFDE")
    }
    people = rng.integers(1, 60, n)
    speed = rng.uniform(0.0, 2.0, n)
    out = breakdown(per_window, people, speed)
    for key in ("by_people_in_view", "by_speed_mps"):
        assert sum(row["windows"] for row in out[key]) == n
    first = out["by_people_in_view"][0]
    inside = people < 6
    expected = per_window["top1_ADE"][inside].mean() / per_window["cv_ADE"][inside].mean()
    assert first["bin"] == "1-5" and first["top1_ADE/cv_ADE"] == pytest.approx(expected, abs=1e-4)
    assert [row["bin"] for row in out["by_speed_mps"]][-1] == ">=1.3 m/s"


def test_ranking_sets_the_stated_odds_against_how_often_the_top_learned_mode_clearly_wins() -> None:
    n, h = 100, 12
    fut = np.zeros((n, h, 2))
    traj = np.zeros((n, 3, h, 2))
    traj[:, 0, :, 0] = 1.0  # constant velocity: 1 m off
    # The top learned mode is 0.5 m off in the first 60 windows, 2 m off in the other 40;
    # it is mode 1 in even windows and mode 2 in odd ones, the other learned mode 3 m off.
    even = np.arange(n) % 2 == 0
    top_off = np.where(np.arange(n) < 60, 0.5, 2.0)
    traj[:, 1, :, 0] = np.where(even, top_off, 3.0)[:, None]
    traj[:, 2, :, 0] = np.where(even, 3.0, top_off)[:, None]
    probs = np.zeros((n, 3))
    probs[:, 1] = np.where(even, 0.6, 0.1)  # the top learned mode first everywhere,
    probs[:, 2] = np.where(even, 0.1, 0.6)  # stated 0.6 / 0.9
    probs[:, 0] = 0.3
    cv_ade = np.ones(n)
    out = ranking(probs, traj, fut, cv_ade)
    assert out is not None
    assert out["top_is_cv_share"] == 0.0 and out["opened_windows"] == n
    assert out["opened_stated"] == pytest.approx(2 / 3, abs=1e-4)
    assert out["opened_clear_gain_share"] == pytest.approx(0.6)
    assert out["top1_beats_cv_share"] == pytest.approx(0.6)
    assert out["ece"] == pytest.approx(abs(2 / 3 - 0.6), abs=1e-3)
    # Constant velocity first: nothing opened, and top-1 never beats itself.
    probs[:, 0] = 0.6
    probs[:, 1:] = np.where(even[:, None], [0.3, 0.1], [0.1, 0.3])
    closed = ranking(probs, traj, fut, cv_ade)
    assert closed is not None and closed["top_is_cv_share"] == 1.0
    assert closed["opened_stated"] is None and closed["top1_beats_cv_share"] == 0.0
    assert ranking(probs[:, :1], traj[:, :1], fut, cv_ade) is None


def test_a_report_carries_the_breakdown_and_the_ranking() -> None:
    frames = np.arange(0, 250, 10)
    xy = np.c_[0.4 * np.arange(25), np.zeros(25)]
    tracks = {1: (frames, xy), 2: (frames, xy + np.array([0.0, 3.0]))}

    def predictor(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        step = obs[:, -1] - obs[:, -2]
        line = obs[:, -1, None] + step[:, None] * np.arange(1, 13)[None, :, None]
        return np.stack([line, line + 0.1], axis=1), np.tile([0.7, 0.3], (obs.shape[0], 1))

    report = evaluate_prediction(tracks, predictor)
    assert report["ranking"]["top_is_cv_share"] == 1.0
    (density,) = report["breakdown"]["by_people_in_view"]
    assert density["bin"] == "1-5" and density["windows"] == report["windows"]
    (speed,) = report["breakdown"]["by_speed_mps"]
    assert speed["bin"] == "0.8-1.3 m/s" and speed["top1_ADE/cv_ADE"] is None
